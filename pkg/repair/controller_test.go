package repair

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/configkey"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge/judgetest"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/metrics"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/podcache"
)

// harness is a controller over a fake clientset whose informer caches are
// filled by hand (through the same transforms), so sync runs synchronously.
type harness struct {
	t        *testing.T
	client   *fake.Clientset
	inf      *Informers
	c        *Controller
	recorder *record.FakeRecorder
	metrics  *Metrics
	now      time.Time
}

func newHarness(t *testing.T, mutate func(*Config), objs ...runtime.Object) *harness {
	t.Helper()
	cfg := defaultConfig()
	cfg.MaxRepairsPerMinute = 6000
	cfg.MaxRepairsPerNodePerMinute = 6000
	if mutate != nil {
		mutate(&cfg)
	}
	client := fake.NewClientset(objs...)
	inf, err := newInformers(client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, client: client, inf: inf, recorder: record.NewFakeRecorder(100), metrics: newMetrics(), now: judgetest.T0}
	h.c, err = newController(cfg, client, inf, h.recorder, h.metrics)
	if err != nil {
		t.Fatal(err)
	}
	h.c.now = func() time.Time { return h.now }
	t.Cleanup(h.c.queue.ShutDown)
	return h
}

func readyNode(name string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "1",
		Labels: map[string]string{annotations.LabelCNIReady: annotations.LabelCNIReadyValue}}}
}

// cacheDefault is the injected-pod informer's transform with the default
// settings: what the cache holds.
func cacheDefault(obj interface{}) (interface{}, error) {
	return podcache.InjectedPodTransform(judge.DefaultConfig().InitContainerNames)(obj)
}

// addPod puts pod in the fake API and the cache (slimmed).
func (h *harness) addPod(p *corev1.Pod) string {
	h.t.Helper()
	if _, err := h.client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
	s, _ := cacheDefault(p.DeepCopy())
	if err := h.inf.Pods.GetIndexer().Add(s); err != nil {
		h.t.Fatal(err)
	}
	return p.Namespace + "/" + p.Name
}

func (h *harness) addNode(n *corev1.Node) {
	h.t.Helper()
	s, _ := podcache.NodeTransform(n.DeepCopy())
	if err := h.inf.Nodes.GetIndexer().Add(s); err != nil {
		h.t.Fatal(err)
	}
	h.c.gate.Observe(s.(*corev1.Node), true)
}

func (h *harness) sync(key string) error {
	h.t.Helper()
	return h.c.sync(context.Background(), key)
}

// mutations returns the API calls that change something (not get/list/watch).
func (h *harness) mutations() []k8stesting.Action {
	var out []k8stesting.Action
	for _, a := range h.client.Actions() {
		switch a.GetVerb() {
		case "get", "list", "watch":
			continue
		}
		if a.GetVerb() == "create" && a.GetSubresource() == "" && a.GetResource().Resource == "pods" {
			continue // the test's own setup
		}
		out = append(out, a)
	}
	return out
}

