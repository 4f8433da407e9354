//go:build integration

package realnode_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
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
// through the apiserver (kubelet reached by its InternalIP), kubectl logs
// and exec work, in-cluster clients authenticate from the pod network and
// the node's (hostNetwork). After Stop,
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

	kubectlLogsAndExec(t, c, ns, "web")
	inClusterClients(t, c, ns, n.Name, img)

	socks, err := n.ShimSockets(ctx)
	if err != nil || len(socks) == 0 {
		t.Fatalf("shim sockets %v: %v", socks, err)
	}
	dir, netns := n.Dir, n.Netns
	n.Stop()
	assertGone(t, dir, netns, ip, socks)
}

// kubectlLogsAndExec runs kubectl logs and exec on the podprog serve pod
// name, through the apiserver to kubelet at the node IP and on to
// containerd's stream server.
func kubectlLogsAndExec(t *testing.T, c *cluster.Cluster, ns, name string) {
	t.Helper()
	kubectl := kubectlPath(t)
	out, err := exec.Command(kubectl, "--kubeconfig", c.Kubeconfig, "-n", ns, "logs", name).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "serve: listening on") {
		t.Errorf("kubectl logs: %v: %s", err, out)
	}
	out, err = exec.Command(kubectl, "--kubeconfig", c.Kubeconfig, "-n", ns, "exec", name, "--",
		"/usr/local/bin/podprog", "exit", "--code", "3", "--message", "from exec", "--termination-log", "/dev/null").CombinedOutput()
	if code := exitCode(err); code != 3 || !strings.Contains(string(out), "from exec") {
		t.Errorf("kubectl exec: exit %d (%v), output %q; want 3 and the message", code, err, out)
	}
}

// inClusterClients: in-cluster clients reach the apiserver from a pod's
// network and from the node's (hostNetwork), as the project's installer and
// controller do.
func inClusterClients(t *testing.T, c *cluster.Cluster, ns, node string, img realnode.Image) {
	t.Helper()
	ctx := context.Background()
	for _, hostNet := range []bool{false, true} {
		name := fmt.Sprintf("api-hostnet-%v", hostNet)
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: corev1.PodSpec{
				NodeName: node, HostNetwork: hostNet, RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{
					Name: "report", Image: img.Ref, ImagePullPolicy: corev1.PullNever,
					Args: []string{"report", "--out", "/dev/stdout"},
				}},
			},
		}
		if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf(`"user": "system:serviceaccount:%s:default"`, ns)
		poll.Eventually(t, 2*time.Minute, name+" authenticated to the apiserver", func() (bool, error) {
			b, err := c.Client.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
			if err != nil {
				return false, err
			}
			return strings.Contains(string(b), want), fmt.Errorf("log %q", b)
		})
	}
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
// every hierarchy, its network namespace, the route to its pod, dead shim
// sockets, and container log links into its directory.
func assertGone(t *testing.T, dir, netns string, podIP netip.Addr, shimSockets []string) {
	t.Helper()
	for _, l := range realnode.Leftovers(dir) {
		t.Errorf("left: %s", l)
	}
	if _, err := os.Stat(netns); err == nil {
		t.Errorf("network namespace %s left", netns)
	}
	for _, r := range routesTo(podIP) {
		t.Errorf("route to the pod left: %s", r)
	}
	for _, s := range shimSockets {
		if _, err := os.Stat(s); err == nil {
			t.Errorf("shim socket left: %s", s)
		}
	}
	links, _ := os.ReadDir("/var/log/containers")
	for _, l := range links {
		if target, _ := os.Readlink(filepath.Join("/var/log/containers", l.Name())); strings.HasPrefix(target, dir) {
			t.Errorf("container log link left: %s -> %s", l.Name(), target)
		}
	}
}

// routesTo lists the routes towards a (other than the slots' unreachable
// routes and the host's route to a slot's router) in the host and in every
// router namespace of the harness.
func routesTo(a netip.Addr) []string {
	var left []string
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		if !strings.HasSuffix(name, "-router") {
			continue
		}
		rs, _ := exec.Command("ip", "-n", name, "-o", "route", "show", "match", a.String()).Output()
		for _, r := range strings.Split(strings.TrimSpace(string(rs)), "\n") {
			if r != "" && !strings.HasPrefix(r, "unreachable") && !strings.HasPrefix(r, "default") {
				left = append(left, name+": "+r)
			}
		}
	}
	rs, _ := exec.Command("ip", "-o", "route", "show", netip.PrefixFrom(a, 24).Masked().String()).Output()
	if r := strings.TrimSpace(string(rs)); r != "" {
		left = append(left, "host: "+r)
	}
	return left
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

// The node's figures (logged, not asserted: speed and memory are for
// benchmarks): node Ready after kubelet starts, and the memory of kubelet,
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
	var dir, netns, podIP, socks string
	var log strings.Builder
	s := bufio.NewScanner(out)
	for s.Scan() {
		log.WriteString(s.Text() + "\n")
		if v, ok := strings.CutPrefix(strings.TrimSpace(s.Text()), "KILLME "); ok {
			if f := strings.Fields(v); len(f) == 4 {
				dir, netns, podIP, socks = f[0], f[1], f[2], f[3]
			}
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
	assertGone(t, dir, netns, ip, strings.Split(socks, ","))
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
	socks, err := n.ShimSockets(context.Background())
	if err != nil || len(socks) == 0 {
		t.Fatalf("shim sockets %v: %v", socks, err)
	}
	fmt.Printf("KILLME %s %s %s %s\n", n.Dir, n.Netns, pod.Status.PodIP, strings.Join(socks, ","))
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

// A pod's traffic to the test's "external" namespace (the ground truth of
// the race scenarios) leaves through the node's namespace and the slot's
// router and is answered; the answer comes back the same way, with the
// host's forwarding off as on a fresh machine.
func TestPodReachesExternal(t *testing.T) {
	testnet.HostForwardingOff(t)
	c := cluster.Shared(t)
	r := testnet.Reserve(t)
	ext := r.NewExternal(t)
	l, err := ext.Listen("tcp", netip.AddrPortFrom(ext.V4, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			fmt.Fprintln(conn, "external")
			conn.Close()
		}
	}()
	img := realnode.ProgramImage(t, "podprog")
	n := realnode.StartForTest(t, c, r, realnode.Options{Images: []string{img.Archive}})
	ns := c.Namespace(t)
	ctx := context.Background()
	p := servePod(ns, "probe", n.Name, img, "")
	p.Spec.Containers[0].Args = []string{"probe", "--target", l.Addr().String()}
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRunning(t, c, ns, "probe")
	poll.Eventually(t, time.Minute, "the pod reaches the external service", func() (bool, error) {
		b, err := c.Client.CoreV1().Pods(ns).GetLogs("probe", &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			return false, err
		}
		return strings.Contains(string(b), " bypass "), fmt.Errorf("log %q", b)
	})
}

// kubectlPath is kubectl of the control plane's binaries (make kube-bins).
func kubectlPath(t *testing.T) string {
	t.Helper()
	p, err := cluster.Kubectl()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}
