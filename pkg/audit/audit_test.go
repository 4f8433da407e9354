package audit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"sigs.k8s.io/yaml"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
)

var now = time.Now().Truncate(time.Second)

func ago(d time.Duration) metav1.Time { return metav1.NewTime(now.Add(-d)) }

type podOpt func(*corev1.Pod)

// injected returns a running injected transparent-proxy pod owned by a
// ReplicaSet on node n, with status "complete" and a sandbox an hour old.
func injected(name, node string, opts ...podOpt) *corev1.Pod {
	yes := true
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: "app", UID: types.UID("uid-" + name),
			CreationTimestamp: ago(time.Hour),
			Labels:            map[string]string{annotations.KeyInjectStatus: annotations.InjectStatusInjected},
			Annotations: map[string]string{
				annotations.KeyInjectStatus:           annotations.InjectStatusInjected,
				annotations.KeyTransparentProxyStatus: annotations.TProxyStatusComplete,
			},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-5d8f", UID: "rs", Controller: &yes}},
		},
		Spec: corev1.PodSpec{NodeName: node},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.7", Conditions: []corev1.PodCondition{{
			Type: corev1.PodReadyToStartContainers, Status: corev1.ConditionTrue, LastTransitionTime: ago(time.Hour),
		}}},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

// stuck: signal A (status still enabled long after the sandbox).
func stuck(p *corev1.Pod) {
	p.Annotations[annotations.KeyTransparentProxyStatus] = annotations.TProxyStatusEnabled
}

// initFailed: signal B.
func initFailed(p *corev1.Pod) {
	stuck(p)
	p.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: annotations.CheckContainerName, State: corev1.ContainerState{
		Terminated: &corev1.ContainerStateTerminated{ExitCode: annotations.InitCheckExitCode, StartedAt: ago(50 * time.Minute), FinishedAt: ago(50 * time.Minute)},
	}}}
}

// recreated: signal C (the sandbox became ready long after cni-applied-at,
// and replaced one in which the app container ran).
func recreated(p *corev1.Pod) {
	p.Annotations[annotations.KeyCNIAppliedAt] = annotations.FormatTime(now.Add(-2 * time.Hour))
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "app", RestartCount: 1,
		State:                corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: ago(time.Hour)}},
		LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 255, StartedAt: ago(2 * time.Hour), FinishedAt: ago(61 * time.Minute)}},
	}}
}

func bare(p *corev1.Pod)      { p.OwnerReferences = nil }
func succeeded(p *corev1.Pod) { stuck(p); p.Status.Phase = corev1.PodSucceeded }
func terminating(p *corev1.Pod) {
	stuck(p)
	t := ago(time.Second)
	p.DeletionTimestamp = &t
}
func inNamespace(ns string) podOpt { return func(p *corev1.Pod) { p.Namespace = ns } }

// readyNode is labelled CNI-ready since half an hour ago: after the
// sandboxes of injected's pods (the race).
func readyNode(name string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
		Labels:      map[string]string{annotations.LabelCNIReady: annotations.LabelCNIReadyValue},
		Annotations: map[string]string{annotations.AnnotationCNIReadySince: annotations.FormatTime(now.Add(-30 * time.Minute))},
	}}
}

func notReadyNode(name string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
}

