//go:build integration

package verify

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/utils/ptr"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/metrics"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/proc"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/realnode"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/registry"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

// slowPullSlack is the controller's --sandbox-slack in the slow-pull runs;
// the registry relay is throttled so that the init image's pull takes
// about twice as long.
const slowPullSlack = 10 * time.Second

// checkInitContainer is the init-container check as docs/examples/init-check
// has it (the downward-API file, the probe, a UID the rules redirect), from
// image with the pull policy given.
func checkInitContainer(image string, policy corev1.PullPolicy) corev1.Container {
	return corev1.Container{Name: annotations.CheckContainerName, Image: image, ImagePullPolicy: policy,
		Args:            []string{"--annotations-file=/consul/podinfo/annotations", "--timeout=2m", "--probe"},
		SecurityContext: &corev1.SecurityContext{RunAsUser: ptr.To(int64(5997))},
		VolumeMounts:    []corev1.VolumeMount{{Name: "consul-podinfo", MountPath: "/consul/podinfo", ReadOnly: true}}}
}

// podinfoVolume is the downward-API volume the check reads.
var podinfoVolume = corev1.Volume{Name: "consul-podinfo", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{
	Items: []corev1.DownwardAPIVolumeFile{{Path: "annotations", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations"}}}}}}

// proxyContainer is the stand-in of the consul-dataplane sidecar: it
// answers "proxy" on the outbound and inbound ports.
func (n *node) proxyContainer() corev1.Container {
	return corev1.Container{Name: "consul-dataplane", Image: n.img.Ref, ImagePullPolicy: corev1.PullNever,
		Args:            []string{"proxy", "--outbound=15001", "--inbound=20000"},
		SecurityContext: &corev1.SecurityContext{RunAsUser: ptr.To(int64(annotations.ProxyUID))}}
}

// injectedReplicaSetWith runs replicas injected pods of a ReplicaSet (as
// injectedReplicaSet) on the node with the containers of spec (without
// any, the stand-in proxy) and the check's downward-API volume.
func (n *node) injectedReplicaSetWith(t *testing.T, ns, name string, replicas int32, spec corev1.PodSpec) {
	t.Helper()
	labels := map[string]string{annotations.KeyInjectStatus: annotations.InjectStatusInjected, "app": name}
	spec.NodeName, spec.TerminationGracePeriodSeconds = n.Name, ptr.To(int64(1))
	spec.Volumes = append(spec.Volumes, podinfoVolume)
	if len(spec.Containers) == 0 {
		spec.Containers = []corev1.Container{n.proxyContainer()}
	}
	_, err := n.c.Client.AppsV1().ReplicaSets(ns).Create(context.Background(), &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To(replicas), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{annotations.KeyInjectStatus: annotations.InjectStatusInjected,
					annotations.KeyTransparentProxyStatus: annotations.TProxyStatusEnabled,
					annotations.KeyRedirectTrafficConfig:  redirectConfig, annotations.KeyDualStack: "false"}},
				Spec: spec,
			}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

// runningPods waits until the ReplicaSet app has want pods Running and
// returns them.
func (n *node) runningPods(t *testing.T, ns, app string, want int, timeout time.Duration) []corev1.Pod {
	t.Helper()
	var got []corev1.Pod
	poll.Eventually(t, timeout, fmt.Sprintf("%d running pods of %s", want, app), func() (bool, error) {
		l, err := n.c.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "app=" + app})
		if err != nil {
			return false, err
		}
		got = got[:0]
		for _, p := range l.Items {
			if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
				got = append(got, p)
			}
		}
		return len(got) == want && len(l.Items) == want, fmt.Errorf("%d pods, %d running", len(l.Items), len(got))
	})
	return got
}

// meshedByTraffic dials, from inside each pod's network namespace (as
// root, whose traffic the rules redirect; netprobe run in the node's mount
// namespace, where the runtime's netns paths are mounted), an address of
// the test's range that nothing serves: only the redirect to the outbound
// port answers, with "proxy". A pod whose proxy does not run (its check
// keeps failing) gets a stand-in listener on that port for the dial.
func (n *node) meshedByTraffic(t *testing.T, pods []corev1.Pod) {
	t.Helper()
	probe := testbin.Package(t, "netprobe", "./tests/cmd/netprobe")
	standIn := testbin.Package(t, "podprog", "./tests/cmd/podprog")
	target := testnet.Host(n.r.Subnet4(13, 24), 7).String() + ":8080"
	for _, p := range pods {
		path := n.netnsOf(t, string(p.UID))
		poll.Eventually(t, 30*time.Second, "pod "+p.Name+" redirects a connection to "+target+" to its outbound port", func() (bool, error) {
			if p.Status.Phase != corev1.PodRunning {
				stop := n.listenIn(path, standIn)
				defer stop()
			}
			out, err := n.Command("nsenter", "--net="+path, "--", probe, "tcp", target).CombinedOutput()
			got := strings.TrimSpace(string(out))
			if err == nil && got == "proxy" {
				return true, nil
			}
			ss, _ := n.Command("nsenter", "--net="+path, "--", "ss", "-ltn").CombinedOutput()
			return false, fmt.Errorf("got %q, %v; listening there:\n%s", got, err, ss)
		})
	}
}

// listenIn runs podprog's listener answering "proxy" on the outbound port
// in the netns at path until stop is called (it exits at once when the
// port is taken).
func (n *node) listenIn(path, podprog string) (stop func()) {
	cmd := n.Command("nsenter", "--net="+path, "--", podprog, "serve", "--listen=127.0.0.1:15001", "--reply=proxy")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return func() {}
	}
	p, err := proc.Start(cmd, "")
	if err != nil {
		return func() {}
	}
	listening := make(chan struct{})
	go func() {
		b := make([]byte, 64)
		_, _ = out.Read(b) // "serve: listening on ...", or EOF when it exited
		close(listening)
	}()
	select {
	case <-listening:
	case <-time.After(5 * time.Second):
	}
	return func() { p.Stop(time.Second) }
}

