package judge

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
)

// ReasonVerifiedUnredirected is the node verifier's evidence: the pod's
// current sandbox was looked at in its network namespace and Consul's
// redirect rules were not there (annotations.ConditionRedirectVerified
// False).
const ReasonVerifiedUnredirected Reason = "verified_unredirected"

// Evidence says what a verdict rests on. The values are shown by the audit:
// keep them stable.
type Evidence string

const (
	// EvidenceVerified: the node verifier's condition for the pod's current
	// sandbox decided, and no timing signal was consulted.
	EvidenceVerified Evidence = "verified"
	// EvidenceInferred: no usable verification (no verifier reports for the
	// node, its heartbeat is stale, the pod is not verified yet, could not
	// be, or only an earlier sandbox was): the signals A, B and C decided.
	EvidenceInferred Evidence = "inferred"
)

// VerifierHeartbeat returns the lastHeartbeatTime of the node verifier's
// Node condition (annotations.NodeConditionCNIVerified) on a node, and
// whether the node has that condition at all.
type VerifierHeartbeat func(node string) (time.Time, bool)

// NodeVerifierHeartbeat reads the verifier's heartbeat from a Node: the one
// dating both the controller and the audit use.
func NodeVerifierHeartbeat(node *corev1.Node) (time.Time, bool) {
	if node == nil {
		return time.Time{}, false
	}
	for _, c := range node.Status.Conditions {
		if c.Type == annotations.NodeConditionCNIVerified {
			return c.LastHeartbeatTime.Time, !c.LastHeartbeatTime.IsZero()
		}
	}
	return time.Time{}, false
}

// verification is what the node verifier says of a pod: decided (a verdict
// resting on it alone) or, when not, why the signals judge instead.
type verification struct {
	decided bool
	verdict Verdict
	why     string
}

// verified applies the node verifier's evidence first. It decides only when
// a verifier reports for the pod's node (a Node condition heartbeat no
// older than annotations.NodeConditionStaleAfter) and the pod's condition
// says True (redirected: never broken, whatever the timings say) or False
// for its current sandbox (verified_unredirected, broken at once). A False
// probed before the kubelet dated the current sandbox may be an earlier
// sandbox's; it, an Unknown condition, a missing one and a stale heartbeat
// are no evidence either way, and the signals judge (fail safe: stale
// evidence neither acts nor protects). A Failed pod runs nothing: the
// signals judge it as before.
func (d Detector) verified(pod *corev1.Pod, now time.Time) verification {
	if d.VerifierHeartbeat == nil {
		return verification{why: "no verifier is consulted"}
	}
	node := pod.Spec.NodeName
	hb, ok := d.VerifierHeartbeat(node)
	switch {
	case !ok:
		return verification{why: fmt.Sprintf("no verifier reports for node %q", node)}
	case now.Sub(hb) > annotations.NodeConditionStaleAfter:
		return verification{why: fmt.Sprintf("the verifier of node %q last reported at %s, more than %s ago",
			node, annotations.FormatTime(hb), annotations.NodeConditionStaleAfter)}
	case pod.Status.Phase == corev1.PodFailed:
		return verification{why: "pod failed"}
	}
	c := redirectCondition(pod)
	if c == nil {
		return verification{why: "not verified yet"}
	}
	probed := c.LastProbeTime.Time
	if probed.IsZero() {
		probed = c.LastTransitionTime.Time
	}
	switch c.Status {
	case corev1.ConditionTrue:
		return verification{decided: true, verdict: Verdict{Evidence: EvidenceVerified,
			Ignored: fmt.Sprintf("verified redirected (%s) at %s", c.Reason, annotations.FormatTime(probed))}}
	case corev1.ConditionFalse:
		sandbox, ok := SandboxTime(pod)
		if !ok || probed.IsZero() || probed.Before(sandbox) {
			return verification{why: fmt.Sprintf("verified without rules (%s) at %s, which may be an earlier sandbox's",
				c.Reason, annotations.FormatTime(probed))}
		}
		return verification{decided: true, verdict: Verdict{Broken: true, Reason: ReasonVerifiedUnredirected,
			Evidence: EvidenceVerified, Since: probed,
			Detail: fmt.Sprintf("the node verifier found no Consul redirect rules in its current sandbox's network namespace (%s at %s): %s",
				c.Reason, annotations.FormatTime(probed), c.Message)}}
	}
	return verification{why: fmt.Sprintf("the verifier could not verify it (%s)", c.Reason)}
}

// redirectCondition returns the pod's annotations.ConditionRedirectVerified
// condition, nil when it has none.
func redirectCondition(pod *corev1.Pod) *corev1.PodCondition {
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == annotations.ConditionRedirectVerified {
			return &pod.Status.Conditions[i]
		}
	}
	return nil
}