func run(t *testing.T, o *Options, objs ...runtime.Object) *Report {
	t.Helper()
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	r, err := Run(context.Background(), fake.NewClientset(objs...), o, now)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func byName(r *Report) map[string]Pod {
	m := map[string]Pod{}
	for _, p := range r.Outside {
		m[p.Name] = p
	}
	return m
}

func TestRunJudgesLikeTheController(t *testing.T) {
	notInjected := injected("plain", "n1", stuck)
	notInjected.Labels = nil
	r := run(t, NewOptions(),
		readyNode("n1"), notReadyNode("n2"),
		injected("ok", "n1"),
		injected("stuck", "n1", stuck),
		injected("initfail", "n1", initFailed),
		injected("recreated", "n1", recreated),
		injected("bare", "n1", stuck, bare),
		injected("done", "n1", succeeded),
		injected("deleting", "n1", terminating),
		injected("waiting", "n2", stuck),
		notInjected,
	)
	got := byName(r)
	want := map[string]struct {
		reason judge.Reason
		action string
	}{
		"stuck":     {judge.ReasonTProxyStatusStuck, "evict"},
		"initfail":  {judge.ReasonInitCheckFailed, "evict"},
		"recreated": {judge.ReasonSandboxRecreated, "evict"},
		"bare":      {judge.ReasonTProxyStatusStuck, "none: bare pod"},
		"waiting":   {judge.ReasonTProxyStatusStuck, "wait: CNI not ready"},
	}
	if len(got) != len(want) {
		t.Errorf("outside the mesh: %v, want the pods %v", got, want)
	}
	for name, w := range want {
		p, ok := got[name]
		if !ok {
			t.Errorf("pod %s not reported", name)
			continue
		}
		if p.Reason != w.reason || !strings.HasPrefix(p.Action, w.action) {
			t.Errorf("pod %s: reason %q action %q, want %q, %q...", name, p.Reason, p.Action, w.reason, w.action)
		}
	}
	if r.Examined != 8 {
		t.Errorf("examined %d pods, want the 8 injected ones", r.Examined)
	}
	// Finished and terminating pods are reported as never judged, with
	// the controller's reason, and are not outside the mesh.
	notJudged := map[string]string{}
	for _, p := range r.NotJudged {
		notJudged[p.Name] = p.Why
	}
	if len(notJudged) != 2 || notJudged["done"] != "pod succeeded" || notJudged["deleting"] != "being deleted" {
		t.Errorf("not judged: %v, want done (pod succeeded) and deleting (being deleted)", notJudged)
	}
	if p := got["initfail"]; p.Owner != "ReplicaSet/web-5d8f" || p.Node != "n1" || !p.Since.Equal(now.Add(-50*time.Minute)) {
		t.Errorf("initfail: %+v", p)
	}
}

func TestRunBreaker(t *testing.T) {
	// Three broken pods created after the node's CNI became ready: a
	// misconfigured node, where the controller does nothing.
	young := func(p *corev1.Pod) { p.Status.Conditions[0].LastTransitionTime = ago(10 * time.Minute) }
	objs := []runtime.Object{readyNode("n1")}
	for _, n := range []string{"a", "b", "c"} {
		objs = append(objs, injected(n, "n1", stuck, young))
	}
	r := run(t, NewOptions(), objs...)
	if len(r.Outside) != 3 {
		t.Fatalf("outside: %+v", r.Outside)
	}
	for _, p := range r.Outside {
		if !strings.HasPrefix(p.Action, "none: circuit breaker open") {
			t.Errorf("pod %s: action %q, want the breaker open", p.Name, p.Action)
		}
	}
	o := NewOptions()
	o.Config.Breaker = false
	for _, p := range run(t, o, objs...).Outside {
		if p.Action != "evict" {
			t.Errorf("without the breaker, pod %s: action %q, want evict", p.Name, p.Action)
		}
	}
}

func TestRunNamespaceAndSelector(t *testing.T) {
	objs := []runtime.Object{readyNode("n1"),
		injected("a", "n1", stuck), injected("b", "n1", stuck, inNamespace("other")),
		injected("c", "n1", stuck, func(p *corev1.Pod) { p.Labels["tier"] = "db" }),
	}
	o := NewOptions()
	o.Namespace = "other"
	if got := byName(run(t, o, objs...)); len(got) != 1 || got["b"].Name != "b" {
		t.Errorf("-n other: %v", got)
	}
	o = NewOptions()
	o.Selector = "tier=db"
	if got := byName(run(t, o, objs...)); len(got) != 1 || got["c"].Name != "c" {
		t.Errorf("--selector tier=db: %v", got)
	}
}

// main runs Main with a fake clientset holding objs.
func main(t *testing.T, args []string, newClient ClientFunc) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := Main(context.Background(), "repair audit", args, &out, &errb, newClient)
	return code, out.String(), errb.String()
}

