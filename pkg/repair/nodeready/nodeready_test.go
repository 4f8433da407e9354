package nodeready

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge/judgetest"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/metrics"
)

type nrHarness struct {
	t        *testing.T
	client   *fake.Clientset
	nodes    cache.SharedIndexInformer
	cniPods  cache.SharedIndexInformer
	n        *Controller
	recorder *record.FakeRecorder
	metrics  Metrics
}

// newNRHarness is node readiness with the controller's defaults over a fake
// clientset, its informer caches filled by hand.
func newNRHarness(t *testing.T, mutate func(*Config), node *corev1.Node, cni *corev1.Pod) *nrHarness {
	t.Helper()
	def := judge.DefaultConfig()
	cfg := Config{CNINamespace: def.CNINamespace, CNIPodSelector: def.CNIPodSelector,
		StartupTaintKey: annotations.TaintCNINotReady, StartupTaintEffect: corev1.TaintEffectNoSchedule}
	if mutate != nil {
		mutate(&cfg)
	}
	client := fake.NewClientset(node)
	h := &nrHarness{t: t, client: client, recorder: record.NewFakeRecorder(10),
		nodes:   informers.NewSharedInformerFactory(client, 0).Core().V1().Nodes().Informer(),
		cniPods: coreinformers.NewPodInformer(client, cfg.CNINamespace, 0, judge.PodNodeIndexers()),
		metrics: Metrics{Changes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: metrics.NodeReadinessChanges},
			[]string{metrics.LabelChange, metrics.LabelResult})},
	}
	var err error
	if h.n, err = New(cfg, client, h.nodes, h.cniPods, nil, h.recorder, h.metrics); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.n.queue.ShutDown)
	if err := h.nodes.GetIndexer().Add(node.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	if cni != nil {
		if err := h.cniPods.GetIndexer().Add(cni.DeepCopy()); err != nil {
			t.Fatal(err)
		}
	}
	return h
}

func (h *nrHarness) node() *corev1.Node {
	h.t.Helper()
	n, err := h.client.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	return n
}

func (h *nrHarness) patches() int {
	n := 0
	for _, a := range h.client.Actions() {
		if a.GetVerb() == "patch" {
			n++
		}
	}
	return n
}

func changes(m Metrics, change, result string) float64 {
	return testutil.ToFloat64(m.Changes.WithLabelValues(change, result))
}

func startupTaint(effect corev1.TaintEffect) corev1.Taint {
	return corev1.Taint{Key: annotations.TaintCNINotReady, Effect: effect}
}

var otherTaint = corev1.Taint{Key: "example.com/gpu", Value: "true", Effect: corev1.TaintEffectNoSchedule}

// nodeObject returns a Node object "n1" with labels and taints, not stored
// anywhere.
func nodeObject(labels map[string]string, taints ...corev1.Taint) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", ResourceVersion: "5", Labels: labels}, Spec: corev1.NodeSpec{Taints: taints}}
}

func TestNodeReadyLabelsAndUntaints(t *testing.T) {
	for _, effect := range []corev1.TaintEffect{corev1.TaintEffectNoSchedule, corev1.TaintEffectNoExecute} {
		t.Run(string(effect), func(t *testing.T) {
			h := newNRHarness(t, nil, nodeObject(map[string]string{"kubernetes.io/hostname": "n1"}, otherTaint, startupTaint(effect)), judgetest.CNIPod("n1", true, -time.Second))
			if err := h.n.sync(context.Background(), "n1"); err != nil {
				t.Fatal(err)
			}
			n := h.node()
			if n.Labels[annotations.LabelCNIReady] != "ready" || n.Labels["kubernetes.io/hostname"] != "n1" {
				t.Fatalf("labels: %v", n.Labels)
			}
			if len(n.Spec.Taints) != 1 || n.Spec.Taints[0].Key != otherTaint.Key {
				t.Fatalf("taints: %v (want only the other taint)", n.Spec.Taints)
			}
			if changes(h.metrics, metrics.ChangeLabelAdded, metrics.ResultSuccess) != 1 || changes(h.metrics, metrics.ChangeTaintRemoved, metrics.ResultSuccess) != 1 {
				t.Fatal("changes not counted")
			}
			e := <-h.recorder.Events
			if !strings.HasPrefix(e, "Normal "+EventCNIReady) {
				t.Fatalf("event %q", e)
			}
			// The patch tested the taints it replaced.
			var patch string
			for _, a := range h.client.Actions() {
				if a.GetVerb() == "patch" {
					patch = string(a.(k8stesting.PatchAction).GetPatch())
				}
			}
			if !strings.Contains(patch, `"op":"test","path":"/spec/taints"`) {
				t.Fatalf("patch without test: %s", patch)
			}
		})
	}
}