// noActionFor watches the pods for window and fails at the first sign that
// the controller acted on one (deleted, evicted or relabelled as
// uninitialized, or an Event of an action or a circuit on the node).
func (n *node) noActionFor(t *testing.T, ns string, pods []corev1.Pod, window time.Duration) {
	t.Helper()
	ctx := context.Background()
	end := time.Now().Add(window)
	for {
		for _, p := range pods {
			got, err := n.c.Client.CoreV1().Pods(ns).Get(ctx, p.Name, metav1.GetOptions{})
			switch {
			case err != nil:
				t.Fatalf("pod %s acted on: %v", p.Name, err)
			case got.UID != p.UID || got.DeletionTimestamp != nil:
				t.Fatalf("pod %s acted on: deleted at %v", p.Name, got.DeletionTimestamp)
			case got.Labels[annotations.LabelUninitialized] != "":
				t.Fatalf("pod %s acted on: labelled %s", p.Name, annotations.LabelUninitialized)
			}
		}
		if ev := n.actionEvents(t, ns); len(ev) > 0 {
			t.Fatalf("the controller acted: %s", strings.Join(ev, "; "))
		}
		if time.Now().After(end) {
			return
		}
		time.Sleep(time.Second)
	}
}

// actionEvents lists the controller's Events of an action (or of one it
// would take) in ns and of a circuit opened on the node.
func (n *node) actionEvents(t *testing.T, ns string) []string {
	t.Helper()
	var out []string
	for _, where := range []struct{ ns, sel string }{{ns, ""}, {metav1.NamespaceAll, fields.OneTermEqualSelector("involvedObject.name", n.Name).String()}} {
		evs, err := n.c.Client.CoreV1().Events(where.ns).List(context.Background(), metav1.ListOptions{FieldSelector: where.sel})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs.Items {
			switch e.Reason {
			case "BypassedCNI", "WouldRepair", "EvictionBlocked", "BarePodNotRepaired", "RepairCircuitOpen":
				out = append(out, fmt.Sprintf("%s %s/%s: %s", e.Reason, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Message))
			}
		}
	}
	return out
}

// controllerIdle scrapes the controller's metrics: it exports the breaker's
// gauge (so it runs and judges), no node's breaker is open, and it counted
// no broken pod and no action.
func controllerIdle(t *testing.T, addr string) {
	t.Helper()
	var b string
	poll.Eventually(t, 30*time.Second, "the controller's metrics", func() (bool, error) {
		var err error
		b, err = httpGet("http://" + addr + "/metrics")
		return err == nil && strings.Contains(b, metrics.BreakerOpenNodes+" "), err
	})
	for _, l := range strings.Split(b, "\n") {
		name, _, _ := strings.Cut(l, "{")
		name, _, _ = strings.Cut(name, " ")
		switch name {
		case metrics.BreakerOpenNodes, metrics.BrokenPods, metrics.PodRepairs, metrics.PodRepairFailures, metrics.DryRunPodRepairs:
		default:
			continue
		}
		v, err := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64)
		if err != nil || v != 0 {
			t.Errorf("controller metric %q: want 0", l)
		}
	}
}