func clientOf(objs ...runtime.Object) ClientFunc {
	return func(*Options) (kubernetes.Interface, error) { return fake.NewClientset(objs...), nil }
}

func TestExitCodes(t *testing.T) {
	code, out, _ := main(t, nil, clientOf(readyNode("n1"), injected("ok", "n1")))
	if code != ExitNoneOutside || !strings.HasPrefix(out, "NAMESPACE") {
		t.Errorf("none outside: exit %d, output %q", code, out)
	}
	code, out, _ = main(t, []string{"-A"}, clientOf(readyNode("n1"), injected("ok", "n1"), injected("stuck", "n1", stuck)))
	if code != ExitOutside || !strings.Contains(out, "stuck") || !strings.Contains(out, "tproxy_status_stuck") {
		t.Errorf("some outside: exit %d, output %q", code, out)
	}
	failing := func(*Options) (kubernetes.Interface, error) {
		c := fake.NewClientset()
		c.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, errors.New("forbidden")
		})
		return c, nil
	}
	if code, _, stderr := main(t, nil, failing); code != ExitError || !strings.Contains(stderr, "forbidden") {
		t.Errorf("list error: exit %d, stderr %q", code, stderr)
	}
	for _, args := range [][]string{{"-o", "xml"}, {"--min-pod-age=-1s"}, {"-n", "a", "-A"}, {"--nope"}, {"extra"}, {"--chunk-size=0"}, {"--cni-ready-gate=x"}} {
		if code, _, stderr := main(t, args, clientOf()); code != ExitUsage || stderr == "" {
			t.Errorf("%q: exit %d, stderr %q, want %d", args, code, stderr, ExitUsage)
		}
	}
}

func TestOutputFormats(t *testing.T) {
	objs := clientOf(readyNode("n1"), injected("stuck", "n1", stuck))
	for _, format := range []string{"json", "yaml"} {
		code, out, _ := main(t, []string{"-o", format}, objs)
		var r Report
		var err error
		if format == "json" {
			err = json.Unmarshal([]byte(out), &r)
		} else {
			err = yaml.Unmarshal([]byte(out), &r)
		}
		if code != ExitOutside || err != nil || len(r.Outside) != 1 || r.Outside[0].Reason != judge.ReasonTProxyStatusStuck || r.Outside[0].Action != "evict" {
			t.Errorf("-o %s: exit %d, %v, %+v from %q", format, code, err, r, out)
		}
		if r.APIVersion != APIVersion || r.Kind != Kind {
			t.Errorf("-o %s: apiVersion %q kind %q, want %s %s", format, r.APIVersion, r.Kind, APIVersion, Kind)
		}
	}
}