func (h *harness) events() []string {
	var out []string
	for {
		select {
		case e := <-h.recorder.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func brokenB(opts ...judgetest.PodOpt) *corev1.Pod {
	base := []judgetest.PodOpt{judgetest.SandboxAt(-10 * time.Second), judgetest.InitStatus(corev1.ContainerStatus{
		Name: annotations.InitContainerName, State: corev1.ContainerState{Terminated: judgetest.Terminated(88, -10*time.Second, -5*time.Second)},
	})}
	return judgetest.Pod(append(base, opts...)...)
}

func repaired(m *Metrics, action, result string, reason judge.Reason, dry string) float64 {
	return m.Outcome("app", action, result, reason, dry)
}

func skipped(m *Metrics, reason string) float64 {
	return testutil.ToFloat64(m.Skipped.WithLabelValues(reason))
}

func TestEvictBrokenPodOnceWithPreconditions(t *testing.T) {
	h := newHarness(t, nil)
	h.addNode(readyNode("n1"))
	p := brokenB()
	key := h.addPod(p)
	if err := h.sync(key); err != nil {
		t.Fatal(err)
	}
	muts := h.mutations()
	if len(muts) != 1 {
		t.Fatalf("want 1 eviction, got %v", muts)
	}
	a := muts[0].(k8stesting.CreateAction)
	if a.GetSubresource() != "eviction" {
		t.Fatalf("want an eviction, got %v", a)
	}
	ev := a.GetObject().(*policyv1.Eviction)
	pre := ev.DeleteOptions.Preconditions
	if ev.Name != p.Name || pre == nil || *pre.UID != p.UID || *pre.ResourceVersion != p.ResourceVersion {
		t.Fatalf("eviction without UID/resourceVersion preconditions: %+v", ev)
	}
	evs := h.events()
	if len(evs) != 1 || !strings.HasPrefix(evs[0], "Warning "+EventBypassedCNI+" ") || !strings.Contains(evs[0], "exited with code 88") {
		t.Fatalf("events: %q", evs)
	}
	if got := repaired(h.metrics, "evict", metrics.ResultSuccess, judge.ReasonInitCheckFailed, "false"); got != 1 {
		t.Fatalf("repaired_total = %v", got)
	}
	if got := testutil.CollectAndCount(h.metrics.Latency); got != 1 {
		t.Fatalf("latency series = %d", got)
	}

	// At most once per UID: later updates of the same pod do nothing.
	for i := 0; i < 3; i++ {
		if err := h.sync(key); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(h.mutations()); n != 1 {
		t.Fatalf("acted again: %d mutations", n)
	}
	if got := skipped(h.metrics, metrics.SkipAlreadyActed); got != 1 {
		t.Fatalf("skipped already_acted = %v, want 1 (counted once)", got)
	}
}

func TestDeleteUsesPreconditions(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Action = judge.ActionDelete })
	h.addNode(readyNode("n1"))
	p := brokenB()
	if err := h.sync(h.addPod(p)); err != nil {
		t.Fatal(err)
	}
	muts := h.mutations()
	if len(muts) != 1 || muts[0].GetVerb() != "delete" {
		t.Fatalf("want one delete, got %v", muts)
	}
	opts := muts[0].(k8stesting.DeleteActionImpl).DeleteOptions
	if opts.Preconditions == nil || *opts.Preconditions.UID != p.UID || *opts.Preconditions.ResourceVersion != "100" {
		t.Fatalf("delete without preconditions: %+v", opts)
	}
	if _, err := h.client.CoreV1().Pods("app").Get(context.Background(), p.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("pod not deleted: %v", err)
	}
}

func TestLabelActionPatchesOnlyTheLabel(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Action = judge.ActionLabel })
	h.addNode(readyNode("n1"))
	p := brokenB()
	key := h.addPod(p)
	if err := h.sync(key); err != nil {
		t.Fatal(err)
	}
	muts := h.mutations()
	if len(muts) != 1 || muts[0].GetVerb() != "patch" {
		t.Fatalf("want one patch, got %v", muts)
	}
	pa := muts[0].(k8stesting.PatchAction)
	patch := string(pa.GetPatch())
	if pa.GetPatchType() != types.MergePatchType || !strings.Contains(patch, `"uid":"`+string(p.UID)+`"`) ||
		!strings.Contains(patch, `"resourceVersion":"`+p.ResourceVersion+`"`) {
		t.Errorf("want a merge patch with the UID and resourceVersion as preconditions, got %s %s", pa.GetPatchType(), patch)
	}
	got, err := h.client.CoreV1().Pods("app").Get(context.Background(), p.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Labels[annotations.LabelUninitialized] != "true" || got.Labels["app"] != "web" {
		t.Fatalf("labels after patch: %v", got.Labels)
	}
	// A new leader (fresh state) sees the label and does not act again.
	h2 := newHarness(t, func(c *Config) { c.Action = judge.ActionLabel })
	h2.addNode(readyNode("n1"))
	if err := h2.sync(h2.addPod(got)); err != nil {
		t.Fatal(err)
	}
	if m := h2.mutations(); len(m) != 0 {
		t.Fatalf("labelled pod acted on again: %v", m)
	}
}

// TestLabelActionKeepsLabelsTheCacheDoesNotHold: the informer keeps only
// our labels, so a pod injected by annotation alone has no labels in the
// cache; labelling it must add ours to its real labels, not replace them.
func TestLabelActionKeepsLabelsTheCacheDoesNotHold(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Action = judge.ActionLabel })
	h.addNode(readyNode("n1"))
	p := brokenB()
	p.Labels = map[string]string{"app": "web", "pod-template-hash": "5d8f"}
	key := h.addPod(p)
	obj, _, err := h.inf.Pods.GetIndexer().GetByKey(key)
	if cached, ok := podcache.PodOf(obj); err != nil || !ok || len(cached.Labels) != 0 {
		t.Fatalf("precondition: the cache should hold none of these labels: %v %v", obj, err)
	}
	if err := h.sync(key); err != nil {
		t.Fatal(err)
	}
	got, err := h.client.CoreV1().Pods("app").Get(context.Background(), p.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"app": "web", "pod-template-hash": "5d8f", annotations.LabelUninitialized: annotations.LabelUninitializedValue}
	if !reflect.DeepEqual(got.Labels, want) {
		t.Fatalf("labels after the action %v, want %v", got.Labels, want)
	}
}

func TestDryRunMutatesNothing(t *testing.T) {
	for _, action := range []judge.Action{judge.ActionEvict, judge.ActionDelete, judge.ActionLabel} {
		t.Run(string(action), func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.Action = action; c.DryRun = true })
			h.addNode(readyNode("n1"))
			key := h.addPod(brokenB())
			for i := 0; i < 2; i++ {
				if err := h.sync(key); err != nil {
					t.Fatal(err)
				}
			}
			if m := h.mutations(); len(m) != 0 {
				t.Fatalf("dry run mutated: %v", m)
			}
			evs := h.events()
			if len(evs) != 1 || !strings.HasPrefix(evs[0], "Normal "+EventWouldRepair+" ") || !strings.Contains(evs[0], "would "+string(action)) {
				t.Fatalf("events: %q", evs)
			}
			if got := repaired(h.metrics, string(action), metrics.ResultSuccess, judge.ReasonInitCheckFailed, "true"); got != 1 {
				t.Fatalf("dry_run counter = %v", got)
			}
			if got := repaired(h.metrics, string(action), metrics.ResultSuccess, judge.ReasonInitCheckFailed, "false"); got != 0 {
				t.Fatalf("real counter = %v", got)
			}
		})
	}
}

