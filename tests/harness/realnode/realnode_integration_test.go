//go:build integration

package realnode_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/realnode"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

func TestMain(m *testing.M) { cluster.Main(m) }

// servePod is a FROM-scratch podprog pod on node that answers TCP on 8080.
func servePod(ns, name, node string, img realnode.Image, reply string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			NodeName: node,
			Containers: []corev1.Container{{
				Name:            "app",
				Image:           img.Ref,
				ImagePullPolicy: corev1.PullNever,
				Args:            []string{"serve", "--listen", ":8080", "--reply", reply},
			}},
			TerminationGracePeriodSeconds: new(int64),
		},
	}
}

// waitRunning waits until the pod runs with an address and returns it.
func waitRunning(t *testing.T, c *cluster.Cluster, ns, name string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	poll.Eventually(t, 3*time.Minute, "pod "+name+" running with an IP", func() (bool, error) {
		p, err := c.Client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		pod = p
		return p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "", fmt.Errorf("phase %s, IP %q, %v", p.Status.Phase, p.Status.PodIP, p.Status.ContainerStatuses)
	})
	return pod
}

// A real node joins and becomes Ready; a FROM-scratch pod runs with an
// address from the node's conflist, answers the host, and its log is read
// through the apiserver (kubelet reached by its InternalIP). After Stop,
// nothing of the node is left on the machine.
func TestNodeRunsAPod(t *testing.T) {
	c := cluster.Shared(t)
	r := testnet.Reserve(t)
	img := realnode.ProgramImage(t, "podprog")
	n := realnode.StartForTest(t, c, r, realnode.Options{Images: []string{img.Archive}})
	ctx := context.Background()

	node, err := c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	info := node.Status.NodeInfo
	t.Logf("node %s: kubelet %s, runtime %s, ready %.2fs after kubelet start", n.Name, info.KubeletVersion, info.ContainerRuntimeVersion, n.ReadyAfter().Seconds())
	if info.KubeletVersion != "v1.37.2" || info.ContainerRuntimeVersion != "containerd://2.4.2" {
		t.Errorf("nodeInfo kubelet %q runtime %q, want v1.37.2 and containerd://2.4.2", info.KubeletVersion, info.ContainerRuntimeVersion)
	}
	if got := internalIP(node); got != n.IP.String() {
		t.Errorf("InternalIP %q, want the node IP %s", got, n.IP)
	}

	ns := c.Namespace(t)
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, servePod(ns, "web", n.Name, img, "hello from "+n.Name), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := waitRunning(t, c, ns, "web")
	ip, err := netip.ParseAddr(pod.Status.PodIP)
	if err != nil || !n.Subnet.Contains(ip) {
		t.Fatalf("pod IP %q is not in the node's conflist range %s", pod.Status.PodIP, n.Subnet)
	}
	var got string
	poll.Eventually(t, time.Minute, "the pod answers the host", func() error {
		got, err = dialRead(netip.AddrPortFrom(ip, 8080).String())
		return err
	})
	if want := "hello from " + n.Name; got != want {
		t.Errorf("pod answered %q, want %q", got, want)
	}
	poll.Eventually(t, time.Minute, "the pod's log through the apiserver", func() (bool, error) {
		b, err := c.Client.CoreV1().Pods(ns).GetLogs("web", &corev1.PodLogOptions{Container: "app"}).DoRaw(ctx)
		if err != nil {
			return false, err
		}
		return strings.Contains(string(b), "serve: listening on"), fmt.Errorf("log %q", b)
	})

	dir, cg := n.Dir, filepath.Base(n.Dir)
	n.Stop()
	assertGone(t, dir, cg, n.IP, ip)
}

// dialRead connects to addr and returns the line the peer writes.
func dialRead(addr string) (string, error) {
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, 256)
	k, err := conn.Read(b)
	return strings.TrimSpace(string(b[:k])), err
}

func internalIP(node *corev1.Node) string {
	for _, a := range node.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address
		}
	}
	return ""
}

// assertGone checks that nothing of a stopped node is left: no process
// naming its directory, no mount below it, the directory, its cgroups in
// every hierarchy, its node IP on lo, the route to its pod, and no netns
// or container log link of it.
func assertGone(t *testing.T, dir, cgroup string, nodeIP, podIP netip.Addr) {
	t.Helper()
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), dir) && e.Name() != fmt.Sprint(os.Getpid()) {
			t.Errorf("process %s left: %q", e.Name(), strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mi), dir) {
		t.Errorf("mounts left below %s:\n%s", dir, grepLines(string(mi), dir))
	}
	if _, err := os.Stat(dir); err == nil {
		t.Errorf("node directory %s left", dir)
	}
	cgs, _ := filepath.Glob("/sys/fs/cgroup/*/" + cgroup)
	if len(cgs) > 0 {
		t.Errorf("cgroups left: %v", cgs)
	}
	out, _ := exec.Command("ip", "-o", "addr", "show", "dev", "lo").Output()
	if strings.Contains(string(out), " "+nodeIP.String()+"/") {
		t.Errorf("node IP %s left on lo", nodeIP)
	}
	out, _ = exec.Command("ip", "route", "show", podIP.String()).Output()
	if strings.TrimSpace(string(out)) != "" {
		t.Errorf("route to the pod left: %s", out)
	}
	socks, _ := os.ReadDir("/run/containerd/s")
	for _, s := range socks {
		if c, err := net.Dial("unix", filepath.Join("/run/containerd/s", s.Name())); err == nil {
			c.Close()
		} else {
			t.Errorf("dead shim socket left: %s (%v)", s.Name(), err)
		}
	}
	links, _ := os.ReadDir("/var/log/containers")
	for _, l := range links {
		if target, _ := os.Readlink(filepath.Join("/var/log/containers", l.Name())); strings.HasPrefix(target, dir) {
			t.Errorf("container log link left: %s -> %s", l.Name(), target)
		}
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
