package repair

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge/judgetest"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/metrics"
)

// verifiedNode is a ready node whose verifier reported at T0+heartbeat.
func verifiedNode(name string, heartbeat time.Duration) *corev1.Node {
	n := readyNode(name)
	n.Status.Conditions = []corev1.NodeCondition{{Type: annotations.NodeConditionCNIVerified, Status: corev1.ConditionFalse,
		Reason: annotations.ReasonPodsUnredirected, LastHeartbeatTime: judgetest.At(heartbeat), Message: "1 without"}}
	return n
}

func TestAPodVerifiedWithoutRulesIsEvictedAtOnceWithItsOwnReason(t *testing.T) {
	h := newHarness(t, nil)
	h.addNode(verifiedNode("n1", -30*time.Second))
	// Meshed by every timing: only the verifier knows.
	key := h.addPod(judgetest.Pod(judgetest.WithStatus("complete"), judgetest.AppliedAt(-time.Hour), judgetest.SandboxAt(-time.Hour),
		judgetest.Verified(corev1.ConditionFalse, annotations.ReasonRulesMissing, -2*time.Second)))
	if err := h.sync(key); err != nil {
		t.Fatal(err)
	}
	if acts := h.mutations(); len(acts) != 1 || acts[0].GetSubresource() != "eviction" {
		t.Fatalf("want one eviction, got %v", acts)
	}
	if got := repaired(h.metrics, "evict", metrics.ResultSuccess, judge.ReasonVerifiedUnredirected, "false"); got != 1 {
		t.Fatalf("repaired{reason=verified_unredirected} = %v", got)
	}
	ev := h.events()
	if len(ev) != 1 || !strings.Contains(ev[0], "node verifier found no Consul redirect rules") || !strings.Contains(ev[0], annotations.ReasonRulesMissing) {
		t.Fatalf("events: %q", ev)
	}
}

func TestAPodVerifiedWithRulesIsNeverActedOnByATimingSignal(t *testing.T) {
	h := newHarness(t, nil)
	h.addNode(verifiedNode("n1", -30*time.Second))
	// Signal C by timing and a container of an earlier sandbox, but the
	// verifier saw the rules.
	key := h.addPod(judgetest.Pod(judgetest.WithStatus("complete"), judgetest.AppliedAt(-2*time.Hour), judgetest.SandboxAt(-time.Minute), judgetest.Restarted(-2*time.Minute),
		judgetest.Verified(corev1.ConditionTrue, annotations.ReasonRulesInPlace, -2*time.Hour)))
	if err := h.sync(key); err != nil {
		t.Fatal(err)
	}
	if acts := h.mutations(); len(acts) != 0 {
		t.Fatalf("want no action, got %v", acts)
	}
}

// A verifier that stops reporting leaves its last word behind: it is no
// evidence any more, and the node's pods are judged again by the signals
// (recheckVerifiers requeues them).
func TestAStaleVerifierNeitherActsNorProtects(t *testing.T) {
	h := newHarness(t, nil)
	h.addNode(verifiedNode("n1", -30*time.Second))
	key := h.addPod(judgetest.Pod(judgetest.WithStatus("complete"), judgetest.AppliedAt(-2*time.Hour), judgetest.SandboxAt(-time.Minute), judgetest.Restarted(-2*time.Minute),
		judgetest.Verified(corev1.ConditionTrue, annotations.ReasonRulesInPlace, -2*time.Hour)))
	meshed := h.addPod(judgetest.Pod(judgetest.WithStatus("complete"), judgetest.AppliedAt(-time.Hour), judgetest.SandboxAt(-time.Hour),
		judgetest.Verified(corev1.ConditionFalse, annotations.ReasonRulesMissing, -2*time.Second)))
	h.c.recheckVerifiers()
	for h.c.queue.Len() > 0 {
		k, _ := h.c.queue.Get()
		h.c.queue.Done(k)
	}
	h.now = judgetest.T0.Add(annotations.NodeConditionStaleAfter)
	h.c.recheckVerifiers()
	if n := h.c.queue.Len(); n != 2 {
		t.Fatalf("%d pods requeued when the verifier went stale, want 2", n)
	}
	for _, k := range []string{key, meshed} {
		if err := h.sync(k); err != nil {
			t.Fatal(err)
		}
	}
	acts := h.mutations()
	if len(acts) != 1 || acts[0].GetSubresource() != "eviction" {
		t.Fatalf("want one eviction (signal C), got %v", acts)
	}
	if got := repaired(h.metrics, "evict", metrics.ResultSuccess, judge.ReasonSandboxRecreated, "false"); got != 1 {
		t.Fatalf("repaired{reason=sandbox_recreated} = %v", got)
	}
	if got := repaired(h.metrics, "evict", metrics.ResultSuccess, judge.ReasonVerifiedUnredirected, "false"); got != 0 {
		t.Fatalf("repaired{reason=verified_unredirected} = %v after the verifier went stale", got)
	}
}