func TestBarePodsAreLeftAloneUnlessAllowed(t *testing.T) {
	h := newHarness(t, nil)
	h.addNode(readyNode("n1"))
	key := h.addPod(brokenB(judgetest.Bare()))
	for i := 0; i < 2; i++ {
		if err := h.sync(key); err != nil {
			t.Fatal(err)
		}
	}
	if m := h.mutations(); len(m) != 0 {
		t.Fatalf("bare pod acted on: %v", m)
	}
	evs := h.events()
	if len(evs) != 1 || !strings.HasPrefix(evs[0], "Warning "+EventBarePodNotRepaired) {
		t.Fatalf("events: %q", evs)
	}
	if got := skipped(h.metrics, metrics.SkipBarePod); got != 1 {
		t.Fatalf("skipped bare_pod = %v", got)
	}

	h = newHarness(t, func(c *Config) { c.AllowBarePods = true })
	h.addNode(readyNode("n1"))
	if err := h.sync(h.addPod(brokenB(judgetest.Bare()))); err != nil {
		t.Fatal(err)
	}
	if m := h.mutations(); len(m) != 1 {
		t.Fatalf("--allow-bare-pods: want an eviction, got %v", m)
	}
}

func TestNeverTouched(t *testing.T) {
	ts := judgetest.At(-time.Second)
	for name, p := range map[string]*corev1.Pod{
		"terminating": brokenB(func(p *corev1.Pod) { p.DeletionTimestamp = &ts }),
		"mirror":      brokenB(judgetest.WithAnnotation(annotations.KeyConfigMirror, "x")),
		"complete":    brokenB(judgetest.WithStatus("complete")),
		"young A":     judgetest.Pod(judgetest.SandboxAt(-time.Second)),
	} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.AllowBarePods = true })
			h.addNode(readyNode("n1"))
			if err := h.sync(h.addPod(p)); err != nil {
				t.Fatal(err)
			}
			if m := h.mutations(); len(m) != 0 {
				t.Fatalf("acted: %v", m)
			}
		})
	}
}

func TestSignalAFiresAfterMinAge(t *testing.T) {
	h := newHarness(t, nil)
	h.addNode(readyNode("n1"))
	key := h.addPod(judgetest.Pod(judgetest.SandboxAt(-10 * time.Second)))
	if err := h.sync(key); err != nil {
		t.Fatal(err)
	}
	if m := h.mutations(); len(m) != 0 {
		t.Fatalf("acted before min age: %v", m)
	}
	h.now = judgetest.T0.Add(21 * time.Second)
	if err := h.sync(key); err != nil {
		t.Fatal(err)
	}
	if m := h.mutations(); len(m) != 1 {
		t.Fatalf("want an eviction after min age, got %v", m)
	}
	if got := repaired(h.metrics, "evict", metrics.ResultSuccess, judge.ReasonTProxyStatusStuck, "false"); got != 1 {
		t.Fatalf("counter = %v", got)
	}
}

func TestGate(t *testing.T) {
	unlabelled := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	cases := []struct {
		name   string
		mode   judge.GateMode
		node   *corev1.Node
		cni    *corev1.Pod
		action bool
	}{
		{"node-label: labelled", judge.GateNodeLabel, readyNode("n1"), nil, true},
		{"node-label: unlabelled", judge.GateNodeLabel, unlabelled, judgetest.CNIPod("n1", true, -time.Hour), false},
		{"node-label: node unknown", judge.GateNodeLabel, nil, nil, false},
		{"cni-pod: Ready", judge.GateCNIPod, unlabelled, judgetest.CNIPod("n1", true, -time.Hour), true},
		{"cni-pod: not Ready", judge.GateCNIPod, readyNode("n1"), judgetest.CNIPod("n1", false, -time.Hour), false},
		{"cni-pod: on another node", judge.GateCNIPod, readyNode("n1"), judgetest.CNIPod("n2", true, -time.Hour), false},
		{"cni-pod: none", judge.GateCNIPod, readyNode("n1"), nil, false},
		{"none", judge.GateNone, unlabelled, nil, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.Gate = tc.mode })
			if tc.node != nil {
				h.addNode(tc.node)
			}
			if tc.cni != nil {
				s, _ := podcache.CNIPodTransform(tc.cni)
				if err := h.inf.CNIPods.GetIndexer().Add(s); err != nil {
					t.Fatal(err)
				}
			}
			if err := h.sync(h.addPod(brokenB())); err != nil {
				t.Fatal(err)
			}
			if got := len(h.mutations()) == 1; got != tc.action {
				t.Fatalf("acted = %v, want %v", got, tc.action)
			}
			if !tc.action && skipped(h.metrics, metrics.SkipGateClosed) != 1 {
				t.Fatalf("gate_closed not counted")
			}
		})
	}
}

