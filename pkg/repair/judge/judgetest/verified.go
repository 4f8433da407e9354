package judgetest

import (
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
)

// Verified adds the node verifier's pod condition with status, reason and
// probe time T0+d.
func Verified(status corev1.ConditionStatus, reason string, d time.Duration) PodOpt {
	return func(p *corev1.Pod) {
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{
			Type: annotations.ConditionRedirectVerified, Status: status, Reason: reason,
			Message: "sandbox 0123456789abc", LastProbeTime: At(d), LastTransitionTime: At(d),
		})
	}
}

// Heartbeats is a judge.VerifierHeartbeat of fixed nodes: each node's
// verifier reported at T0+d.
func Heartbeats(nodes map[string]time.Duration) judge.VerifierHeartbeat {
	return func(node string) (time.Time, bool) {
		d, ok := nodes[node]
		if !ok {
			return time.Time{}, false
		}
		return T0.Add(d), true
	}
}

// VerifiedCase is a pod of the verified-evidence matrix and the verdict
// expected at T0 of Detector with Heartbeat (nil: no verifier consulted).
type VerifiedCase struct {
	Name      string
	Pod       *corev1.Pod
	Heartbeat judge.VerifierHeartbeat
	Broken    bool
	Reason    judge.Reason
	Since     time.Time
	Evidence  judge.Evidence
}

