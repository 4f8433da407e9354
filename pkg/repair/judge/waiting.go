package judge

import (
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
)

// currentSandboxTime is SandboxTime for the signals, the breaker and the
// race lane, with one correction: a pod whose status is waiting is dated no
// earlier than that status's last write. Our plugin (and consul-k8s's)
// writes waiting at the start of every ADD, so the write dates the ADD of
// the sandbox being set up. After a reboot, or with a kubelet whose status
// updates lag (QPS-limited), the pod can show waiting while its
// PodReadyToStartContainers condition still dates the old sandbox: aged from
// that old time, a healthy re-ADD would be judged stuck at once (and, its
// old sandbox predating the node's readiness, of the race). The write's time
// is the API server's, the same for every process, so a restart or a
// failover ages the pod from the same moment.
func currentSandboxTime(pod *corev1.Pod) (time.Time, bool) {
	t, ok := SandboxTime(pod)
	if !ok {
		return t, false
	}
	if s, _ := annotations.TProxyStatus(pod.Annotations); s != annotations.TProxyStatusWaiting {
		return t, true
	}
	if w, _, written := StatusWrittenAt(pod); written && w.After(t) {
		return w, true
	}
	return t, true
}
