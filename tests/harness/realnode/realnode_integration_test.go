//go:build integration

package realnode_test

import (
	"bufio"
	"context"
	"encoding/json"
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
	if nodeIP.IsValid() && strings.Contains(string(out), " "+nodeIP.String()+"/") {
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

// Restart is a reboot: the pod's sandbox is lost and kubelet makes a new
// one with the conflist the hook wrote while both daemons were down (here a
// narrower address range, so the new sandbox shows which conflist it got).
func TestRestartLosesSandboxes(t *testing.T) {
	c := cluster.Shared(t)
	r := testnet.Reserve(t)
	img := realnode.ProgramImage(t, "podprog")
	n := realnode.StartForTest(t, c, r, realnode.Options{Images: []string{img.Archive}})
	ns := c.Namespace(t)
	ctx := context.Background()
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, servePod(ns, "web", n.Name, img, "up"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	before := waitRunning(t, c, ns, "web")
	first, last := testnet.Host(n.Subnet, 200), testnet.Host(n.Subnet, 250)
	narrow := narrowRange(t, n.DefaultConfList(), first, last)
	if err := n.Restart(ctx, func() error { return n.WriteConfList(narrow) }); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := n.WaitReady(wctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("node Ready %.2fs after kubelet restarted", n.ReadyAfter().Seconds())
	var ip netip.Addr
	poll.Eventually(t, 3*time.Minute, "the pod running again in a new sandbox with an address of the new conflist", func() (bool, error) {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		ip, _ = netip.ParseAddr(p.Status.PodIP)
		restarted := len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount > 0 &&
			p.Status.ContainerStatuses[0].State.Running != nil
		inRange := ip.IsValid() && ip.Compare(first) >= 0 && ip.Compare(last) <= 0
		return restarted && inRange, fmt.Errorf("IP %s (before %s), statuses %v", p.Status.PodIP, before.Status.PodIP, p.Status.ContainerStatuses)
	})
	poll.Eventually(t, time.Minute, "the restarted pod answers the host", func() error {
		got, err := dialRead(netip.AddrPortFrom(ip, 8080).String())
		if err == nil && got != "up" {
			return fmt.Errorf("answer %q", got)
		}
		return err
	})
}

// narrowRange sets host-local's range of a ptp conflist to first-last.
func narrowRange(t *testing.T, conf []byte, first, last netip.Addr) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(conf, &m); err != nil {
		t.Fatal(err)
	}
	ipam := m["plugins"].([]any)[0].(map[string]any)["ipam"].(map[string]any)
	r := ipam["ranges"].([]any)[0].([]any)[0].(map[string]any)
	r["rangeStart"], r["rangeEnd"] = first.String(), last.String()
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The figures of the targets (logged, not asserted: the machine is
// shared): node Ready after kubelet starts, and the memory of kubelet,
// containerd and the shims with 10 pods.
func TestNodeFigures(t *testing.T) {
	c := cluster.Shared(t)
	r := testnet.Reserve(t)
	img := realnode.ProgramImage(t, "podprog")
	n := realnode.StartForTest(t, c, r, realnode.Options{Images: []string{img.Archive}})
	ready := n.ReadyAfter()
	ns := c.Namespace(t)
	ctx := context.Background()
	start := time.Now()
	const pods = 10
	for i := 0; i < pods; i++ {
		name := fmt.Sprintf("web-%d", i)
		if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, servePod(ns, name, n.Name, img, name), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < pods; i++ {
		waitRunning(t, c, ns, fmt.Sprintf("web-%d", i))
	}
	running := time.Since(start)
	u, err := n.Usage()
	if err != nil {
		t.Fatal(err)
	}
	if u.ShimCount == 0 || u.PodProcesses < pods {
		t.Errorf("usage counted %d shims and %d pod processes for %d pods", u.ShimCount, u.PodProcesses, pods)
	}
	t.Logf("FIGURES node Ready %.2fs after kubelet start (target <= 5 s); %d pods Running in %.1fs; RSS: %v (target < 600 MiB)",
		ready.Seconds(), pods, running.Seconds(), u)
}

// TestKilledRun: a test process that is killed leaves its node behind
// (shims, containers, mounts, cgroups); SweepStale, which Start runs, removes
// all of it.
func TestKilledRun(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run", "^TestHelperKilledNode$", "-test.v", "-test.timeout", "5m")
	cmd.Env = append(os.Environ(), "CCR_REALNODE_HELPER=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var dir, podIP string
	var log strings.Builder
	s := bufio.NewScanner(out)
	for s.Scan() {
		log.WriteString(s.Text() + "\n")
		if v, ok := strings.CutPrefix(strings.TrimSpace(s.Text()), "KILLME "); ok {
			dir, podIP, _ = strings.Cut(v, " ")
			break
		}
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if dir == "" {
		t.Fatalf("the helper process did not start its node:\n%s", log.String())
	}
	if len(pidsNaming(dir)) == 0 {
		t.Fatalf("nothing of %s survived the kill: the test would prove nothing", dir)
	}
	realnode.SweepStale()
	ip := netip.MustParseAddr(podIP)
	// The node IP stays on lo until the address slot is reserved again
	// (tests/harness/testnet); the rest must be gone now.
	assertGone(t, dir, filepath.Base(dir), netip.Addr{}, ip)
}

// TestHelperKilledNode is TestKilledRun's child: a node with a pod, then
// it waits to be killed.
func TestHelperKilledNode(t *testing.T) {
	if os.Getenv("CCR_REALNODE_HELPER") != "1" {
		t.Skip("run by TestKilledRun")
	}
	c := cluster.Shared(t)
	r := testnet.Reserve(t)
	img := realnode.ProgramImage(t, "podprog")
	n := realnode.StartForTest(t, c, r, realnode.Options{Images: []string{img.Archive}})
	ns := c.Namespace(t)
	if _, err := c.Client.CoreV1().Pods(ns).Create(context.Background(), servePod(ns, "web", n.Name, img, "x"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := waitRunning(t, c, ns, "web")
	fmt.Printf("KILLME %s %s\n", n.Dir, pod.Status.PodIP)
	select {}
}

func pidsNaming(dir string) []string {
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), dir) {
			out = append(out, e.Name())
		}
	}
	return out
}
