//go:build integration

package simnode_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/podnet"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/simnode"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

func TestMain(m *testing.M) { cluster.Main(m) }

const timeout = 2 * time.Minute

func waitPod(t *testing.T, cs kubernetes.Interface, ns, name, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	var last *corev1.Pod
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		p, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = p
		return cond(p), nil
	})
	if err != nil {
		b, _ := json.MarshalIndent(last, "", "  ")
		t.Fatalf("pod %s/%s: %s: %v\nlast seen: %s", ns, name, what, err, b)
	}
	return last
}

func waitGone(t *testing.T, cs kubernetes.Interface, ns, name string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		_, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("pod %s/%s was not finalized after deletion", ns, name)
	}
}

func condition(p *corev1.Pod, t corev1.PodConditionType) corev1.ConditionStatus {
	for _, c := range p.Status.Conditions {
		if c.Type == t {
			return c.Status
		}
	}
	return ""
}

func pod(name, node string, init []corev1.Container, ctrs ...corev1.Container) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			InitContainers:                init,
			Containers:                    ctrs,
			TerminationGracePeriodSeconds: ptr.To(int64(5)),
		},
	}
}

func prog(name string, args ...string) corev1.Container {
	return corev1.Container{Name: name, Image: "example.com/tools/podprog:1.0", Args: args}
}

func create(t *testing.T, cs kubernetes.Interface, ns string, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	out, err := cs.CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func netnsExists(name string) bool {
	_, err := os.Stat(filepath.Join("/run/netns", name))
	return err == nil
}

func netnsOfPod(t *testing.T, podIP string) string {
	t.Helper()
	out, _ := exec.Command("ip", "-o", "netns", "list").Output()
	for _, l := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(l), " ")
		if name == "" {
			continue
		}
		addrs, _ := exec.Command("ip", "-n", name, "-o", "-4", "addr", "show", "dev", "eth0").Output()
		if strings.Contains(string(addrs), " "+podIP+"/") {
			return name
		}
	}
	return ""
}