func TestPDBBlockedEvictionRetriesWithBackoff(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.BackoffBase = time.Millisecond; c.BackoffMax = 10 * time.Millisecond })
	h.addNode(readyNode("n1"))
	blocked := true
	h.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "eviction" || !blocked {
			return false, nil, nil
		}
		err := apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
		err.ErrStatus.Details.Causes = append(err.ErrStatus.Details.Causes, metav1.StatusCause{Type: policyv1.DisruptionBudgetCause, Message: "The disruption budget web needs 1 healthy pods and has 1 currently"})
		return true, nil, err
	})
	key := h.addPod(brokenB())
	for i := 0; i < 3; i++ {
		err := h.sync(key)
		var re *retryError
		if err == nil || !asRetry(err, &re) {
			t.Fatalf("attempt %d: want a retry error, got %v", i, err)
		}
	}
	if got := repaired(h.metrics, "evict", metrics.CausePDBBlocked, judge.ReasonInitCheckFailed, "false"); got != 3 {
		t.Fatalf("pdb_blocked = %v", got)
	}
	if evs := h.events(); len(evs) != 1 || !strings.HasPrefix(evs[0], "Warning "+EventEvictionBlocked) {
		t.Fatalf("events: %q (want one EvictionBlocked)", evs)
	}
	// processNext puts a failing key back with per-pod exponential back-off.
	h.c.queue.Add(key)
	h.c.processNext(context.Background())
	if n := h.c.queue.NumRequeues(key); n != 1 {
		t.Fatalf("requeues = %d, want 1", n)
	}
	blocked = false
	if err := h.sync(key); err != nil {
		t.Fatal(err)
	}
	if got := repaired(h.metrics, "evict", metrics.ResultSuccess, judge.ReasonInitCheckFailed, "false"); got != 1 {
		t.Fatalf("success after budget = %v", got)
	}
}

func asRetry(err error, target **retryError) bool {
	r, ok := err.(*retryError)
	if ok {
		*target = r
	}
	return ok
}

func TestConflictAndOtherErrors(t *testing.T) {
	h := newHarness(t, nil)
	h.addNode(readyNode("n1"))
	var next error
	h.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		return true, nil, next
	})
	key := h.addPod(brokenB())
	// Precondition failed: the pod changed; no error (its update requeues it), not acted.
	next = apierrors.NewConflict(schema.GroupResource{Resource: "pods"}, "x", nil)
	if err := h.sync(key); err != nil {
		t.Fatalf("conflict: %v", err)
	}
	// A server error is a failure and is retried.
	next = apierrors.NewInternalError(errTest)
	if err := h.sync(key); err == nil {
		t.Fatal("internal error: want an error to retry")
	}
	if got := repaired(h.metrics, "evict", metrics.CauseError, judge.ReasonInitCheckFailed, "false"); got != 1 {
		t.Fatalf("failure = %v", got)
	}
	// Throttling 429 without a disruption-budget cause is a failure, not pdb_blocked.
	next = apierrors.NewTooManyRequests("slow down", 1)
	if err := h.sync(key); err == nil {
		t.Fatal("429: want an error")
	}
	if got := repaired(h.metrics, "evict", metrics.CausePDBBlocked, judge.ReasonInitCheckFailed, "false"); got != 0 {
		t.Fatalf("throttling counted as pdb_blocked")
	}
	next = nil
	if err := h.sync(key); err != nil {
		t.Fatal(err)
	}
	if got := repaired(h.metrics, "evict", metrics.ResultSuccess, judge.ReasonInitCheckFailed, "false"); got != 1 {
		t.Fatalf("success = %v", got)
	}
}

var errTest = &testErr{}

type testErr struct{}

func (*testErr) Error() string { return "boom" }

func TestControllerRateLimit(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxRepairsPerMinute = 1; c.MaxRepairsPerNodePerMinute = 60 })
	h.addNode(readyNode("n1"))
	k1 := h.addPod(brokenB())
	k2 := h.addPod(brokenB())
	for _, k := range []string{k1, k2} {
		if err := h.sync(k); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(h.mutations()); n != 1 {
		t.Fatalf("global limit 1/min: %d actions", n)
	}
	if got := skipped(h.metrics, metrics.SkipRateLimited); got != 1 {
		t.Fatalf("rate_limited = %v", got)
	}
	h.now = h.now.Add(61 * time.Second)
	if err := h.sync(k2); err != nil {
		t.Fatal(err)
	}
	if n := len(h.mutations()); n != 2 {
		t.Fatalf("after a minute: %d actions", n)
	}
}

