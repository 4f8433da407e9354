package judge

import (
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
)

// ranInEarlierSandbox is signal C's evidence that the pod's current sandbox
// (ready at sandbox) replaced an earlier one: a container, init or not, whose
// previous run (its last termination) ended before the current sandbox
// became ready, or whose previous run the kubelet lost with its sandbox
// (a termination without times, as the kubelet reports a container it can
// no longer find). When a sandbox is made again, the kubelet runs the init
// containers again and restarts the others, so each keeps the run of the
// earlier sandbox as its last termination.
//
// A time gap alone is no such evidence: the kubelet dates a pod's first
// sandbox only in the sync after the one that made it, which also pulls the
// first init container's image, so a first pull longer than the slack dates
// a meshed pod's only sandbox long after cni-applied-at. No container of that
// pod has run before its sandbox, so none has a last termination that ended
// before it. The string says what ran before.
func ranInEarlierSandbox(pod *corev1.Pod, sandbox time.Time) (string, bool) {
	var first time.Time
	for _, list := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses} {
		for i := range list {
			last := list[i].LastTerminationState.Terminated
			switch {
			case last == nil:
			case last.FinishedAt.IsZero():
				return "a container was lost with an earlier sandbox", true
			case first.IsZero() || last.FinishedAt.Time.Before(first):
				first = last.FinishedAt.Time
			}
		}
	}
	if first.IsZero() || !first.Before(sandbox) {
		return "", false
	}
	return "a container ran before it, until " + annotations.FormatTime(first), true
}