// VerifiedMatrix returns the rows of the node verifier's evidence: where a
// verifier reports for node n1 (heartbeat 30 s ago) its condition decides,
// True against every timing signal, False for the current sandbox at once;
// elsewhere, or when its word is stale, the signals judge.
func VerifiedMatrix() []VerifiedCase {
	fresh := Heartbeats(map[string]time.Duration{"n1": -30 * time.Second})
	stale := Heartbeats(map[string]time.Duration{"n1": -annotations.NodeConditionStaleAfter - time.Second})
	otherNode := Heartbeats(map[string]time.Duration{"n2": -30 * time.Second})
	missing := Verified(corev1.ConditionFalse, annotations.ReasonRulesMissing, -20*time.Second)
	inPlace := Verified(corev1.ConditionTrue, annotations.ReasonRulesInPlace, -20*time.Second)
	// meshed: complete, rules applied with the sandbox an hour ago.
	meshed := []PodOpt{WithStatus(annotations.TProxyStatusComplete), AppliedAt(-time.Hour), SandboxAt(-time.Hour)}
	// recreated: complete, but the sandbox came 10 min after the rules and
	// the app container ran in an earlier one (signal C).
	recreated := []PodOpt{WithStatus(annotations.TProxyStatusComplete), AppliedAt(-time.Hour), SandboxAt(-50 * time.Minute), Restarted(-51 * time.Minute)}
	with := func(base []PodOpt, more ...PodOpt) *corev1.Pod {
		return Pod(append(append([]PodOpt{}, base...), more...)...)
	}
	// unredirected is a row broken by the verifier's False probed 20 s ago.
	unredirected := func(c VerifiedCase) VerifiedCase {
		c.Broken, c.Reason, c.Since, c.Evidence = true, judge.ReasonVerifiedUnredirected, T0.Add(-20*time.Second), judge.EvidenceVerified
		return c
	}
	return []VerifiedCase{
		unredirected(VerifiedCase{Name: "verified without rules, meshed by every timing: broken at once", Pod: with(meshed, missing), Heartbeat: fresh}),
		unredirected(VerifiedCase{Name: "verified with drifted rules: broken", Pod: with(meshed, Verified(corev1.ConditionFalse, annotations.ReasonRulesDrifted, -20*time.Second)), Heartbeat: fresh}),
		unredirected(VerifiedCase{Name: "verified without rules, status enabled, sandbox younger than the min age: broken at once", Pod: Pod(SandboxAt(-25*time.Second), missing), Heartbeat: fresh}),
		unredirected(VerifiedCase{Name: "verified without rules, repair-only (no cni-applied-at, status written with the sandbox)", Pod: Pod(WithStatus(annotations.TProxyStatusComplete), StatusWritten("consul-cni", -time.Hour), SandboxAt(-time.Hour), missing), Heartbeat: fresh}),
		{Name: "verified with rules, sandbox recreated by timing (signal C): not acted on", Pod: with(recreated, inPlace), Heartbeat: fresh, Evidence: judge.EvidenceVerified},
		{Name: "verified with rules, status stuck by timing (signal A): not acted on", Pod: Pod(SandboxAt(-time.Hour), inPlace), Heartbeat: fresh, Evidence: judge.EvidenceVerified},
		{Name: "verified with rules, check failed (signal B): not acted on", Pod: Pod(young, failedCheck(annotations.InitContainerName), inPlace), Heartbeat: fresh, Evidence: judge.EvidenceVerified},
		{Name: "verified with rules after a slow first pull dated the sandbox late: not acted on", Pod: Pod(WithStatus(annotations.TProxyStatusComplete), AppliedAt(-10*time.Minute), SandboxAt(-5*time.Minute), Verified(corev1.ConditionTrue, annotations.ReasonRulesInPlace, -10*time.Minute)), Heartbeat: fresh, Evidence: judge.EvidenceVerified},
		{Name: "verified without rules before the current sandbox: the signals judge (meshed)", Pod: with(meshed, Verified(corev1.ConditionFalse, annotations.ReasonRulesMissing, -2*time.Hour)), Heartbeat: fresh, Evidence: judge.EvidenceInferred},
		{Name: "verified without rules, sandbox being recreated: the signals judge", Pod: Pod(WithStatus(annotations.TProxyStatusComplete), AppliedAt(-time.Hour), SandboxDown(-5*time.Second), missing), Heartbeat: fresh, Evidence: judge.EvidenceInferred},
		{Name: "verified without rules, pod failed: the signals judge", Pod: with(meshed, missing, InPhase(corev1.PodFailed)), Heartbeat: fresh, Evidence: judge.EvidenceInferred},
		{Name: "verifier could not read the namespace: the signals judge (signal A)", Pod: Pod(SandboxAt(-time.Hour), Verified(corev1.ConditionUnknown, "Unverifiable", -20*time.Second)), Heartbeat: fresh,
			Broken: true, Reason: judge.ReasonTProxyStatusStuck, Since: T0.Add(-time.Hour + judge.DefaultConfig().MinPodAge), Evidence: judge.EvidenceInferred},
		{Name: "not verified yet: the signals judge (signal C)", Pod: with(recreated), Heartbeat: fresh,
			Broken: true, Reason: judge.ReasonSandboxRecreated, Since: T0.Add(-50 * time.Minute), Evidence: judge.EvidenceInferred},
		{Name: "stale heartbeat: a True protects nothing (signal C)", Pod: with(recreated, inPlace), Heartbeat: stale,
			Broken: true, Reason: judge.ReasonSandboxRecreated, Since: T0.Add(-50 * time.Minute), Evidence: judge.EvidenceInferred},
		{Name: "stale heartbeat: a False acts on nothing", Pod: with(meshed, missing), Heartbeat: stale, Evidence: judge.EvidenceInferred},
		{Name: "no verifier on the pod's node: a False acts on nothing", Pod: with(meshed, missing), Heartbeat: otherNode, Evidence: judge.EvidenceInferred},
		{Name: "no verifier consulted at all: a False acts on nothing", Pod: with(meshed, missing), Evidence: judge.EvidenceInferred},
		{Name: "not injected: never examined, whatever the verifier says", Pod: Pod(WithoutLabel(annotations.KeyInjectStatus), WithoutAnnotation(annotations.KeyInjectStatus), SandboxAt(-time.Hour), missing), Heartbeat: fresh},
	}
}