func TestNodeReadyOnlyTaintAndNoLabels(t *testing.T) {
	h := newNRHarness(t, nil, nodeObject(nil, startupTaint(corev1.TaintEffectNoSchedule)), judgetest.CNIPod("n1", true, -time.Second))
	if err := h.n.sync(context.Background(), "n1"); err != nil {
		t.Fatal(err)
	}
	n := h.node()
	if n.Labels[annotations.LabelCNIReady] != "ready" || len(n.Spec.Taints) != 0 {
		t.Fatalf("node: labels %v taints %v", n.Labels, n.Spec.Taints)
	}
}

func TestNodeReadyIsIdempotent(t *testing.T) {
	node := nodeObject(map[string]string{annotations.LabelCNIReady: "ready"}, otherTaint)
	node.Annotations = map[string]string{annotations.AnnotationCNIReadySince: "2026-11-30T11:00:00Z"}
	h := newNRHarness(t, nil, node, judgetest.CNIPod("n1", true, -2*time.Hour))
	if err := h.n.sync(context.Background(), "n1"); err != nil {
		t.Fatal(err)
	}
	if p := h.patches(); p != 0 {
		t.Fatalf("%d patches on a node already in the right state", p)
	}
}

func TestNodeNotReadyRemovesLabelKeepsTaintAway(t *testing.T) {
	for name, cni := range map[string]*corev1.Pod{"no CNI pod": nil, "CNI pod not Ready": judgetest.CNIPod("n1", false, -time.Second), "CNI pod on other node": judgetest.CNIPod("n2", true, -time.Second)} {
		t.Run(name, func(t *testing.T) {
			h := newNRHarness(t, nil, nodeObject(map[string]string{annotations.LabelCNIReady: "ready", "a": "b"}), cni)
			if err := h.n.sync(context.Background(), "n1"); err != nil {
				t.Fatal(err)
			}
			n := h.node()
			if _, ok := n.Labels[annotations.LabelCNIReady]; ok || n.Labels["a"] != "b" {
				t.Fatalf("labels: %v", n.Labels)
			}
			if len(n.Spec.Taints) != 0 {
				t.Fatalf("taint re-added without --readd-startup-taint: %v", n.Spec.Taints)
			}
			if e := <-h.recorder.Events; !strings.HasPrefix(e, "Warning "+EventCNINotReady) {
				t.Fatalf("event %q", e)
			}
			if changes(h.metrics, metrics.ChangeLabelRemoved, metrics.ResultSuccess) != 1 {
				t.Fatal("not counted")
			}
		})
	}
}

func TestNodeNotReadyReaddsTaintWhenAsked(t *testing.T) {
	for name, taints := range map[string][]corev1.Taint{"no taints": nil, "other taint": {otherTaint}} {
		t.Run(name, func(t *testing.T) {
			h := newNRHarness(t, func(c *Config) { c.ReaddStartupTaint = true }, nodeObject(map[string]string{annotations.LabelCNIReady: "ready"}, taints...), nil)
			if err := h.n.sync(context.Background(), "n1"); err != nil {
				t.Fatal(err)
			}
			n := h.node()
			if !hasTaint(n.Spec.Taints, annotations.TaintCNINotReady) || len(n.Spec.Taints) != len(taints)+1 {
				t.Fatalf("taints: %v", n.Spec.Taints)
			}
			if changes(h.metrics, metrics.ChangeTaintAdded, metrics.ResultSuccess) != 1 {
				t.Fatal("not counted")
			}
		})
	}
}