func TestNodeRegistrationLeaseAndLabels(t *testing.T) {
	c := cluster.Shared(t)
	r := testnet.Reserve(t)
	taint := corev1.Taint{Key: "example.com/startup", Value: "x", Effect: corev1.TaintEffectNoSchedule}
	n := simnode.StartForTest(t, c, r, func(cfg *simnode.Config) {
		cfg.Labels = map[string]string{"example.com/pool": "a"}
		cfg.Taints = []corev1.Taint{taint}
		cfg.HeartbeatInterval = time.Second
	})
	ctx := context.Background()
	node, err := c.Client.CoreV1().Nodes().Get(ctx, n.Name(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if node.Labels["example.com/pool"] != "a" || node.Labels["kubernetes.io/hostname"] != n.Name() {
		t.Fatalf("labels %v", node.Labels)
	}
	found := false
	for _, tt := range node.Spec.Taints {
		found = found || (tt.Key == taint.Key && tt.Effect == taint.Effect)
	}
	if !found {
		t.Fatalf("startup taint missing: %v", node.Spec.Taints)
	}
	if node.Spec.PodCIDR == "" || node.Status.NodeInfo.KubeletVersion != simnode.Version {
		t.Fatalf("podCIDR %q kubelet %q", node.Spec.PodCIDR, node.Status.NodeInfo.KubeletVersion)
	}
	l1, err := c.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, n.Name(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		l2, err := c.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, n.Name(), metav1.GetOptions{})
		return err == nil && l2.Spec.RenewTime.After(l1.Spec.RenewTime.Time), nil
	}); err != nil {
		t.Fatal("lease not renewed")
	}
	// Stop deletes the Node.
	n.Stop()
	if _, err := c.Client.CoreV1().Nodes().Get(ctx, n.Name(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("node still there after Stop: %v", err)
	}
}

func TestPodSandboxContainersAndDeletion(t *testing.T) {
	c := cluster.Shared(t)
	r := testnet.Reserve(t)
	n := simnode.StartForTest(t, c, r, nil)
	ns := c.Namespace(t)
	p := pod("web", n.Name(),
		[]corev1.Container{prog("init", "exit", "--code=0", "--message=init done", "--termination-log=/dev/termination-log")},
		prog("proxy", "proxy"),
		corev1.Container{Name: "idle", Image: "registry.example.com/some/app@sha256:0123"},
	)
	create(t, c.Client, ns, p)
	got := waitPod(t, c.Client, ns, "web", "Ready", func(p *corev1.Pod) bool { return condition(p, corev1.PodReady) == corev1.ConditionTrue })
	if got.Status.Phase != corev1.PodRunning {
		t.Fatalf("phase %s", got.Status.Phase)
	}
	for _, ct := range []corev1.PodConditionType{corev1.PodReadyToStartContainers, corev1.PodInitialized, corev1.ContainersReady, corev1.PodScheduled} {
		if condition(got, ct) != corev1.ConditionTrue {
			t.Fatalf("condition %s is %q", ct, condition(got, ct))
		}
	}
	ip, err := netip.ParseAddr(got.Status.PodIP)
	if err != nil {
		t.Fatalf("pod IP %q: %v", got.Status.PodIP, err)
	}
	node, _ := c.Client.CoreV1().Nodes().Get(context.Background(), n.Name(), metav1.GetOptions{})
	if !netip.MustParsePrefix(node.Spec.PodCIDR).Contains(ip) {
		t.Fatalf("pod IP %s outside the node's pod CIDR %s", ip, node.Spec.PodCIDR)
	}
	is := got.Status.InitContainerStatuses[0]
	if is.State.Terminated == nil || is.State.Terminated.ExitCode != 0 || is.State.Terminated.Reason != "Completed" || is.State.Terminated.Message != "init done" {
		t.Fatalf("init container status %+v", is.State)
	}
	for _, cs := range got.Status.ContainerStatuses {
		if cs.State.Running == nil || !cs.Ready || cs.RestartCount != 0 {
			t.Fatalf("container %s: %+v ready=%v", cs.Name, cs.State, cs.Ready)
		}
	}
	nsName := netnsOfPod(t, ip.String())
	if nsName == "" || !strings.HasPrefix(nsName, "ccr-s") {
		t.Fatalf("no slot-named netns holds %s (found %q)", ip, nsName)
	}
	// The proxy container listens inside the pod's namespace: reach it
	// through the ptp route from the host.
	// (Running is not listening yet: retry for a while.)
	var line string
	var derr error
	for i := 0; i < 50 && line == ""; i++ {
		var conn net.Conn
		if conn, derr = net.DialTimeout("tcp", net.JoinHostPort(ip.String(), "15001"), 5*time.Second); derr == nil {
			line, _ = bufio.NewReader(conn).ReadString('\n')
			conn.Close()
		} else {
			time.Sleep(200 * time.Millisecond)
		}
	}
	if strings.TrimSpace(line) != "proxy" {
		t.Fatalf("pod answered %q (%v)", line, derr)
	}
	ipam := filepath.Join(n.Root(), "var", "lib", "cni", "networks", podnet.NetworkName, ip.String())
	if _, err := os.Stat(ipam); err != nil {
		t.Fatalf("host-local allocation: %v", err)
	}

	if err := c.Client.CoreV1().Pods(ns).Delete(context.Background(), "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, c.Client, ns, "web")
	if netnsExists(nsName) {
		t.Fatalf("netns %s left after deletion", nsName)
	}
	if _, err := os.Stat(ipam); !os.IsNotExist(err) {
		t.Fatalf("IP %s still allocated after CNI DEL (%v)", ip, err)
	}
	logs, err := n.LogFiles()
	if err != nil || len(logs) != 3 {
		t.Fatalf("log files %v %v", logs, err)
	}
}

type record struct {
	Command, ContainerID, Netns, IfName, Args, Path string
}

func readRecords(t *testing.T, file string) []record {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []record
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if l == "" {
			continue
		}
		var r record
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

// setChain writes the node's conflist as the primary network followed by
// the recording plugin (failing ADD with failAdd when it is not empty).
func setChain(t *testing.T, n *simnode.Node, recordFile, failAdd string) {
	t.Helper()
	file := filepath.Join(n.ConfDir(), simnode.PrimaryNetworkFile)
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var conf map[string]any
	if err := json.Unmarshal(b, &conf); err != nil {
		t.Fatal(err)
	}
	plugins := conf["plugins"].([]any)[:1]
	conf["plugins"] = append(plugins, map[string]any{"type": "recorder", "record_file": recordFile, "fail_add": failAdd})
	b, _ = json.Marshal(conf)
	if err := os.WriteFile(file+".tmp", b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(file+".tmp", file); err != nil {
		t.Fatal(err)
	}
}

func TestConflistReadAtSandboxCreationAndAddRetry(t *testing.T) {
	c := cluster.Shared(t)
	r := testnet.Reserve(t)
	n := simnode.StartForTest(t, c, r, nil)
	ns := c.Namespace(t)
	if err := podnet.CopyExecutable(testbin.Package(t, "podprog", "./tests/cmd/podprog"), filepath.Join(n.BinDir(), "recorder")); err != nil {
		t.Fatal(err)
	}
	rec := filepath.Join(t.TempDir(), "records")

	// B lands while the chain is the primary network alone.
	create(t, c.Client, ns, pod("b", n.Name(), nil, prog("idle", "idle")))
	waitPod(t, c.Client, ns, "b", "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })

	// A lands after a plugin whose ADD fails was chained: no sandbox, the
	// failure is reported, and the runtime retries.
	setChain(t, n, rec, "simulated failure")
	a := create(t, c.Client, ns, pod("a", n.Name(), nil, prog("idle", "idle")))
	if err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		adds := 0
		for _, r := range readRecords(t, rec) {
			if r.Command == "ADD" {
				adds++
			}
		}
		return adds >= 2, nil
	}); err != nil {
		t.Fatal("failed ADD was not retried")
	}
	got, _ := c.Client.CoreV1().Pods(ns).Get(context.Background(), "a", metav1.GetOptions{})
	if got.Status.Phase != corev1.PodPending || condition(got, corev1.PodReadyToStartContainers) == corev1.ConditionTrue || got.Status.PodIP != "" {
		t.Fatalf("pod with failed sandbox reported phase %s, PodReadyToStartContainers %s, IP %q", got.Status.Phase, condition(got, corev1.PodReadyToStartContainers), got.Status.PodIP)
	}
	evs, _ := c.Client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=a,reason=FailedCreatePodSandBox"})
	if len(evs.Items) == 0 {
		t.Fatal("no FailedCreatePodSandBox event")
	}
	// Every failed ADD was undone: DEL for the same sandbox, then its
	// netns removed.
	recs := readRecords(t, rec)
	for _, r := range recs {
		if r.Command != "ADD" {
			continue
		}
		undone := false
		for _, r2 := range recs {
			undone = undone || (r2.Command == "DEL" && r2.ContainerID == r.ContainerID)
		}
		if !undone {
			continue // the attempt in progress
		}
		if err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			return !netnsExists(filepath.Base(r.Netns)), nil
		}); err != nil {
			t.Fatalf("netns %s of a failed attempt is left", r.Netns)
		}
	}

	setChain(t, n, rec, "")
	got = waitPod(t, c.Client, ns, "a", "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	var last record
	for _, r := range readRecords(t, rec) {
		if r.Command == "ADD" {
			last = r
		}
	}
	want := "IgnoreUnknown=1;K8S_POD_NAMESPACE=" + ns + ";K8S_POD_NAME=a;K8S_POD_INFRA_CONTAINER_ID=" + last.ContainerID + ";K8S_POD_UID=" + string(a.UID)
	if last.Args != want || last.IfName != "eth0" || last.Path != n.BinDir() {
		t.Fatalf("CNI call %+v\nwant args %s", last, want)
	}
	// B's sandbox predates the chained plugin: it was never called for B.
	for _, r := range readRecords(t, rec) {
		if strings.Contains(r.Args, "K8S_POD_NAME=b;") {
			t.Fatalf("plugin called for a sandbox made before it was chained: %+v", r)
		}
	}
	// Teardown uses the node's configuration of the moment, as containerd:
	// B's deletion calls DEL of the plugin chained since.
	if err := c.Client.CoreV1().Pods(ns).Delete(context.Background(), "b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, c.Client, ns, "b")
	del := false
	for _, r := range readRecords(t, rec) {
		del = del || (r.Command == "DEL" && strings.Contains(r.Args, "K8S_POD_NAME=b;"))
	}
	if !del {
		t.Fatal("no DEL for b through the current chain")
	}
	_ = got
}

func TestRestartPolicyExitCodesAndTerminationMessages(t *testing.T) {
	c := cluster.Shared(t)
	r := testnet.Reserve(t)
	n := simnode.StartForTest(t, c, r, nil)
	ns := c.Namespace(t)
	crash := pod("crash", n.Name(), nil, prog("app", "exit", "--code=3", "--message=boom", "--termination-log=/dev/termination-log"))
	create(t, c.Client, ns, crash)
	never := pod("never", n.Name(), nil, prog("app", "exit", "--code=5", "--delay=1s"))
	never.Spec.RestartPolicy = corev1.RestartPolicyNever
	create(t, c.Client, ns, never)
	ok := pod("ok", n.Name(), nil, prog("app", "exit", "--code=0"))
	ok.Spec.RestartPolicy = corev1.RestartPolicyOnFailure
	create(t, c.Client, ns, ok)
	initFail := pod("init-fail", n.Name(),
		[]corev1.Container{prog("consul-cni-check", "exit", "--code=88", "--message=not redirected", "--termination-log=/dev/termination-log")},
		prog("app", "idle"))
	create(t, c.Client, ns, initFail)
	fallback := pod("fallback", n.Name(), nil, prog("app", "exit", "--code=2", "--message=from logs"))
	fallback.Spec.RestartPolicy = corev1.RestartPolicyNever
	fallback.Spec.Containers[0].TerminationMessagePolicy = corev1.TerminationMessageFallbackToLogsOnError
	create(t, c.Client, ns, fallback)

	got := waitPod(t, c.Client, ns, "crash", "restarted twice", func(p *corev1.Pod) bool {
		return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount >= 2
	})
	st := got.Status.ContainerStatuses[0]
	if lt := st.LastTerminationState.Terminated; lt == nil || lt.ExitCode != 3 || lt.Message != "boom" || lt.Reason != "Error" {
		t.Fatalf("lastState %+v", st.LastTerminationState)
	}
	if got.Status.Phase != corev1.PodRunning {
		t.Fatalf("crash-looping pod with restartPolicy Always: phase %s", got.Status.Phase)
	}
	waitPod(t, c.Client, ns, "crash", "CrashLoopBackOff shown", func(p *corev1.Pod) bool {
		w := p.Status.ContainerStatuses[0].State.Waiting
		return w != nil && w.Reason == "CrashLoopBackOff"
	})

	got = waitPod(t, c.Client, ns, "never", "Failed", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
	if tt := got.Status.ContainerStatuses[0].State.Terminated; tt == nil || tt.ExitCode != 5 || got.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Fatalf("never: %+v", got.Status.ContainerStatuses[0])
	}
	if condition(got, corev1.PodReady) != corev1.ConditionFalse || condition(got, corev1.PodReadyToStartContainers) != corev1.ConditionFalse {
		t.Fatal("finished pod still ready or holding its sandbox")
	}
	waitPod(t, c.Client, ns, "ok", "Succeeded", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodSucceeded })

	got = waitPod(t, c.Client, ns, "fallback", "Failed", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
	if tt := got.Status.ContainerStatuses[0].State.Terminated; tt == nil || !strings.Contains(tt.Message, "from logs") {
		t.Fatalf("FallbackToLogsOnError message: %+v", got.Status.ContainerStatuses[0].State)
	}

	got = waitPod(t, c.Client, ns, "init-fail", "init restarted", func(p *corev1.Pod) bool {
		return len(p.Status.InitContainerStatuses) == 1 && p.Status.InitContainerStatuses[0].RestartCount >= 1
	})
	is := got.Status.InitContainerStatuses[0]
	var term *corev1.ContainerStateTerminated
	if is.State.Terminated != nil {
		term = is.State.Terminated
	} else {
		term = is.LastTerminationState.Terminated
	}
	if term == nil || term.ExitCode != 88 || term.Message != "not redirected" {
		t.Fatalf("init status %+v", is)
	}
	if got.Status.Phase != corev1.PodPending || condition(got, corev1.PodInitialized) != corev1.ConditionFalse {
		t.Fatalf("pod with failing init: phase %s Initialized %s", got.Status.Phase, condition(got, corev1.PodInitialized))
	}
	if w := got.Status.ContainerStatuses[0].State.Waiting; w == nil || w.Reason != "PodInitializing" {
		t.Fatalf("app container of a pod initializing: %+v", got.Status.ContainerStatuses[0].State)
	}
}

func TestVolumesKubeconfigRunAsUserAndProbes(t *testing.T) {
	c := cluster.Shared(t)
	r := testnet.Reserve(t)
	n := simnode.StartForTest(t, c, r, nil)
	ns := c.Namespace(t)
	ctx := context.Background()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "reader"}}
	if _, err := c.Client.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := pod("vol", n.Name(),
		[]corev1.Container{{
			Name: "report", Image: "podprog", Command: []string{"/usr/local/bin/podprog"},
			Args:         []string{"report", "--out=/results/report.json", "--file", "/podinfo/annotations", "--file", "/var/run/secrets/kubernetes.io/serviceaccount/namespace"},
			VolumeMounts: []corev1.VolumeMount{{Name: "results", MountPath: "/results"}, {Name: "podinfo", MountPath: "/podinfo"}},
		}},
		corev1.Container{
			Name: "app", Image: "podprog", Args: []string{"idle"},
			VolumeMounts:   []corev1.VolumeMount{{Name: "ready", MountPath: "/ready"}},
			ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"podprog", "exists", "/ready/ok"}}}, PeriodSeconds: 1},
		},
	)
	p.Annotations = map[string]string{"example.com/a": "1"}
	p.Spec.ServiceAccountName = "reader"
	p.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsUser: ptr.To(int64(1234)), RunAsGroup: ptr.To(int64(1234))}
	p.Spec.Volumes = []corev1.Volume{
		{Name: "results", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/results", Type: ptr.To(corev1.HostPathDirectoryOrCreate)}}},
		{Name: "podinfo", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{
			{Path: "annotations", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations"}}}}}},
		{Name: "ready", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	}
	created := create(t, c.Client, ns, p)
	// The results directory must be writable by uid 1234.
	results := filepath.Join(n.Root(), "var", "lib", "results")
	if err := os.MkdirAll(results, 0o777); err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(results, 0o777)

	got := waitPod(t, c.Client, ns, "vol", "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	b, err := os.ReadFile(filepath.Join(results, "report.json"))
	if err != nil {
		t.Fatalf("report not written through the rebased hostPath: %v", err)
	}
	var rep struct {
		UID, GID   int
		Kubeconfig string
		User       string
		UserError  string
		Files      map[string]string
		Addrs      []string
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.UID != 1234 || rep.GID != 1234 {
		t.Fatalf("ran as %d:%d, want 1234:1234", rep.UID, rep.GID)
	}
	if want := "system:serviceaccount:" + ns + ":reader"; rep.User != want {
		t.Fatalf("KUBECONFIG %s authenticates as %q (%s), want %q", rep.Kubeconfig, rep.User, rep.UserError, want)
	}
	var ann, nsFile string
	for k, v := range rep.Files {
		switch {
		case strings.HasSuffix(k, "/annotations"):
			ann = v
		case strings.HasSuffix(k, "/namespace"):
			nsFile = v
		}
	}
	if !strings.Contains(ann, `example.com/a="1"`) {
		t.Fatalf("downward API annotations file: %q (files %v)", ann, rep.Files)
	}
	if nsFile != ns {
		t.Fatalf("projected service-account volume namespace file: %q", nsFile)
	}
	if !strings.Contains(strings.Join(rep.Addrs, " "), got.Status.PodIP+"/") {
		t.Fatalf("container not in the pod's network namespace: %v (pod IP %s)", rep.Addrs, got.Status.PodIP)
	}
	// Readiness follows the exec probe.
	if condition(got, corev1.PodReady) == corev1.ConditionTrue {
		t.Fatal("ready before the probe passes")
	}
	okFile := filepath.Join(n.Root(), "var", "lib", "kubelet", "pods", string(created.UID), "volumes", "ready", "ok")
	if err := os.WriteFile(okFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitPod(t, c.Client, ns, "vol", "Ready", func(p *corev1.Pod) bool { return condition(p, corev1.PodReady) == corev1.ConditionTrue })
	os.Remove(okFile)
	waitPod(t, c.Client, ns, "vol", "not Ready", func(p *corev1.Pod) bool { return condition(p, corev1.PodReady) == corev1.ConditionFalse })

	// Downward API files follow annotation changes.
	patch := []byte(`{"metadata":{"annotations":{"example.com/a":"2"}}}`)
	if _, err := c.Client.CoreV1().Pods(ns).Patch(ctx, "vol", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	annFile := filepath.Join(n.Root(), "var", "lib", "kubelet", "pods", string(created.UID), "volumes", "podinfo", "annotations")
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		b, _ := os.ReadFile(annFile)
		return strings.Contains(string(b), `example.com/a="2"`), nil
	}); err != nil {
		t.Fatal("downward API file not refreshed")
	}
}

func conditionTime(p *corev1.Pod, t corev1.PodConditionType) time.Time {
	for _, c := range p.Status.Conditions {
		if c.Type == t {
			return c.LastTransitionTime.Time
		}
	}
	return time.Time{}
}

// RecreateSandbox: the pod's containers stop, its sandbox (netns) goes and
// a new one is made; the init containers run again, then the others; the
// PodReadyToStartContainers condition dates the new sandbox.
func TestRecreateSandbox(t *testing.T) {
	c := cluster.Shared(t)
	r := testnet.Reserve(t)
	n := simnode.StartForTest(t, c, r, nil)
	ns := c.Namespace(t)
	create(t, c.Client, ns, pod("web", n.Name(), []corev1.Container{prog("init", "exit", "--code=0")}, prog("proxy", "proxy")))
	first := waitPod(t, c.Client, ns, "web", "Ready", func(p *corev1.Pod) bool { return condition(p, corev1.PodReady) == corev1.ConditionTrue })
	oldNetns := netnsOfPod(t, first.Status.PodIP)
	if oldNetns == "" {
		t.Fatalf("no netns holds %s", first.Status.PodIP)
	}
	sandbox1 := conditionTime(first, corev1.PodReadyToStartContainers)
	// Condition times have second precision: let one pass so the new
	// sandbox's time is later.
	time.Sleep(1100 * time.Millisecond)
	if err := n.RecreateSandbox(first.UID); err != nil {
		t.Fatal(err)
	}
	if err := n.RecreateSandbox("no-such-uid"); err == nil {
		t.Fatal("RecreateSandbox of an unknown pod succeeded")
	}
	got := waitPod(t, c.Client, ns, "web", "Ready in a new sandbox", func(p *corev1.Pod) bool {
		return condition(p, corev1.PodReady) == corev1.ConditionTrue && conditionTime(p, corev1.PodReadyToStartContainers).After(sandbox1)
	})
	if netnsExists(oldNetns) {
		t.Fatalf("the old sandbox's netns %s is still there", oldNetns)
	}
	if netnsOfPod(t, got.Status.PodIP) == "" {
		t.Fatalf("no netns holds the new IP %s", got.Status.PodIP)
	}
	is := got.Status.InitContainerStatuses[0]
	if is.State.Terminated == nil || is.State.Terminated.ExitCode != 0 || !is.State.Terminated.StartedAt.After(sandbox1) {
		t.Fatalf("init container did not run again: %+v", is.State)
	}
	cs := got.Status.ContainerStatuses[0]
	if cs.State.Running == nil || cs.RestartCount != 1 {
		t.Fatalf("proxy container: %+v restarts %d", cs.State, cs.RestartCount)
	}
}

// The apiserver reaches simulated nodes by the InternalIP they report (its
// --kubelet-preferred-address-types names nothing else, so no node name is
// ever resolved) and `kubectl logs` works: container output, of init
// containers and of the previous instance too, comes back through the
// apiserver from the node's kubelet endpoint on its loopback address.
func TestLogsThroughAPIServerByInternalIP(t *testing.T) {
	c := cluster.Shared(t)
	r := testnet.Reserve(t)
	n := simnode.StartForTest(t, c, r, nil)
	ns := c.Namespace(t)
	ctx := context.Background()

	if flags := strings.Join(c.APIServerFlags(), " "); !strings.Contains(flags, "--kubelet-preferred-address-types=InternalIP ") {
		t.Fatalf("apiserver flags lack --kubelet-preferred-address-types=InternalIP alone: %s", flags)
	}
	nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, node := range nodes.Items {
		var ip string
		for _, a := range node.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				ip = a.Address
			}
		}
		addr, err := netip.ParseAddr(ip)
		if err != nil {
			t.Fatalf("node %s reports no InternalIP: %v", node.Name, node.Status.Addresses)
		}
		if node.Name == n.Name() && (!r.V4.Contains(addr) || node.Status.DaemonEndpoints.KubeletEndpoint.Port == 0) {
			t.Fatalf("node %s: InternalIP %s outside the test's addresses or no kubelet port (%d)", node.Name, ip, node.Status.DaemonEndpoints.KubeletEndpoint.Port)
		}
	}

	p := pod("talker", n.Name(), []corev1.Container{prog("init", "connect-init")}, prog("app", "proxy"))
	create(t, c.Client, ns, p)
	crash := pod("crash", n.Name(), nil, prog("app", "exit", "--code=3", "--message=run ended", "--termination-log=/dev/termination-log"))
	create(t, c.Client, ns, crash)
	waitPod(t, c.Client, ns, "talker", "Ready", func(p *corev1.Pod) bool { return condition(p, corev1.PodReady) == corev1.ConditionTrue })
	waitPod(t, c.Client, ns, "crash", "restarted", func(p *corev1.Pod) bool {
		return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount >= 1
	})

	logs := func(name string, o *corev1.PodLogOptions) string {
		t.Helper()
		var out string
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
			b, err := c.Client.CoreV1().Pods(ns).GetLogs(name, o).DoRaw(ctx)
			out = string(b)
			if err != nil {
				out = err.Error()
			}
			return err == nil && out != "", nil
		})
		if err != nil {
			t.Fatalf("logs of %s %+v: %s", name, o, out)
		}
		return out
	}
	if got := logs("talker", &corev1.PodLogOptions{Container: "app"}); !strings.HasPrefix(got, "proxy: listening on 15001") {
		t.Fatalf("app logs %q", got)
	}
	if got := logs("talker", &corev1.PodLogOptions{Container: "init"}); got != "connect-init: done\n" {
		t.Fatalf("init logs %q", got)
	}
	if got := logs("crash", &corev1.PodLogOptions{Container: "app", Previous: true}); got != "run ended\n" {
		t.Fatalf("previous logs %q", got)
	}
	one := int64(1)
	if got := logs("talker", &corev1.PodLogOptions{Container: "app", TailLines: &one}); strings.Count(got, "\n") != 1 {
		t.Fatalf("tailLines=1 gave %q", got)
	}
}