// The race (pods whose sandbox predates the node's CNI readiness) does not
// trip the breaker; pods created after it that break too do.
func TestControllerBreaker(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Gate = judge.GateCNIPod; c.BreakerMinPods = 3; c.BreakerThreshold = 0.5 })
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	h.addNode(node)
	s, _ := podcache.CNIPodTransform(judgetest.CNIPod("n1", true, -4*time.Minute)) // CNI ready since T0-4m
	if err := h.inf.CNIPods.GetIndexer().Add(s); err != nil {
		t.Fatal(err)
	}
	brokenAt := func(d time.Duration) *corev1.Pod {
		return judgetest.Pod(judgetest.SandboxAt(d), judgetest.InitStatus(corev1.ContainerStatus{
			Name: annotations.InitContainerName, State: corev1.ContainerState{Terminated: judgetest.Terminated(88, d, d+time.Second)},
		}))
	}
	// The race: 4 pods whose sandbox is older than the CNI's readiness.
	var keys []string
	for i := 0; i < 4; i++ {
		keys = append(keys, h.addPod(brokenAt(-5*time.Minute)))
	}
	for _, k := range keys {
		if err := h.sync(k); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(h.mutations()); n != 4 {
		t.Fatalf("race pods: %d actions, want 4", n)
	}
	// Misconfiguration: pods created after readiness (more than the
	// sandbox slack after it) break too.
	keys = nil
	for i := 0; i < 3; i++ {
		keys = append(keys, h.addPod(brokenAt(-30*time.Second)))
	}
	h.addPod(judgetest.Pod(judgetest.WithStatus("complete"), judgetest.SandboxAt(-20*time.Second)))
	for _, k := range keys {
		if err := h.sync(k); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(h.mutations()); n != 4 {
		t.Fatalf("breaker did not stop actions: %d", n)
	}
	if got := testutil.ToFloat64(h.metrics.BreakerOpenNodes); got != 1 {
		t.Fatalf("open nodes gauge = %v", got)
	}
	if got := skipped(h.metrics, metrics.SkipBreakerOpen); got != 3 {
		t.Fatalf("breaker_open = %v", got)
	}
	var opened int
	for _, e := range h.events() {
		if strings.HasPrefix(e, "Warning "+EventRepairCircuitOpen) {
			opened++
		}
	}
	if opened != 1 {
		t.Fatalf("want one RepairCircuitOpen node event, got %d", opened)
	}
	// The CNI pod restarts with a fixed configuration: its container's
	// start and readiness are newer than those pods (a Ready transition
	// alone would be a readiness flap, which keeps the baseline), the
	// breaker closes and they are repaired.
	s, _ = podcache.CNIPodTransform(judgetest.CNIPod("n1", true, -time.Second, judgetest.RunningSince(-2*time.Second)))
	if err := h.inf.CNIPods.GetIndexer().Update(s); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if err := h.sync(k); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(h.mutations()); n != 7 {
		t.Fatalf("after fix: %d actions, want 7", n)
	}
	if got := testutil.ToFloat64(h.metrics.BreakerOpenNodes); got != 0 {
		t.Fatalf("open nodes gauge = %v", got)
	}
}

// An open breaker whose broken pods are deleted by hand closes at the next
// periodic re-check, although no broken pod is synced there any more.
func TestBreakerClosesWhenItsPodsAreGone(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Gate = judge.GateCNIPod; c.BreakerMinPods = 3; c.BreakerThreshold = 0.5 })
	h.addNode(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	s, _ := podcache.CNIPodTransform(judgetest.CNIPod("n1", true, -10*time.Minute))
	if err := h.inf.CNIPods.GetIndexer().Add(s); err != nil {
		t.Fatal(err)
	}
	var pods []*corev1.Pod
	for i := 0; i < 3; i++ {
		p := judgetest.Pod(judgetest.SandboxAt(-30*time.Second), judgetest.InitStatus(corev1.ContainerStatus{
			Name: annotations.InitContainerName, State: corev1.ContainerState{Terminated: judgetest.Terminated(88, -30*time.Second, -29*time.Second)},
		}))
		pods = append(pods, p)
		if err := h.sync(h.addPod(p)); err != nil {
			t.Fatal(err)
		}
	}
	if got := testutil.ToFloat64(h.metrics.BreakerOpenNodes); got != 1 {
		t.Fatalf("precondition: breaker open, gauge = %v", got)
	}
	h.c.recheckBreakers(context.Background())
	if got := testutil.ToFloat64(h.metrics.BreakerOpenNodes); got != 1 {
		t.Fatalf("re-check with the broken pods still there closed it: gauge = %v", got)
	}
	for _, p := range pods {
		if err := h.inf.Pods.GetIndexer().Delete(p); err != nil {
			t.Fatal(err)
		}
	}
	h.c.recheckBreakers(context.Background())
	if got := testutil.ToFloat64(h.metrics.BreakerOpenNodes); got != 0 {
		t.Fatalf("breaker still open after its pods were deleted: gauge = %v", got)
	}
	closed := 0
	for _, e := range h.events() {
		if strings.HasPrefix(e, "Normal "+EventRepairCircuitClosed) {
			closed++
		}
	}
	if closed != 1 {
		t.Fatalf("want one RepairCircuitClosed event, got %d", closed)
	}
}

// The state of a pod that left the cache without a delete event (replaced
// under the same name while the watch was down) is dropped by the sweep;
// the state of pods still cached is kept.
func TestForgetGonePods(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Action = judge.ActionLabel })
	h.addNode(readyNode("n1"))
	gone, kept := brokenB(), brokenB()
	for _, p := range []*corev1.Pod{gone, kept} {
		if err := h.sync(h.addPod(p)); err != nil {
			t.Fatal(err)
		}
	}
	replacement := gone.DeepCopy()
	replacement.UID = "uid-replacement"
	s, _ := cacheDefault(replacement)
	if err := h.inf.Pods.GetIndexer().Update(s); err != nil {
		t.Fatal(err)
	}
	h.c.forgetGonePods()
	h.c.mu.Lock()
	_, hasGone := h.c.state[gone.UID]
	_, hasKept := h.c.state[kept.UID]
	h.c.mu.Unlock()
	if hasGone || !hasKept {
		t.Fatalf("state after the sweep: replaced pod kept %v, cached pod kept %v", hasGone, hasKept)
	}
}