// The cache is stale: the node's taints changed on the server. The patch's
// test op fails, nothing is overwritten, and an error asks for a retry.
func TestNodeReadinessStaleCacheDoesNotOverwrite(t *testing.T) {
	h := newNRHarness(t, nil, nodeObject(nil, startupTaint(corev1.TaintEffectNoSchedule)), judgetest.CNIPod("n1", true, -time.Second))
	live := h.node()
	live.Spec.Taints = append(live.Spec.Taints, otherTaint)
	if _, err := h.client.CoreV1().Nodes().Update(context.Background(), live, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := h.n.sync(context.Background(), "n1"); err == nil {
		t.Fatal("patch on stale data succeeded")
	}
	n := h.node()
	if len(n.Spec.Taints) != 2 || n.Labels[annotations.LabelCNIReady] == "ready" {
		t.Fatalf("node changed by a failed patch: %v %v", n.Labels, n.Spec.Taints)
	}
	if changes(h.metrics, metrics.ChangeTaintRemoved, metrics.ResultFailure) != 1 {
		t.Fatal("failure not counted")
	}
	// With fresh data the next sync succeeds and keeps the new taint.
	if err := h.nodes.GetIndexer().Update(n); err != nil {
		t.Fatal(err)
	}
	if err := h.n.sync(context.Background(), "n1"); err != nil {
		t.Fatal(err)
	}
	n = h.node()
	if len(n.Spec.Taints) != 1 || n.Spec.Taints[0].Key != otherTaint.Key || n.Labels[annotations.LabelCNIReady] != "ready" {
		t.Fatalf("after retry: %v %v", n.Labels, n.Spec.Taints)
	}
}

// The cache shows a node without labels, but the node has got labels
// since: adding the whole label map would replace them, so the patch is
// guarded by the resourceVersion and fails instead.
func TestNodeReadinessStaleCacheKeepsLabels(t *testing.T) {
	node := nodeObject(nil)
	node.ResourceVersion = "1"
	h := newNRHarness(t, nil, node, judgetest.CNIPod("n1", true, -time.Second))
	live := h.node()
	live.Labels = map[string]string{"kubernetes.io/hostname": "n1"}
	live.ResourceVersion = "2"
	if _, err := h.client.CoreV1().Nodes().Update(context.Background(), live, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if h.node().ResourceVersion == "1" {
		t.Fatal("precondition: the live node must have another resourceVersion than the cached one")
	}
	if err := h.n.sync(context.Background(), "n1"); err == nil {
		t.Fatal("patch on stale data succeeded")
	}
	if n := h.node(); n.Labels["kubernetes.io/hostname"] != "n1" {
		t.Fatalf("labels replaced by a patch on stale data: %v", n.Labels)
	}
}

func TestNodeReadinessIgnoresTerminatingCNIPod(t *testing.T) {
	p := judgetest.CNIPod("n1", true, -time.Second)
	ts := judgetest.At(0)
	p.DeletionTimestamp = &ts
	h := newNRHarness(t, nil, nodeObject(nil, startupTaint(corev1.TaintEffectNoSchedule)), p)
	if err := h.n.sync(context.Background(), "n1"); err != nil {
		t.Fatal(err)
	}
	if h.patches() != 0 {
		t.Fatal("acted on a terminating CNI pod")
	}
}

// In dry run the node-readiness controller patches nothing: it logs and
// emits one Normal Event per decision.
func TestNodeReadinessDryRunMutatesNothing(t *testing.T) {
	for _, tc := range []struct {
		name   string
		node   *corev1.Node
		cni    *corev1.Pod
		reason string
	}{
		{"ready", nodeObject(map[string]string{"a": "b"}, startupTaint(corev1.TaintEffectNoSchedule)), judgetest.CNIPod("n1", true, -time.Second), EventWouldMarkCNIReady},
		{"not ready", nodeObject(map[string]string{annotations.LabelCNIReady: "ready"}), nil, EventWouldMarkCNINotReady},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newNRHarness(t, func(c *Config) { c.DryRun = true; c.ReaddStartupTaint = true }, tc.node, tc.cni)
			for i := 0; i < 2; i++ {
				if err := h.n.sync(context.Background(), "n1"); err != nil {
					t.Fatal(err)
				}
			}
			for _, a := range h.client.Actions() {
				if v := a.GetVerb(); v != "get" && v != "list" && v != "watch" {
					t.Errorf("dry run made a %s call on %s", v, a.GetResource().Resource)
				}
			}
			var events []string
			for len(h.recorder.Events) > 0 {
				events = append(events, <-h.recorder.Events)
			}
			if len(events) != 1 || !strings.HasPrefix(events[0], "Normal "+tc.reason+" Dry run") {
				t.Fatalf("events %q, want one Normal %s", events, tc.reason)
			}
			if n := h.node(); !equality.Semantic.DeepEqual(n.Labels, tc.node.Labels) || !equality.Semantic.DeepEqual(n.Spec.Taints, tc.node.Spec.Taints) || n.Annotations != nil {
				t.Fatalf("node changed: %+v", n)
			}
		})
	}
}

