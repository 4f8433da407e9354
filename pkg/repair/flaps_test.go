package repair

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge/judgetest"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/podcache"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
)

// A misconfigured node whose installer readiness flaps dates its CNI
// readiness again at each flap, so every broken pod there is older than it
// (of the race, not counted by the breaker). The actions taken under a later
// readiness than the first are counted instead: the breaker opens after the
// first readiness's actions plus --breaker-min-pods.
func TestFlappingNodeOpensTheBreaker(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.BreakerMinPods = 3 })
	h.addNode(nodeReadySinceAt("n1", -5*time.Minute))
	sync := func(keys []string) {
		for _, k := range keys {
			if err := h.sync(k); err != nil {
				t.Fatal(err)
			}
		}
	}
	var first []string
	for i := 0; i < 2; i++ {
		first = append(first, h.addPod(brokenWithSandbox(-6*time.Minute)))
	}
	sync(first)
	if n := len(h.mutations()); n != 2 {
		t.Fatalf("%d actions under the first readiness, want 2", n)
	}
	// Each flap: readiness dated again, the replacements broken again and
	// older than it.
	for flap := 1; flap <= 4; flap++ {
		h.now = judgetest.T0.Add(time.Duration(flap) * time.Minute)
		h.addNode(nodeReadySinceAt("n1", time.Duration(flap)*time.Minute-time.Second))
		var keys []string
		for i := 0; i < 2; i++ {
			keys = append(keys, h.addPod(brokenWithSandbox(time.Duration(flap)*time.Minute-2*time.Second)))
		}
		sync(keys)
	}
	if n := len(h.mutations()); n != 2+3 {
		t.Fatalf("%d actions on the flapping node, want 5 (2 under its first readiness, then --breaker-min-pods)", n)
	}
	if got := testutil.ToFloat64(h.metrics.BreakerOpenNodes); got != 1 {
		t.Fatalf("open nodes gauge = %v, want 1", got)
	}
	// Once those actions leave the window, repairs resume.
	h.now = h.now.Add(flapWindow)
	key := h.addPod(brokenWithSandbox(4*time.Minute - 2*time.Second))
	sync([]string{key})
	if n := len(h.mutations()); n != 6 {
		t.Fatalf("%d actions after the window, want 6", n)
	}
}

// A node whose readiness is dated once (the race, or a reboot long after
// the last repairs there) is repaired without limit by the breaker.
func TestNodeDatedOnceIsNotFlapping(t *testing.T) {
	a := newNodeActions()
	now := judgetest.T0
	since := now.Add(-time.Minute)
	for i := 0; i < 10; i++ {
		a.record("n1", "", false, since, now)
	}
	if n := a.redated("n1", now); n != 0 {
		t.Fatalf("redated = %d for one readiness", n)
	}
	later := now.Add(flapWindow)
	a.record("n1", "", false, later.Add(-time.Second), later)
	if n := a.redated("n1", later); n != 0 {
		t.Fatalf("redated = %d for a readiness dated again after the window", n)
	}
}

// After a short readiness flap of a running installer the node keeps its
// cni-ready-since (node readiness keeps the annotation, the gate does not
// move it by the later Ready transition): pods broken since that baseline
// are counted by the breaker, which opens, instead of being taken by the
// race lane at the cluster-wide cap. A restart of the installer (a node
// reboot) is a new baseline: the same pods are then the race.
func TestBreakerCountsAfterAShortFlap(t *testing.T) {
	const pods = 10
	cases := []struct {
		name    string
		cni     func(*corev1.Pod)
		actions int
		open    float64
	}{
		{"after a 5 s readiness flap the breaker counts them", func(p *corev1.Pod) {
			judgetest.RunningSince(-2 * time.Hour)(p)
			judgetest.ReadyAt(-20 * time.Second)(p) // not Ready from -25 s to -20 s
		}, 0, 1},
		{"after a restart of the installer they are the race", restartedReadyAt(-20 * time.Second), pods, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(c *Config) { defaultLimits(c); c.Gate = judge.GateNodeLabel; c.NodeReadiness = true })
			h.addNode(nodeReadySinceAt("n1", -10*time.Minute))
			cni := judgetest.CNIPod("n1", true, -2*time.Hour)
			tc.cni(cni)
			s, _ := podcache.CNIPodTransform(cni)
			if err := h.inf.CNIPods.GetIndexer().Add(s); err != nil {
				t.Fatal(err)
			}
			var keys []string
			for i := 0; i < pods; i++ {
				// Broken since the baseline, before the flap: replacements
				// of earlier repairs on a misconfigured node.
				keys = append(keys, h.addPod(brokenWithSandbox(-3*time.Minute)))
			}
			for _, k := range keys {
				if err := h.sync(k); err != nil {
					t.Fatal(err)
				}
			}
			if n := len(h.mutations()); n != tc.actions {
				t.Fatalf("%d actions, want %d", n, tc.actions)
			}
			if got := testutil.ToFloat64(h.metrics.BreakerOpenNodes); got != tc.open {
				t.Fatalf("open nodes gauge = %v, want %v", got, tc.open)
			}
		})
	}
}