// The kubectl-style formats: name lists pod/NAME of the pods outside the
// mesh, jsonpath runs over the JSON report, wide adds the action's reason
// and the detail, --no-headers drops the header lines and the second
// table; the table's ACTION is one word.
func TestKubectlOutputFormats(t *testing.T) {
	objs := clientOf(readyNode("n1"), notReadyNode("n2"), injected("stuck", "n1", stuck), injected("waiting", "n2", stuck),
		injected("done", "n1", succeeded))
	lines := func(args ...string) []string {
		t.Helper()
		code, out, stderr := main(t, args, objs)
		if code != ExitOutside {
			t.Fatalf("%q: exit %d, stderr %q", args, code, stderr)
		}
		return strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	}
	if got := lines("-o", "name"); strings.Join(got, ",") != "pod/stuck,pod/waiting" {
		t.Errorf("-o name: %q", got)
	}
	if got := lines("-o", `jsonpath={.kind} {.outside[*].name} {.outside[1].action}`); len(got) != 1 ||
		!strings.HasPrefix(got[0], Kind+" stuck waiting wait: CNI not ready") {
		t.Errorf("-o jsonpath: %q", got)
	}
	table := lines()
	if len(table) != 7 || !strings.HasSuffix(strings.TrimSpace(table[0]), "ACTION") ||
		!strings.HasSuffix(strings.TrimSpace(table[2]), "  wait") || !strings.Contains(table[4], "never judges") {
		t.Errorf("table: want the header, 2 pods with one-word actions, the second table:\n%s", strings.Join(table, "\n"))
	}
	if got := lines("--no-headers"); len(got) != 2 || !strings.HasPrefix(got[0], "app ") || !strings.HasSuffix(strings.TrimSpace(got[1]), "wait") {
		t.Errorf("--no-headers: want the 2 rows of the pods outside the mesh only:\n%s", strings.Join(got, "\n"))
	}
	wide := lines("-o", "wide", "--no-headers")
	if len(wide) != 2 || !regexp.MustCompile(`  wait +CNI not ready on the node \(--cni-ready-gate=node-label\) +consul.hashicorp.com/transparent-proxy-status is still`).MatchString(wide[1]) {
		t.Errorf("-o wide: want the action's reason and the detail after it:\n%s", strings.Join(wide, "\n"))
	}
	for _, bad := range []string{"jsonpath={.outside[", "name=x", "custom-columns=A:.a"} {
		if code, _, stderr := main(t, []string{"-o", bad}, objs); code != ExitUsage || !strings.Contains(stderr, "--output") {
			t.Errorf("-o %s: exit %d, stderr %q; want a usage error naming --output", bad, code, stderr)
		}
	}
}

// cniPod is a CNI DaemonSet pod on node, Ready or not.
func cniPod(node string, ready bool) *corev1.Pod {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "cni-" + node, Namespace: judge.DefaultConfig().CNINamespace, Labels: map[string]string{"app.kubernetes.io/name": "consul-cni"}},
		Spec:       corev1.PodSpec{NodeName: node},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{
			Type: corev1.PodReady, Status: st, LastTransitionTime: ago(30 * time.Minute),
		}}},
	}
}

// With --cni-ready-gate=cni-pod the audit lists the CNI pods and the gate
// opens where one is Ready, whatever the node labels say.
func TestRunCNIPodGate(t *testing.T) {
	o := NewOptions()
	o.detection.Gate = string(judge.GateCNIPod)
	r := run(t, o, notReadyNode("n1"), notReadyNode("n2"), cniPod("n1", true), cniPod("n2", false),
		injected("a", "n1", stuck), injected("b", "n2", stuck))
	got := byName(r)
	if got["a"].Action != "evict" || !strings.HasPrefix(got["b"].Action, "wait: CNI not ready") {
		t.Errorf("cni-pod gate: %+v", got)
	}
	o = NewOptions()
	o.detection.Gate = string(judge.GateNone)
	if got := byName(run(t, o, injected("a", "n1", stuck))); got["a"].Action != "evict" {
		t.Errorf("gate none: %+v", got)
	}
}

// A bad detection setting is a usage error that names the flag, as the
// controller's is.
func TestValidateNamesTheFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--action=explode"}, `--action: "explode"`},
		{[]string{"--breaker-threshold=2"}, "--breaker-threshold: "},
		{[]string{"--cni-ready-gate=maybe"}, "--cni-ready-gate: "},
	} {
		var stderr strings.Builder
		code := Main(context.Background(), "repair audit", tc.args, io.Discard, &stderr, nil)
		if code != ExitUsage || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d naming %q", tc.args, code, stderr.String(), ExitUsage, tc.want)
		}
	}
}