// The label and the ready-since annotation are written in one patch; other
// annotations are kept; a node without annotations gets the map.
func TestNodeReadyWritesReadySince(t *testing.T) {
	for name, ann := range map[string]map[string]string{"no annotations": nil, "other annotations": {"example.com/x": "y"}} {
		t.Run(name, func(t *testing.T) {
			node := nodeObject(map[string]string{"a": "b"})
			node.Annotations = ann
			h := newNRHarness(t, nil, node, judgetest.CNIPod("n1", true, -time.Second))
			h.n.now = func() time.Time { return judgetest.T0.Add(1500 * time.Millisecond) }
			if err := h.n.sync(context.Background(), "n1"); err != nil {
				t.Fatal(err)
			}
			n := h.node()
			if h.patches() != 1 || n.Labels[annotations.LabelCNIReady] != "ready" || n.Annotations[annotations.AnnotationCNIReadySince] != "2026-11-30T12:00:01Z" {
				t.Fatalf("%d patches, labels %v annotations %v", h.patches(), n.Labels, n.Annotations)
			}
			if ann != nil && n.Annotations["example.com/x"] != "y" {
				t.Fatalf("other annotations lost: %v", n.Annotations)
			}
		})
	}
}

// A node labelled ready without the annotation (by an older version) gets it
// added; a valid annotation is kept when the label is re-added (removed by
// someone else while the CNI pod stayed Ready); readiness lost removes both.
func TestNodeReadySinceBackfillKeepAndRemove(t *testing.T) {
	h := newNRHarness(t, nil, nodeObject(map[string]string{annotations.LabelCNIReady: "ready"}), judgetest.CNIPod("n1", true, -time.Second))
	h.n.now = func() time.Time { return judgetest.T0 }
	if err := h.n.sync(context.Background(), "n1"); err != nil {
		t.Fatal(err)
	}
	if n := h.node(); n.Annotations[annotations.AnnotationCNIReadySince] != annotations.FormatTime(judgetest.T0) || changes(h.metrics, metrics.ChangeReadySinceAdded, metrics.ResultSuccess) != 1 {
		t.Fatalf("not backfilled: %v", n.Annotations)
	}

	node := nodeObject(map[string]string{"a": "b"})
	node.Annotations = map[string]string{annotations.AnnotationCNIReadySince: "2026-11-30T10:00:00Z"}
	h = newNRHarness(t, nil, node, judgetest.CNIPod("n1", true, -3*time.Hour))
	h.n.now = func() time.Time { return judgetest.T0 }
	if err := h.n.sync(context.Background(), "n1"); err != nil {
		t.Fatal(err)
	}
	if n := h.node(); n.Labels[annotations.LabelCNIReady] != "ready" || n.Annotations[annotations.AnnotationCNIReadySince] != "2026-11-30T10:00:00Z" {
		t.Fatalf("label %v, baseline %v: want the label back and the baseline kept", n.Labels, n.Annotations)
	}

	node = nodeObject(map[string]string{annotations.LabelCNIReady: "ready"})
	node.Annotations = map[string]string{annotations.AnnotationCNIReadySince: "2026-11-30T10:00:00Z", "example.com/x": "y"}
	h = newNRHarness(t, nil, node, nil)
	if err := h.n.sync(context.Background(), "n1"); err != nil {
		t.Fatal(err)
	}
	if n := h.node(); n.Labels[annotations.LabelCNIReady] != "" || len(n.Annotations) != 1 || n.Annotations["example.com/x"] != "y" {
		t.Fatalf("not ready: labels %v annotations %v", n.Labels, n.Annotations)
	}
}
func TestNodeReadinessEventsSayOnlyWhatChanged(t *testing.T) {
	label := annotations.LabelCNIReady + "=" + annotations.LabelCNIReadyValue
	taint := "startup taint " + annotations.TaintCNINotReady
	for _, tc := range []struct {
		name       string
		readd      bool
		node       *corev1.Node
		cni        *corev1.Pod
		want       string
		notContain string
	}{
		{name: "label only", node: nodeObject(nil), cni: judgetest.CNIPod("n1", true, -time.Second),
			want: "Normal " + EventCNIReady + " CNI pod " + judge.DefaultConfig().CNINamespace + "/consul-cni-n1 is Ready: added label " + label, notContain: "taint"},
		{name: "taint only", node: withReadySince(nodeObject(map[string]string{annotations.LabelCNIReady: "ready"}, startupTaint(corev1.TaintEffectNoSchedule))), cni: judgetest.CNIPod("n1", true, -time.Second),
			want: "Normal " + EventCNIReady + " CNI pod " + judge.DefaultConfig().CNINamespace + "/consul-cni-n1 is Ready: removed " + taint, notContain: "label"},
		{name: "both", node: nodeObject(nil, startupTaint(corev1.TaintEffectNoSchedule)), cni: judgetest.CNIPod("n1", true, -time.Second),
			want: "Normal " + EventCNIReady + " CNI pod " + judge.DefaultConfig().CNINamespace + "/consul-cni-n1 is Ready: added label " + label + ", removed " + taint},
		{name: "label removed", node: nodeObject(map[string]string{annotations.LabelCNIReady: "ready"}),
			want: "removed label " + label, notContain: "taint"},
		{name: "label removed, taint re-added", readd: true, node: nodeObject(map[string]string{annotations.LabelCNIReady: "ready"}),
			want: "removed label " + label + ", added " + taint + ":NoSchedule"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newNRHarness(t, func(c *Config) { c.ReaddStartupTaint = tc.readd }, tc.node, tc.cni)
			if err := h.n.sync(context.Background(), "n1"); err != nil {
				t.Fatal(err)
			}
			e := <-h.recorder.Events
			if !strings.Contains(e, tc.want) || (tc.notContain != "" && strings.Contains(strings.SplitN(e, ": ", 2)[1], tc.notContain)) {
				t.Fatalf("event %q: want %q and nothing about %q", e, tc.want, tc.notContain)
			}
		})
	}
}

