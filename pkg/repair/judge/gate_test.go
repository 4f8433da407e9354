package judge_test

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge/judgetest"
)

// cniStep is one look of the cni-pod gate at node n1 at T0+at: the CNI pod
// as it is then (nil: none), and whether the gate's memory is lost first
// (the controller restarted).
type cniStep struct {
	at       time.Duration
	pod      *corev1.Pod
	restart  bool
	wantOpen bool
}

// installer is the node's CNI pod, its container running since T0+started:
// Ready since T0+ready, or, with ready false, not Ready since then.
func installer(started, ready time.Duration, isReady bool) *corev1.Pod {
	return judgetest.CNIPod("n1", isReady, ready, judgetest.RunningSince(started))
}

// firstReady is a node whose installer was created at T0-10m-5s and Ready at
// T0-10m while the gate looked: its baseline, dated by its readiness.
func firstReady() []cniStep {
	pending := judgetest.CNIPod("n1", false, -10*time.Minute-5*time.Second)
	pending.Status.Phase = corev1.PodPending
	return []cniStep{
		{at: -10*time.Minute - 5*time.Second, pod: pending},
		{at: -10 * time.Minute, pod: installer(-10*time.Minute-3*time.Second, -10*time.Minute, true), wantOpen: true},
	}
}

var baseline = judgetest.T0.Add(-10 * time.Minute)

// runCNIGate plays steps on a cni-pod gate and returns the gate and its
// "since" at the last step.
func runCNIGate(t *testing.T, steps []cniStep) (judge.Gate, time.Time) {
	t.Helper()
	pods := cache.NewIndexer(cache.MetaNamespaceKeyFunc, judge.PodNodeIndexers())
	var g judge.Gate
	var now time.Time
	newGate := func() {
		g = judge.NewGate(judge.GateCNIPod, nil, pods, judgetest.T0.Add(-time.Hour), false)
		judge.SetGateClock(g, func() time.Time { return now })
	}
	newGate()
	var since time.Time
	for i, s := range steps {
		now = judgetest.T0.Add(s.at)
		for _, o := range pods.List() {
			if err := pods.Delete(o); err != nil {
				t.Fatal(err)
			}
		}
		if s.pod != nil {
			if err := pods.Add(s.pod); err != nil {
				t.Fatal(err)
			}
		}
		if s.restart {
			newGate()
		}
		var open bool
		open, since = g.Open("n1")
		if open != s.wantOpen {
			t.Fatalf("step %d (T0%+v): open %v, want %v", i, s.at, open, s.wantOpen)
		}
	}
	return g, since
}

// Under the cni-pod gate a readiness flap of a running installer keeps the
// node's baseline, as node readiness keeps cni-ready-since: a not-ready
// spell shorter than FlapBound moves nothing, one the gate saw last
// FlapBound dates a new baseline, a container restart moves it however
// short the spell. A controller restart falls back to the installer's
// container start, never later than what the memory held.
func TestCNIPodGateKeepsItsBaselineOverFlaps(t *testing.T) {
	started := -10*time.Minute - 3*time.Second
	bound := judge.FlapBound
	cases := []struct {
		name  string
		steps []cniStep
		want  time.Time
	}{
		{"a 10 s flap keeps the baseline", []cniStep{
			{at: 0, pod: installer(started, 0, false)},
			{at: 10 * time.Second, pod: installer(started, 10*time.Second, true), wantOpen: true},
		}, baseline},
		{"a flap just under the bound keeps the baseline", []cniStep{
			{at: time.Second, pod: installer(started, 0, false)},
			{at: bound - time.Second, pod: installer(started, 0, false)},
			{at: bound - time.Second, pod: installer(started, bound-time.Second, true), wantOpen: true},
		}, baseline},
		{"a flap the gate never saw keeps the baseline", []cniStep{
			{at: 10 * time.Second, pod: installer(started, 10*time.Second, true), wantOpen: true},
		}, baseline},
		{"a spell the gate saw last the bound dates a new baseline", []cniStep{
			{at: time.Second, pod: installer(started, 0, false)},
			{at: bound, pod: installer(started, 0, false)},
			{at: 45 * time.Second, pod: installer(started, 45*time.Second, true), wantOpen: true},
		}, judgetest.T0.Add(45 * time.Second)},
		{"a long spell first seen after the bound dates a new baseline", []cniStep{
			{at: 40 * time.Second, pod: installer(started, 0, false)},
			{at: 45 * time.Second, pod: installer(started, 45*time.Second, true), wantOpen: true},
		}, judgetest.T0.Add(45 * time.Second)},
		{"a long spell the gate never looked at past the bound keeps the baseline", []cniStep{
			{at: time.Second, pod: installer(started, 0, false)},
			{at: 45 * time.Second, pod: installer(started, 45*time.Second, true), wantOpen: true},
		}, baseline},
		{"a 5 s spell ending in a restart of the installer moves it", []cniStep{
			{at: time.Second, pod: installer(started, 0, false)},
			{at: 5 * time.Second, pod: installer(4*time.Second, 5*time.Second, true), wantOpen: true},
		}, judgetest.T0.Add(5 * time.Second)},
		{"a restart the kubelet never reported not Ready moves it", []cniStep{
			{at: 5 * time.Second, pod: installer(4*time.Second, -10*time.Minute, true), wantOpen: true},
		}, judgetest.T0.Add(4 * time.Second)},
		{"an installer gone and back dates a new baseline", []cniStep{
			{at: time.Second},
			{at: 5 * time.Second, pod: installer(3*time.Second, 5*time.Second, true), wantOpen: true},
		}, judgetest.T0.Add(5 * time.Second)},
		{"a controller restart after a flap falls back to the installer's container start", []cniStep{
			{at: 0, pod: installer(started, 0, false)},
			{at: 10 * time.Second, pod: installer(started, 10*time.Second, true), restart: true, wantOpen: true},
		}, judgetest.T0.Add(started)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, since := runCNIGate(t, append(firstReady(), tc.steps...))
			if !since.Equal(tc.want) {
				t.Fatalf("ready since %s, want %s", since.Format(time.RFC3339), tc.want.Format(time.RFC3339))
			}
		})
	}
}