func TestStateMetrics(t *testing.T) {
	h := newHarness(t, nil)
	h.addNode(readyNode("n1"))
	h.addNode(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n2"}})
	h.addPod(brokenB())
	h.addPod(judgetest.Pod(judgetest.SandboxAt(-time.Hour)))
	h.addPod(judgetest.Pod(judgetest.WithStatus("complete"), judgetest.SandboxAt(-time.Hour)))
	h.addPod(judgetest.Pod(judgetest.WithStatus("complete"), judgetest.AppliedAt(-2*time.Hour), judgetest.SandboxAt(-time.Hour), judgetest.Restarted(-time.Hour-time.Minute)))
	h.addPod(judgetest.Pod(judgetest.WithStatus("complete"), judgetest.SandboxAt(-time.Hour), judgetest.InNamespace("quiet")))
	// not a transparent-proxy pod: its namespace is not reported
	h.addPod(judgetest.Pod(judgetest.WithoutAnnotation(annotations.KeyTransparentProxyStatus), judgetest.SandboxAt(-time.Hour), judgetest.InNamespace("plain")))
	const want = `
# HELP consul_cni_repair_broken_pods Injected pods currently detected as bypassing the CNI plugin, by namespace and reason; 0 for every namespace holding injected transparent-proxy pods, so the namespace label is bounded by the number of such namespaces.
# TYPE consul_cni_repair_broken_pods gauge
consul_cni_repair_broken_pods{namespace="app",reason="init_check_failed"} 1
consul_cni_repair_broken_pods{namespace="app",reason="sandbox_recreated"} 1
consul_cni_repair_broken_pods{namespace="app",reason="tproxy_status_stuck"} 1
consul_cni_repair_broken_pods{namespace="app",reason="verified_unredirected"} 0
consul_cni_repair_broken_pods{namespace="quiet",reason="init_check_failed"} 0
consul_cni_repair_broken_pods{namespace="quiet",reason="sandbox_recreated"} 0
consul_cni_repair_broken_pods{namespace="quiet",reason="tproxy_status_stuck"} 0
consul_cni_repair_broken_pods{namespace="quiet",reason="verified_unredirected"} 0
# HELP consul_cni_repair_nodes Nodes by CNI readiness as the configured gate sees it.
# TYPE consul_cni_repair_nodes gauge
consul_cni_repair_nodes{cni_ready="false"} 1
consul_cni_repair_nodes{cni_ready="true"} 1
`
	if err := testutil.GatherAndCompare(h.metrics.Registry, strings.NewReader(want), metrics.Prefix+"broken_pods", metrics.Prefix+"nodes"); err != nil {
		t.Fatal(err)
	}
	// Every documented metric name is registered.
	names := map[string]bool{}
	mfs, err := h.metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	h.metrics.Repairs.WithLabelValues("a", "evict", "x")
	h.metrics.RepairFailures.WithLabelValues("a", "evict", "x", "error")
	h.metrics.DryRunRepairs.WithLabelValues("a", "evict", "x")
	h.metrics.Skipped.WithLabelValues("x")
	h.metrics.Latency.WithLabelValues("evict")
	h.metrics.NodeReadinessChanges.WithLabelValues("label_added", "success")
	mfs, _ = h.metrics.Registry.Gather()
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	for _, n := range []string{"pod_repairs_total", "pod_repair_failures_total", "dry_run_pod_repairs_total", "dry_run", "broken_pods", "skipped_total", "detection_to_action_seconds", "circuit_breaker_open_nodes",
		"nodes", "node_readiness_changes_total", "leader", "build_info"} {
		if !names[metrics.Prefix+n] {
			t.Errorf("metric %s%s not registered", metrics.Prefix, n)
		}
	}
}

// The controller's own settings are checked, and the judgement's with them
// (judge.Config's own test covers each of those).
func TestConfigValidate(t *testing.T) {
	for name, mut := range map[string]func(*Config){
		"judgement":     func(c *Config) { c.Action = "kill" },
		"cni selector":  func(c *Config) { c.CNIPodSelector = "" },
		"rate":          func(c *Config) { c.MaxRepairsPerMinute = 0 },
		"taint key":     func(c *Config) { c.StartupTaintKey = "" },
		"taint effect":  func(c *Config) { c.StartupTaintEffect = "Sometimes" },
		"backoff order": func(c *Config) { c.BackoffMax = time.Millisecond },
	} {
		c := defaultConfig()
		mut(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		} else if ke := (*configkey.Error)(nil); !errors.As(err, &ke) || strings.Contains(err.Error(), "--") {
			t.Errorf("%s: error does not name the key: %v", name, err)
		} else if _, ok := reflect.TypeFor[Config]().FieldByName(ke.Keys()[0]); !ok {
			t.Errorf("%s: key %s is not a Config field: %v", name, ke.Keys()[0], err)
		}
	}
	c := defaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	// Without node readiness nor the cni-pod gate nothing reads CNI pods.
	c.NodeReadiness, c.CNIPodSelector = false, ""
	if err := c.Validate(); err != nil {
		t.Fatalf("CNI pod selector checked although nothing reads CNI pods: %v", err)
	}
}

// The breaker judges pods by their latest sandbox: pods first started
// before the CNI became ready whose sandbox was recreated since, and are
// broken, count against it.
func TestBreakerCountsLatestSandboxes(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Gate = judge.GateCNIPod; c.BreakerMinPods = 3; c.BreakerThreshold = 0.5 })
	h.addNode(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	s, _ := podcache.CNIPodTransform(judgetest.CNIPod("n1", true, -4*time.Minute))
	if err := h.inf.CNIPods.GetIndexer().Add(s); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for i := 0; i < 3; i++ {
		keys = append(keys, h.addPod(brokenB(judgetest.StartedApp(-5*time.Minute))))
	}
	for _, k := range keys {
		if err := h.sync(k); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(h.mutations()); n != 0 {
		t.Fatalf("breaker did not count the recreated sandboxes: %d actions", n)
	}
	if got := testutil.ToFloat64(h.metrics.BreakerOpenNodes); got != 1 {
		t.Fatalf("open nodes gauge = %v", got)
	}
}

// Finished pods (Succeeded, or Failed for another reason than the check) are
// neither acted on nor counted by the breaker nor by broken_pods.
func TestFinishedPodsAreNeverBroken(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Gate = judge.GateCNIPod
		c.BreakerMinPods = 3
		c.BreakerThreshold = 0.5
		c.AllowBarePods = true
	})
	h.addNode(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	s, _ := podcache.CNIPodTransform(judgetest.CNIPod("n1", true, -time.Minute))
	if err := h.inf.CNIPods.GetIndexer().Add(s); err != nil {
		t.Fatal(err)
	}
	finished := []*corev1.Pod{
		judgetest.Pod(judgetest.SandboxAt(-30*time.Second), judgetest.InPhase(corev1.PodSucceeded)),
		judgetest.Pod(judgetest.SandboxAt(-30*time.Second), judgetest.InPhase(corev1.PodSucceeded), judgetest.Bare()),
		judgetest.Pod(judgetest.SandboxAt(-30*time.Second), judgetest.InPhase(corev1.PodFailed)),
		judgetest.Pod(judgetest.WithStatus("complete"), judgetest.AppliedAt(-time.Hour), judgetest.SandboxAt(-30*time.Second), judgetest.InPhase(corev1.PodFailed)),
	}
	var keys []string
	for _, p := range finished {
		keys = append(keys, h.addPod(p))
	}
	broken := h.addPod(brokenB())
	for _, k := range append(keys, broken) {
		if err := h.sync(k); err != nil {
			t.Fatal(err)
		}
	}
	acts := h.mutations()
	if len(acts) != 1 || acts[0].GetSubresource() != "eviction" {
		t.Fatalf("want only the check-failed pod evicted, got %v", acts)
	}
	if got := testutil.ToFloat64(h.metrics.BreakerOpenNodes); got != 0 {
		t.Fatalf("finished pods opened the breaker: gauge = %v", got)
	}
	const want = `
# HELP consul_cni_repair_broken_pods Injected pods currently detected as bypassing the CNI plugin, by namespace and reason; 0 for every namespace holding injected transparent-proxy pods, so the namespace label is bounded by the number of such namespaces.
# TYPE consul_cni_repair_broken_pods gauge
consul_cni_repair_broken_pods{namespace="app",reason="init_check_failed"} 1
consul_cni_repair_broken_pods{namespace="app",reason="sandbox_recreated"} 0
consul_cni_repair_broken_pods{namespace="app",reason="tproxy_status_stuck"} 0
consul_cni_repair_broken_pods{namespace="app",reason="verified_unredirected"} 0
`
	if err := testutil.GatherAndCompare(h.metrics.Registry, strings.NewReader(want), metrics.Prefix+"broken_pods"); err != nil {
		t.Fatal(err)
	}
}