// withReadySince gives a node labelled ready the baseline annotation it
// would carry, so that no backfill is part of the change.
func withReadySince(n *corev1.Node) *corev1.Node {
	n.Annotations = map[string]string{annotations.AnnotationCNIReadySince: annotations.FormatTime(judgetest.T0)}
	return n
}

// An installer pod in uninstall mode, Ready or not, makes the node lose the
// readiness label and the startup taint, even with --readd-startup-taint,
// and never counts as a ready CNI pod (the repair gate stays closed).
func TestNodeUninstallingRemovesLabelAndTaint(t *testing.T) {
	for _, ready := range []bool{true, false} {
		t.Run(fmt.Sprintf("ready=%v", ready), func(t *testing.T) {
			remover := judgetest.CNIPod("n1", ready, -time.Second)
			remover.Labels[annotations.LabelInstallerMode] = annotations.InstallerModeUninstall
			h := newNRHarness(t, func(c *Config) { c.ReaddStartupTaint = true },
				nodeObject(map[string]string{annotations.LabelCNIReady: "ready", "a": "b"}, otherTaint, startupTaint(corev1.TaintEffectNoSchedule)), remover)
			if judge.ReadyCNIPod(h.cniPods.GetIndexer(), "n1") != nil {
				t.Fatal("an uninstalling pod counts as a ready CNI pod")
			}
			if err := h.n.sync(context.Background(), "n1"); err != nil {
				t.Fatal(err)
			}
			n := h.node()
			if _, ok := n.Labels[annotations.LabelCNIReady]; ok || n.Labels["a"] != "b" {
				t.Fatalf("labels: %v", n.Labels)
			}
			if len(n.Spec.Taints) != 1 || n.Spec.Taints[0].Key != otherTaint.Key {
				t.Fatalf("taints: %v (want only the other taint)", n.Spec.Taints)
			}
			if e := <-h.recorder.Events; !strings.HasPrefix(e, "Normal "+EventCNIUninstalled) {
				t.Fatalf("event %q", e)
			}
			if changes(h.metrics, metrics.ChangeLabelRemoved, metrics.ResultSuccess) != 1 || changes(h.metrics, metrics.ChangeTaintRemoved, metrics.ResultSuccess) != 1 {
				t.Fatal("changes not counted")
			}
			// Nothing more to do: no second patch.
			before := h.patches()
			if err := h.nodes.GetIndexer().Update(n); err != nil {
				t.Fatal(err)
			}
			if err := h.n.sync(context.Background(), "n1"); err != nil || h.patches() != before {
				t.Fatalf("second sync: %v, %d patches", err, h.patches()-before)
			}
		})
	}
}