// After a short readiness flap under the cni-pod gate, a pod broken since
// the baseline (its sandbox made 5 minutes after it, more than the sandbox
// slack) is counted by the node's breaker and is not of the race; after a
// restart of the installer it is of the race and not counted.
func TestCNIPodGateBreakerCountsTheFlappingNodesPods(t *testing.T) {
	started := -10*time.Minute - 3*time.Second
	d := judgetest.Detector()
	cases := []struct {
		name          string
		back          *corev1.Pod
		counted, race bool
	}{
		{"after a 10 s flap the breaker counts it", installer(started, 10*time.Second, true), true, false},
		{"after a restart of the installer it is of the race", installer(9*time.Second, 10*time.Second, true), false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g, since := runCNIGate(t, append(firstReady(),
				cniStep{at: 0, pod: installer(started, 0, false)},
				cniStep{at: 10 * time.Second, pod: tc.back, wantOpen: true}))
			pod := judgetest.Pod(judgetest.WithStatus(annotations.TProxyStatusComplete), judgetest.AppliedAt(-2*time.Hour),
				judgetest.SandboxAt(-5*time.Minute), judgetest.Lost())
			if !d.Detect(pod, judgetest.T0.Add(10*time.Second)).Broken {
				t.Fatal("precondition: the pod is not broken")
			}
			if got := d.CountedByBreaker(pod, since); got != tc.counted {
				t.Errorf("counted by the breaker %v, want %v (ready since %s)", got, tc.counted, since.Format(time.RFC3339))
			}
			if got := d.OfTheRace(g, pod, since); got != tc.race {
				t.Errorf("of the race %v, want %v (ready since %s)", got, tc.race, since.Format(time.RFC3339))
			}
		})
	}
}

// ObserveCNI, called on the CNI pod's events, says when a not-ready spell
// reaches FlapBound, so that the controller looks again then: a spell that
// outlasts the bound with no event in it still dates a new baseline.
func TestCNIPodGateSaysWhenASpellReachesTheBound(t *testing.T) {
	started := -10*time.Minute - 3*time.Second
	pods := cache.NewIndexer(cache.MetaNamespaceKeyFunc, judge.PodNodeIndexers())
	g := judge.NewGate(judge.GateCNIPod, nil, pods, judgetest.T0.Add(-time.Hour), false)
	now := judgetest.T0
	judge.SetGateClock(g, func() time.Time { return now })
	set := func(p *corev1.Pod) {
		t.Helper()
		if err := pods.Update(p); err != nil {
			t.Fatal(err)
		}
	}
	set(installer(started, -10*time.Minute, true))
	if again := g.ObserveCNI("n1"); again != 0 {
		t.Fatalf("Ready: look again in %s, want never", again)
	}
	set(installer(started, 0, false))
	now = judgetest.T0.Add(10 * time.Second)
	if again := g.ObserveCNI("n1"); again != judge.FlapBound-10*time.Second {
		t.Fatalf("10 s into the spell: look again in %s, want %s", again, judge.FlapBound-10*time.Second)
	}
	now = judgetest.T0.Add(judge.FlapBound)
	if again := g.ObserveCNI("n1"); again != 0 {
		t.Fatalf("at the bound: look again in %s, want never", again)
	}
	now = judgetest.T0.Add(45 * time.Second)
	set(installer(started, 45*time.Second, true))
	if _, since := g.Open("n1"); !since.Equal(now) {
		t.Fatalf("ready since %s after a spell seen at the bound, want %s", since.Format(time.RFC3339), now.Format(time.RFC3339))
	}
}
