package judge

import (
	"time"

	corev1 "k8s.io/api/core/v1"
)

// OfTheRace reports whether a broken pod on an open node of gate (CNI ready
// since since) is of the race: its node's CNI readiness is dated (Gate.Dated)
// and the pod's latest sandbox predates it (the breaker's own dating, see
// dateSandbox). Such pods are the expected, bounded set the race leaves
// behind and take the rate limiter's race lane; every other broken pod (one
// dated just after readiness too: it may be the race or not) keeps the
// per-node pace.
func (d Detector) OfTheRace(gate Gate, pod *corev1.Pod, since time.Time) bool {
	if !gate.Dated(pod.Spec.NodeName) {
		return false
	}
	return dateSandbox(pod, since, d.SandboxSlack) == sandboxBeforeReady
}