// gapAfterADD is how long after the plugin's ADD (cni-applied-at) the
// pod's first init container started, and after it the kubelet dated the
// sandbox (PodReadyToStartContainers).
func gapAfterADD(t *testing.T, p *corev1.Pod) (firstInit, readyToStart time.Duration) {
	t.Helper()
	applied, err := annotations.ParseTime(annotations.KeyCNIAppliedAt, p.Annotations[annotations.KeyCNIAppliedAt])
	if err != nil {
		t.Fatalf("pod %s: %v", p.Name, err)
	}
	if len(p.Status.InitContainerStatuses) == 0 {
		t.Fatalf("pod %s: no init container status", p.Name)
	}
	st := p.Status.InitContainerStatuses[0].State
	var started time.Time
	switch {
	case st.Terminated != nil:
		started = st.Terminated.StartedAt.Time
	case st.Running != nil:
		started = st.Running.StartedAt.Time
	default:
		t.Fatalf("pod %s: its first init container never started", p.Name)
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReadyToStartContainers {
			readyToStart = c.LastTransitionTime.Sub(applied)
		}
	}
	return started.Sub(applied), readyToStart
}

// pullTimes are the kubelet's Pulled Events in ns.
func (n *node) pullTimes(t *testing.T, ns string) []string {
	t.Helper()
	evs, err := n.c.Client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: "reason=Pulled"})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range evs.Items {
		out = append(out, e.InvolvedObject.Name+": "+e.Message)
	}
	return out
}

// slowPull is the slow-pull proof: three injected pods of a ReplicaSet on a
// chained, ready node, whose init-container check image is pulled from a
// registry on loopback through a relay throttled so that the pull takes
// about twice the controller's --sandbox-slack. Every pod's first init
// container must start more than the slack after its ADD (else the run
// proves nothing and fails); the pods are meshed (a real connection from
// each netns reaches its proxy), and over three times the slack after the
// last one runs the controller never acts on any, opens no breaker and
// counts no broken pod. With the verifier, each pod is also verified with
// its rules; without it the node has no verifier's condition, so the
// timing signals alone judge.
func slowPull(t *testing.T, withVerifier bool) {
	n := startNode(t)
	ns := n.c.Namespace(t)
	reg := registry.Start(t)
	var check realnode.Image
	for _, img := range realnode.ProjectImages(t, "verify") {
		if strings.Contains(img.Ref, "/"+annotations.CheckContainerName+":") {
			check = img
		}
	}
	ref, size := reg.Push(t, check.Archive, "consul-cni-repair/consul-cni-check", "slow")
	rate := size * int64(time.Second) / int64(2*slowPullSlack)
	relay := reg.ForwardThrottled(t, n.Netns, rate)
	n.chain(t)
	n.markReady(t)
	if withVerifier {
		n.startVerifier(t)
	}
	addr := n.startController(t, "--sandbox-slack="+slowPullSlack.String(), "--min-pod-age=10s", "--resync-period=10s")

	start := time.Now()
	n.injectedReplicaSetWith(t, ns, "web", 3, corev1.PodSpec{InitContainers: []corev1.Container{checkInitContainer(ref, corev1.PullIfNotPresent)}})
	pods := n.runningPods(t, ns, "web", 3, 3*time.Minute)
	sent, took := relay.Stats()
	t.Logf("the init image (%d bytes of config and layers) through the relay at %d B/s: %d bytes sent in %s; all 3 pods Running %s after their creation",
		size, rate, sent, took.Round(10*time.Millisecond), time.Since(start).Round(10*time.Millisecond))
	for _, l := range n.pullTimes(t, ns) {
		t.Logf("kubelet: %s", l)
	}
	for i := range pods {
		p := &pods[i]
		first, ready := gapAfterADD(t, p)
		t.Logf("pod %s: first init container started %s after cni-applied-at, PodReadyToStartContainers %s after it (slack %s)", p.Name, first, ready, slowPullSlack)
		if first <= slowPullSlack {
			t.Errorf("pod %s: its first init container started %s after the ADD, not more than the slack %s: the run does not show a slow pull", p.Name, first, slowPullSlack)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	n.meshedByTraffic(t, pods)
	if withVerifier {
		for _, p := range pods {
			n.waitCondition(t, ns, p.Name, corev1.ConditionTrue, annotations.ReasonRulesInPlace, time.Minute)
		}
	} else if c := n.nodeCondition(t); c != nil {
		t.Fatalf("node %s has a verifier's condition %s without a verifier", n.Name, c.Type)
	}
	n.noActionFor(t, ns, pods, 3*slowPullSlack)
	controllerIdle(t, addr)
	t.Logf("actions=0 on %d meshed pods over %s after the last was Running (verifier: %v)", len(pods), 3*slowPullSlack, withVerifier)
}

// TestSlowFirstPullsNeverActOnMeshedPodsWithTheVerifier: the slow-pull
// proof with the node verifier reporting for the node.
func TestSlowFirstPullsNeverActOnMeshedPodsWithTheVerifier(t *testing.T) { slowPull(t, true) }

// TestSlowFirstPullsNeverActOnMeshedPodsOnTimingsAlone: the slow-pull proof
// with no verifier: the timing fallback alone judges the pods.
func TestSlowFirstPullsNeverActOnMeshedPodsOnTimingsAlone(t *testing.T) { slowPull(t, false) }