// The ready-since annotation means "continuously ready since": when one of
// the CNI pod's containers started later than it (a restart, also one the
// kubelet never reported as not Ready), the installer started again (a node
// reboot this process did not see) and the annotation moves forward to the
// pod's readiness, guarded by a test of the old value; otherwise it is kept,
// also when only the Ready transition is later: a readiness flap of a
// running installer that this process did not see, whose length it cannot
// tell.
func TestNodeReadySinceContinuous(t *testing.T) {
	old := annotations.FormatTime(judgetest.T0.Add(-10 * time.Minute))
	cases := []struct {
		name     string
		labelled bool
		ready    time.Duration  // the CNI pod's Ready transition
		started  *time.Duration // a running container's start, if any
		want     string         // the annotation after sync
	}{
		{"ready transition later, container restarted", true, -time.Minute, durp(-70 * time.Second), annotations.FormatTime(judgetest.T0.Add(-time.Minute))},
		{"ready transition later, container running since before (an unseen flap)", true, -time.Minute, durp(-2 * time.Hour), old},
		{"container restarted, transition not reported", true, -time.Hour, durp(-2 * time.Minute), annotations.FormatTime(judgetest.T0.Add(-2 * time.Minute))},
		{"label removed by someone else, CNI restarted since", false, -30 * time.Second, durp(-31 * time.Second), annotations.FormatTime(judgetest.T0.Add(-30 * time.Second))},
		{"continuously ready", true, -time.Hour, durp(-time.Hour - time.Second), old},
		{"same second", true, -10*time.Minute + 800*time.Millisecond, nil, old},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			labels := map[string]string{"a": "b"}
			if tc.labelled {
				labels[annotations.LabelCNIReady] = annotations.LabelCNIReadyValue
			}
			node := nodeObject(labels)
			node.Annotations = map[string]string{annotations.AnnotationCNIReadySince: old}
			cni := judgetest.CNIPod("n1", true, tc.ready)
			if tc.started != nil {
				cni.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "installer", RestartCount: 1,
					State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: judgetest.At(*tc.started)}}}}
			}
			h := newNRHarness(t, nil, node, cni)
			h.n.now = func() time.Time { return judgetest.T0 }
			if err := h.n.sync(context.Background(), "n1"); err != nil {
				t.Fatal(err)
			}
			n := h.node()
			if got := n.Annotations[annotations.AnnotationCNIReadySince]; got != tc.want || n.Labels[annotations.LabelCNIReady] != "ready" {
				t.Fatalf("annotation %s, labels %v; want annotation %s and the label", got, n.Labels, tc.want)
			}
			moved := tc.want != old
			if got := changes(h.metrics, metrics.ChangeReadySinceMoved, metrics.ResultSuccess); got != map[bool]float64{true: 1}[moved] {
				t.Fatalf("ready_since_moved = %v, moved %v", got, moved)
			}
			if !moved {
				if !tc.labelled || h.patches() == 0 {
					return
				}
				t.Fatalf("%d patches on a continuously ready node", h.patches())
			}
			for _, a := range h.client.Actions() {
				if a.GetVerb() == "patch" {
					patch := string(a.(k8stesting.PatchAction).GetPatch())
					if !strings.Contains(patch, `{"op":"test","path":"/metadata/annotations/consul.hashicorp.com~1cni-ready-since","value":"`+old+`"}`) {
						t.Fatalf("patch does not test the old value: %s", patch)
					}
				}
			}
		})
	}
}