// On a misconfigured node whose pods break one at a time, each acted on
// before the next breaks, the breaker never sees --breaker-min-pods broken
// at once: the counted pods it acted on stay counted as broken in the
// window, so the breaker opens on the --breaker-min-pods-th broken pod,
// after one action fewer. A pod acted on and still there (labelled) is
// counted once.
func TestPodsBreakingOneAtATimeOpenTheBreaker(t *testing.T) {
	for _, tc := range []struct {
		name    string
		action  judge.Action
		gone    bool // the action removes the pod from the cache
		actions int
	}{
		{"evicted pods stay counted", judge.ActionEvict, true, 2},
		{"labelled pods are counted once", judge.ActionLabel, false, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.BreakerMinPods = 3; c.Action = tc.action })
			h.addNode(nodeReadySinceAt("n1", -10*time.Minute))
			for i := 0; i < 6; i++ {
				key := h.addPod(brokenWithSandbox(-3 * time.Minute))
				if err := h.sync(key); err != nil {
					t.Fatal(err)
				}
				if obj, ok, _ := h.inf.Pods.GetIndexer().GetByKey(key); ok && tc.gone {
					if err := h.inf.Pods.GetIndexer().Delete(obj); err != nil {
						t.Fatal(err)
					}
				}
			}
			if n := len(h.mutations()); n != tc.actions {
				t.Fatalf("%d actions, want %d (--breaker-min-pods less one)", n, tc.actions)
			}
			if got := testutil.ToFloat64(h.metrics.BreakerOpenNodes); got != 1 {
				t.Fatalf("open nodes gauge = %v, want 1", got)
			}
		})
	}
}

// Under the cni-pod gate, a not-ready spell of the installer that outlasts
// judge.FlapBound with no CNI pod event in it still drops the node's
// baseline: the controller looks again when the gate says the spell reaches
// the bound. A controller that has stopped cancels that look.
func TestCNIPodGateLooksAgainWhenASpellReachesTheBound(t *testing.T) {
	for _, stop := range []bool{false, true} {
		name := map[bool]string{false: "a running controller looks and the baseline is dropped", true: "a stopped controller does not look"}[stop]
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.Gate = judge.GateCNIPod })
			// The gate measures spells on the wall clock: pod times are
			// set relative to now.
			at := func(off time.Duration) time.Duration { return time.Since(judgetest.T0) + off }
			started := judgetest.RunningSince(at(-time.Hour - time.Minute))
			cni := func(ready bool, since time.Duration) *corev1.Pod {
				p := judgetest.CNIPod("n1", ready, since, started)
				s, _ := podcache.CNIPodTransform(p)
				if err := h.inf.CNIPods.GetIndexer().Update(s); err != nil {
					t.Fatal(err)
				}
				return p
			}
			h.c.cniPodChanged(cni(true, at(-time.Hour)))
			open, baseline := h.c.gate.Open("n1")
			if !open {
				t.Fatal("precondition: the gate is closed with the installer Ready")
			}
			lead := 300 * time.Millisecond
			h.c.cniPodChanged(cni(false, at(-judge.FlapBound+lead)))
			if stop {
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				if err := h.c.Run(ctx); err != nil {
					t.Fatal(err)
				}
				time.Sleep(lead + time.Second)
			} else {
				poll.Eventually(t, 10*time.Second, "the look at the bound", func() (bool, error) {
					h.c.mu.Lock()
					defer h.c.mu.Unlock()
					return h.c.cniLook["n1"] == nil, nil
				})
			}
			// Ready again, and no event of it reached the controller.
			back := cni(true, at(0))
			_, since := h.c.gate.Open("n1")
			want := baseline
			if !stop {
				want = back.Status.Conditions[0].LastTransitionTime.Time
			}
			if !since.Equal(want) {
				t.Fatalf("ready since %s, want %s (baseline %s)", since.Format(time.RFC3339Nano), want.Format(time.RFC3339Nano), baseline.Format(time.RFC3339Nano))
			}
		})
	}
}
