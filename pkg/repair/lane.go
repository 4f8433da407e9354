package repair

import (
	"time"

	corev1 "k8s.io/api/core/v1"
)

// ofTheRace reports whether a broken pod on an open node (CNI ready since
// since) is of the race: its node's CNI readiness is dated (see
// readinessDated) and the pod's latest sandbox predates it (dateSandbox, the
// breaker's own dating). Such pods are the expected, bounded set the race
// leaves behind and take the limiter's race lane; every other broken pod
// (one dated just after readiness too: it may be the race or not) keeps the
// per-node pace.
func (c *Controller) ofTheRace(pod *corev1.Pod, since time.Time) bool {
	if !c.readinessDated(pod.Spec.NodeName) {
		return false
	}
	return dateSandbox(pod, since, c.detector.SandboxSlack) == sandboxBeforeReady
}

// readinessDated reports whether the gate's "since" for node is the moment
// its CNI became ready rather than a stand-in: under the cni-pod gate the CNI
// pod's Ready transition; under the node-label gate only a valid
// cni-ready-since annotation on the labelled node (not the time this process
// first saw the label), or in a dry run the CNI pod the label would follow;
// never without a gate.
func (c *Controller) readinessDated(node string) bool {
	switch g := c.gate.(type) {
	case *cniPodGate:
		return true
	case *nodeLabelGate:
		n, err := c.nodes.Get(node)
		if err != nil {
			return false
		}
		if !nodeLabelledReady(n) {
			return g.wouldLabel != nil
		}
		_, ok := nodeReadySince(n)
		return ok
	}
	return false
}