// A concurrent change of the annotation on the server makes the move's test
// op fail: nothing is overwritten and the sync asks for a retry.
func TestNodeReadySinceMoveIsGuarded(t *testing.T) {
	node := nodeObject(map[string]string{annotations.LabelCNIReady: annotations.LabelCNIReadyValue})
	node.Annotations = map[string]string{annotations.AnnotationCNIReadySince: annotations.FormatTime(judgetest.T0.Add(-10 * time.Minute))}
	h := newNRHarness(t, nil, node, judgetest.CNIPod("n1", true, -time.Minute, judgetest.RunningSince(-time.Minute)))
	live := h.node()
	live.Annotations[annotations.AnnotationCNIReadySince] = annotations.FormatTime(judgetest.T0.Add(-5 * time.Minute))
	if _, err := h.client.CoreV1().Nodes().Update(context.Background(), live, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := h.n.sync(context.Background(), "n1"); err == nil {
		t.Fatal("sync on a stale cache succeeded")
	}
	if got := h.node().Annotations[annotations.AnnotationCNIReadySince]; got != annotations.FormatTime(judgetest.T0.Add(-5*time.Minute)) {
		t.Fatalf("annotation overwritten: %s", got)
	}
}

func durp(d time.Duration) *time.Duration { return &d }

// What node readiness writes is what the node-label gate reads back.
func TestReadySinceRoundTrip(t *testing.T) {
	nr := newNRHarness(t, nil, nodeObject(nil), judgetest.CNIPod("n1", true, -time.Second))
	nr.n.now = func() time.Time { return judgetest.T0.Add(-7 * time.Minute) }
	if err := nr.n.sync(context.Background(), "n1"); err != nil {
		t.Fatal(err)
	}
	if open, since := gateOn(t, nr.node()).Open("n1"); !open || !since.Equal(judgetest.T0.Add(-7*time.Minute)) {
		t.Fatalf("gate: open %v since %s", open, since)
	}
	// A value in the future (another clock) is never used as is.
	future := nr.node()
	future.Annotations[annotations.AnnotationCNIReadySince] = annotations.FormatTime(time.Now().Add(time.Hour))
	if _, since := gateOn(t, future).Open("n1"); since.After(time.Now()) {
		t.Fatalf("since %s is in the future", since)
	}
}

// gateOn is the controller's node-label gate over a cache holding node.
func gateOn(t *testing.T, node *corev1.Node) judge.Gate {
	nodes := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	if err := nodes.Add(node); err != nil {
		t.Fatal(err)
	}
	return judge.NewGate(judge.GateNodeLabel, corelisters.NewNodeLister(nodes), nil, time.Now(), false)
}

// A not-ready spell of a running installer shorter than judge.FlapBound keeps the
// node's cni-ready-since (the label goes at once: the gate closes); a longer
// one, seen while it lasts or only once it has outlasted the bound, loses
// it, so readiness dates a new baseline; a restart of the installer in the
// spell (a node reboot) moves it, however short the spell.
func TestReadinessFlapsShorterThanTheBoundKeepTheBaseline(t *testing.T) {
	old := judgetest.T0.Add(-10 * time.Minute)
	cases := []struct {
		name     string
		seen     []time.Duration // when the controller synced during the spell, from its start
		spell    time.Duration   // when the installer was Ready again
		restart  *time.Duration  // its container's new start, if it restarted
		want     time.Time
		removals float64 // ready_since_removed changes
	}{
		{"a 5 s flap keeps the baseline", []time.Duration{time.Second}, 5 * time.Second, nil, old, 0},
		{"a flap just under the bound keeps the baseline", []time.Duration{time.Second, judge.FlapBound - time.Second}, judge.FlapBound - time.Second, nil, old, 0},
		{"a flap longer than the bound moves it", []time.Duration{time.Second, judge.FlapBound}, 45 * time.Second, nil, judgetest.T0.Add(45 * time.Second), 1},
		{"a long spell first seen after the bound moves it", []time.Duration{40 * time.Second}, 45 * time.Second, nil, judgetest.T0.Add(45 * time.Second), 0},
		{"a 5 s spell ending in a restart of the installer moves it", []time.Duration{time.Second}, 5 * time.Second, durp(4 * time.Second), judgetest.T0.Add(5 * time.Second), 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// Other labels and annotations: the fake API returns empty maps
			// where the real one returns none.
			node := nodeObject(map[string]string{"a": "b", annotations.LabelCNIReady: annotations.LabelCNIReadyValue})
			node.Annotations = map[string]string{"example.com/x": "y", annotations.AnnotationCNIReadySince: annotations.FormatTime(old)}
			cni := judgetest.CNIPod("n1", false, 0, judgetest.RunningSince(-2*time.Hour))
			h := newNRHarness(t, nil, node, cni)
			step := func(at time.Duration) {
				t.Helper()
				h.n.now = func() time.Time { return judgetest.T0.Add(at) }
				if err := h.n.sync(context.Background(), "n1"); err != nil {
					t.Fatal(err)
				}
				if err := h.nodes.GetIndexer().Update(h.node()); err != nil {
					t.Fatal(err)
				}
			}
			for _, at := range tc.seen {
				step(at)
				if n := h.node(); judge.LabelledReady(n) {
					t.Fatalf("%s into the spell: still labelled ready", at)
				}
			}
			judgetest.ReadyAt(tc.spell)(cni)
			cni.Status.Conditions[0].Status = corev1.ConditionTrue
			if tc.restart != nil {
				cni.Status.ContainerStatuses[0].State.Running.StartedAt = judgetest.At(*tc.restart)
			}
			if err := h.cniPods.GetIndexer().Update(cni); err != nil {
				t.Fatal(err)
			}
			step(tc.spell)
			n := h.node()
			if got, ok := judge.RecordedReadySince(n); !ok || !got.Equal(tc.want) || !judge.LabelledReady(n) {
				t.Fatalf("cni-ready-since %v (%v), labels %v; want %s and the label", got, ok, n.Labels, annotations.FormatTime(tc.want))
			}
			if got := changes(h.metrics, metrics.ChangeReadySinceRemoved, metrics.ResultSuccess); got != tc.removals {
				t.Fatalf("ready_since_removed = %v, want %v", got, tc.removals)
			}
		})
	}
}