// A complete pod whose sandbox was recreated after cni-applied-at is evicted
// with its own reason, Event text and metric label.
func TestSandboxRecreatedIsRepaired(t *testing.T) {
	h := newHarness(t, nil)
	h.addNode(readyNode("n1"))
	key := h.addPod(judgetest.Pod(judgetest.WithStatus("complete"), judgetest.AppliedAt(-2*time.Hour), judgetest.SandboxAt(-time.Minute), judgetest.Restarted(-2*time.Minute)))
	if err := h.sync(key); err != nil {
		t.Fatal(err)
	}
	if acts := h.mutations(); len(acts) != 1 || acts[0].GetSubresource() != "eviction" {
		t.Fatalf("want one eviction, got %v", acts)
	}
	if got := repaired(h.metrics, "evict", metrics.ResultSuccess, judge.ReasonSandboxRecreated, "false"); got != 1 {
		t.Fatalf("repaired{reason=sandbox_recreated} = %v", got)
	}
	ev := h.events()
	if len(ev) != 1 || !strings.Contains(ev[0], "sandbox was recreated") || !strings.Contains(ev[0], annotations.KeyCNIAppliedAt) {
		t.Fatalf("events: %q", ev)
	}
}

// The node-label gate dates readiness by the node's cni-ready-since
// annotation, so the breaker's baseline is the same in every process that
// reads it (a restart, a failover): pods whose sandbox is newer than it and
// that are broken open the breaker in each of them.
func TestBreakerBaselineSurvivesRestart(t *testing.T) {
	node := readyNode("n1")
	node.Annotations = map[string]string{annotations.AnnotationCNIReadySince: annotations.FormatTime(judgetest.T0.Add(-10 * time.Minute))}
	for _, process := range []string{"first", "restarted"} {
		t.Run(process, func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.BreakerMinPods = 3; c.BreakerThreshold = 0.5 })
			h.addNode(node)
			if open, since := h.c.gate.Open("n1"); !open || !since.Equal(judgetest.T0.Add(-10*time.Minute)) {
				t.Fatalf("gate: open %v since %s, want since the annotation", open, since)
			}
			var keys []string
			for i := 0; i < 3; i++ {
				keys = append(keys, h.addPod(brokenB(func(p *corev1.Pod) { p.Status.Conditions[0].LastTransitionTime = judgetest.At(-5 * time.Minute) })))
			}
			for _, k := range keys {
				if err := h.sync(k); err != nil {
					t.Fatal(err)
				}
			}
			if n := len(h.mutations()); n != 0 {
				t.Fatalf("%d actions: the breaker did not count pods newer than the persisted baseline", n)
			}
			if got := testutil.ToFloat64(h.metrics.BreakerOpenNodes); got != 1 {
				t.Fatalf("open nodes gauge = %v", got)
			}
		})
	}
}

// In a dry run node readiness labels nothing, so the node-label gate also
// opens where it would have labelled the node (a Ready CNI pod on it):
// the audit still reports the pods it would repair.
func TestDryRunGateOpensWhereTheLabelWouldBe(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.DryRun = true })
	h.addNode(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	h.addNode(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n2"}})
	s, _ := podcache.CNIPodTransform(judgetest.CNIPod("n1", true, -time.Minute))
	if err := h.inf.CNIPods.GetIndexer().Add(s); err != nil {
		t.Fatal(err)
	}
	for _, node := range []string{"n1", "n2"} {
		if err := h.sync(h.addPod(brokenB(judgetest.OnNode(node)))); err != nil {
			t.Fatal(err)
		}
	}
	evs := h.events()
	if len(evs) != 1 || !strings.HasPrefix(evs[0], "Normal "+EventWouldRepair) {
		t.Fatalf("events %q: want one WouldRepair (n1)", evs)
	}
	if got := skipped(h.metrics, metrics.SkipGateClosed); got != 1 {
		t.Fatalf("gate_closed = %v (n2 has no Ready CNI pod)", got)
	}
	if m := h.mutations(); len(m) != 0 {
		t.Fatalf("dry run mutated: %v", m)
	}
}

// A node reboot the controller did not see (it runs on that node and comes
// back after the CNI pod is Ready again): the node kept its label and its
// old cni-ready-since, every pod's sandbox was recreated before consul-cni
// was chained again (sandbox_recreated). The CNI was not continuously ready
// since the annotation: the gate dates readiness by the CNI pod, whose
// installer container started again (also when the kubelet never reported
// it not Ready; a later Ready transition alone is a readiness flap, which
// moves nothing: TestBreakerCountsAfterAShortFlap), so those pods are the
// race, the breaker stays closed and every one is repaired. So are pods the kubelet dated just after the CNI was back
// (within the sandbox slack): their sandboxes were made while the installer
// was starting, and only reported later. Pods whose sandbox was dated a
// whole slack after the CNI was back and that still bypass it open the
// breaker as before.
func TestBreakerAfterUnseenReboot(t *testing.T) {
	const pods = 10
	oldSince := annotations.FormatTime(judgetest.T0.Add(-time.Hour))
	back := -5 * time.Minute // the CNI pod is back (Ready, or its container started)
	cases := []struct {
		name     string
		gate     judge.GateMode
		restart  func(p *corev1.Pod) // how the CNI pod shows the restart
		sandbox  time.Duration       // the pods' recreated sandboxes
		repaired int
		open     float64
	}{
		{"node-label, container start and Ready transition", judge.GateNodeLabel, restartedReadyAt(back), back - 10*time.Second, pods, 0},
		{"node-label, container start", judge.GateNodeLabel, judgetest.RunningSince(back), back - 10*time.Second, pods, 0},
		{"cni-pod, container start", judge.GateCNIPod, judgetest.RunningSince(back), back - 10*time.Second, pods, 0},
		{"node-label, sandboxes dated just after the CNI was back", judge.GateNodeLabel, restartedReadyAt(back), back + 3*time.Second, pods, 0},
		{"cni-pod, sandboxes dated within the slack after the CNI was back", judge.GateCNIPod, judgetest.RunningSince(back), back + judge.DefaultConfig().SandboxSlack - time.Second, pods, 0},
		{"node-label, sandboxes a slack after the CNI was back", judge.GateNodeLabel, restartedReadyAt(back), back + judge.DefaultConfig().SandboxSlack, 0, 1},
		{"cni-pod, sandboxes after the CNI was back", judge.GateCNIPod, judgetest.RunningSince(back), -10 * time.Second, 0, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.Gate = tc.gate; c.NodeReadiness = true })
			node := readyNode("n1")
			node.Annotations = map[string]string{annotations.AnnotationCNIReadySince: oldSince}
			h.addNode(node)
			cni := judgetest.CNIPod("n1", true, -2*time.Hour)
			tc.restart(cni)
			s, _ := podcache.CNIPodTransform(cni)
			if err := h.inf.CNIPods.GetIndexer().Add(s); err != nil {
				t.Fatal(err)
			}
			var keys []string
			for i := 0; i < pods; i++ {
				keys = append(keys, h.addPod(judgetest.Pod(judgetest.WithStatus(annotations.TProxyStatusComplete), judgetest.AppliedAt(-2*time.Hour), judgetest.SandboxAt(tc.sandbox), judgetest.Lost())))
			}
			for _, k := range keys {
				if err := h.sync(k); err != nil {
					t.Fatal(err)
				}
			}
			if got := repaired(h.metrics, "evict", metrics.ResultSuccess, judge.ReasonSandboxRecreated, "false"); got != float64(tc.repaired) {
				t.Fatalf("%v of %d pods repaired, want %d", got, pods, tc.repaired)
			}
			if got := testutil.ToFloat64(h.metrics.BreakerOpenNodes); got != tc.open {
				t.Fatalf("open nodes gauge = %v, want %v", got, tc.open)
			}
		})
	}
}

// restartedReadyAt is a CNI pod whose installer container started again 2 s
// before its Ready transition at T0+d, as after a node reboot.
func restartedReadyAt(d time.Duration) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		judgetest.RunningSince(d - 2*time.Second)(p)
		judgetest.ReadyAt(d)(p)
	}
}
