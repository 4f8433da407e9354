package judge

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
)

// Reason says which signal found a pod broken. The values are metric label
// values: keep them stable.
type Reason string

const (
	// ReasonTProxyStatusStuck is signal A: the transparent-proxy-status
	// annotation is still enabled/waiting although the sandbox exists.
	ReasonTProxyStatusStuck Reason = "tproxy_status_stuck"
	// ReasonInitCheckFailed is signal B: the annotation-check init container
	// terminated with the init-check exit code.
	ReasonInitCheckFailed Reason = "init_check_failed"
	// ReasonSandboxRecreated is signal C: the status says complete, but the
	// pod's current sandbox was made after the plugin applied the rules
	// (cni-applied-at, or without it the time the status annotation was
	// last written), so the rules were applied to an earlier sandbox.
	ReasonSandboxRecreated Reason = "sandbox_recreated"
)

// AllReasons lists every Reason, in a fixed order (metrics).
var AllReasons = []Reason{ReasonTProxyStatusStuck, ReasonInitCheckFailed, ReasonSandboxRecreated, ReasonVerifiedUnredirected}

// Detector decides whether a pod bypassed the CNI plugin. It is a pure
// function of the pod and the time, so it is cheap and table-testable.
type Detector struct {
	// InitContainerNames are the names of the annotation-check init
	// containers (signal B). A status named N or N-<service> matches.
	InitContainerNames []string
	// InitExitCode is the exit code of a failed check.
	InitExitCode int32
	// MinPodAge is how long signal A's condition must hold before the pod
	// counts as broken.
	MinPodAge time.Duration
	// SandboxSlack (signal C) is how much later than cni-applied-at (or
	// the status annotation's last write) the current sandbox's
	// PodReadyToStartContainers transition may be and still be the sandbox
	// the rules were applied to.
	SandboxSlack time.Duration
	// VerifierHeartbeat, when set, dates the node verifier's report of a
	// node: the verifier's evidence then comes first (verified.go). Nil:
	// the signals alone judge.
	VerifierHeartbeat VerifierHeartbeat
}

// Verdict is the result of Detect.
type Verdict struct {
	Broken bool
	Reason Reason
	// Since is when the pod became broken by our definition (signal B: the
	// check's finish time; signal A: sandbox time + MinPodAge; signal C:
	// the current sandbox's time).
	Since time.Time
	// Detail is a short human explanation of the signal (Events, logs).
	Detail string
	// RecheckAt, when not zero and the pod is not broken, is when signal A
	// would fire if nothing else changes.
	RecheckAt time.Time
	// Ignored, when not empty and the pod is not broken, says why the pod
	// is never considered (not injected, terminating, ...).
	Ignored string
	// Evidence says whether the node verifier decided or the signals did
	// (empty for a pod never examined); Inferred, when the signals did,
	// says why the verifier could not.
	Evidence Evidence
	Inferred string
}

// examinable reports whether the pod is one that can ever be broken: a repair
// candidate that is not being deleted, not a mirror/static pod, not on the
// host network, not Succeeded, and whose status is one a signal judges
// (enabled/waiting: signals A and B; complete: signal C). A Failed pod is
// examinable here; Detect judges it by signal B only. The string says why
// not.
func examinable(pod *corev1.Pod) (bool, string) {
	if !annotations.UsesTransparentProxy(pod.Labels, pod.Annotations) {
		if !annotations.IsInjected(pod.Labels, pod.Annotations) {
			return false, "not injected"
		}
		return false, "transparent proxy off"
	}
	if pod.DeletionTimestamp != nil {
		return false, "being deleted"
	}
	if isMirrorPod(pod) {
		return false, "mirror pod"
	}
	if pod.Spec.HostNetwork {
		// The CNI plugin is never called for host-network pods.
		return false, "host network"
	}
	if pod.Status.Phase == corev1.PodSucceeded {
		// Its containers are done: nothing runs outside the mesh, and
		// acting would only lose its logs.
		return false, "pod succeeded"
	}
	status, _ := annotations.TProxyStatus(pod.Annotations)
	switch {
	case status == annotations.TProxyStatusEnabled, status == annotations.TProxyStatusWaiting, annotations.IsComplete(status):
		return true, ""
	}
	return false, fmt.Sprintf("transparent-proxy-status %q", status)
}

// isMirrorPod reports whether pod is the mirror of a static pod.
func isMirrorPod(pod *corev1.Pod) bool {
	if _, ok := pod.Annotations[annotations.KeyConfigMirror]; ok {
		return true
	}
	for _, ref := range pod.OwnerReferences {
		if ref.Controller != nil && *ref.Controller && ref.Kind == "Node" {
			return true
		}
	}
	return false
}

// Detect applies the node verifier's evidence first (verified.go), then,
// where it does not decide, signals B then A to a pod whose status is
// enabled/waiting, and signal C to one whose status is complete, at time
// now. A Failed pod is
// broken only by signal B: it failed for another reason (an eviction by the
// kubelet, its own containers), runs nothing and its owner replaces it.
func (d Detector) Detect(pod *corev1.Pod, now time.Time) Verdict {
	if ok, why := examinable(pod); !ok {
		return Verdict{Ignored: why}
	}
	ev := d.verified(pod, now)
	if ev.decided {
		return ev.verdict
	}
	v := d.infer(pod, now)
	v.Evidence, v.Inferred = EvidenceInferred, ev.why
	return v
}

// infer judges an examinable pod by the signals.
func (d Detector) infer(pod *corev1.Pod, now time.Time) Verdict {
	status, _ := annotations.TProxyStatus(pod.Annotations)
	if annotations.IsComplete(status) {
		if pod.Status.Phase == corev1.PodFailed {
			return Verdict{Ignored: "pod failed, redirection complete"}
		}
		return d.signalC(pod, status)
	}
	if v, ok := d.signalB(pod, now); ok {
		return v
	}
	if pod.Status.Phase == corev1.PodFailed {
		return Verdict{Ignored: "pod failed, not by the check"}
	}
	return d.signalA(pod, now)
}

// Finished reports whether the pod is done and never counted as broken:
// Succeeded, or Failed for any reason other than signal B.
func (d Detector) Finished(pod *corev1.Pod) bool {
	switch pod.Status.Phase {
	case corev1.PodSucceeded:
		return true
	case corev1.PodFailed:
		_, failedCheck := d.signalB(pod, time.Time{})
		s, _ := annotations.TProxyStatus(pod.Annotations)
		return !failedCheck || annotations.IsComplete(s)
	}
	return false
}

// MatchesInitContainer reports whether a container name is one of names or
// one of names followed by "-<service>" (consul-k8s multi-port pods): the
// check init containers of signal B.
func MatchesInitContainer(name string, names []string) bool {
	for _, n := range names {
		if name == n {
			return true
		}
		if len(name) > len(n)+1 && strings.HasPrefix(name, n) && name[len(n)] == '-' {
			return true
		}
	}
	return false
}

// signalB: the check init container terminated with the check's exit code,
// now (restartPolicy Never, or between restarts) or as its last
// termination (restartPolicy Always/OnFailure, while it waits in back-off or
// runs again). A container that has since succeeded is not failing.
func (d Detector) signalB(pod *corev1.Pod, now time.Time) (Verdict, bool) {
	for i := range pod.Status.InitContainerStatuses {
		cs := &pod.Status.InitContainerStatuses[i]
		if !MatchesInitContainer(cs.Name, d.InitContainerNames) {
			continue
		}
		var term *corev1.ContainerStateTerminated
		switch {
		case cs.State.Terminated != nil && cs.State.Terminated.ExitCode == d.InitExitCode:
			term = cs.State.Terminated
		case cs.State.Terminated != nil && cs.State.Terminated.ExitCode == 0:
			// Succeeded (after an earlier failure): not failing now.
			continue
		case cs.LastTerminationState.Terminated != nil && cs.LastTerminationState.Terminated.ExitCode == d.InitExitCode:
			term = cs.LastTerminationState.Terminated
		default:
			continue
		}
		since := term.FinishedAt.Time
		if since.IsZero() || since.After(now) {
			since = now
		}
		return Verdict{
			Broken: true,
			Reason: ReasonInitCheckFailed,
			Since:  since,
			Detail: fmt.Sprintf("init container %s exited with code %d", cs.Name, d.InitExitCode),
		}, true
	}
	return Verdict{}, false
}

// signalA: the status is still enabled/waiting although the latest sandbox
// exists, for at least MinPodAge (waiting: since it was written, see
// currentSandboxTime).
func (d Detector) signalA(pod *corev1.Pod, now time.Time) Verdict {
	sandbox, ok := currentSandboxTime(pod)
	if !ok {
		return Verdict{Ignored: "no sandbox yet"}
	}
	status := pod.Annotations[annotations.KeyTransparentProxyStatus]
	since := sandbox.Add(d.MinPodAge)
	if now.Before(since) {
		return Verdict{RecheckAt: since}
	}
	return Verdict{
		Broken: true,
		Reason: ReasonTProxyStatusStuck,
		Since:  since,
		Detail: fmt.Sprintf("%s is still %q %s after its sandbox was created", annotations.KeyTransparentProxyStatus, status, now.Sub(sandbox).Round(time.Second)),
	}
}

// signalC: the status is complete and says when the rules were applied
// (cni-applied-at), but the current sandbox became ready later than that by
// more than SandboxSlack: it was made (a node reboot, a sandbox that died)
// after the rules were applied to an earlier one, and the chain that made it
// did not run the plugin (it would have written a new time). A value that
// does not parse is not trusted to act on. Pods without the annotation
// (consul-k8s's plugin, older ones of ours) are judged by signalCWritten.
func (d Detector) signalC(pod *corev1.Pod, status string) Verdict {
	raw, ok := pod.Annotations[annotations.KeyCNIAppliedAt]
	if !ok {
		return d.signalCWritten(pod, status)
	}
	applied, err := annotations.ParseTime(annotations.KeyCNIAppliedAt, raw)
	if err != nil {
		return Verdict{Ignored: "redirection complete; " + err.Error()}
	}
	return d.recreatedAfter(pod, applied, func(sandbox time.Time) string {
		return fmt.Sprintf("its sandbox was recreated at %s without consul-cni: %s is %q but %s is %s, %s earlier",
			annotations.FormatTime(sandbox), annotations.KeyTransparentProxyStatus, status,
			annotations.KeyCNIAppliedAt, raw, sandbox.Sub(applied).Round(time.Second))
	})
}

// recreatedAfter is signal C's test against the time consul-cni last acted
// on the pod: a sandbox that became ready more than the slack later, and
// that replaced an earlier one in which a container ran (ranInEarlierSandbox:
// a late date alone is a slow first pull), was made without it. detail words
// the verdict.
func (d Detector) recreatedAfter(pod *corev1.Pod, acted time.Time, detail func(sandbox time.Time) string) Verdict {
	sandbox, ok := SandboxTime(pod)
	if !ok || !hasReadyToStart(pod) || !sandbox.After(acted.Add(d.SandboxSlack)) {
		return Verdict{Ignored: "redirection complete"}
	}
	earlier, changed := ranInEarlierSandbox(pod, sandbox)
	if !changed {
		return Verdict{Ignored: "redirection complete; sandbox dated late, but no container ran before it (a slow first start)"}
	}
	return Verdict{Broken: true, Reason: ReasonSandboxRecreated, Since: sandbox, Detail: detail(sandbox) + "; " + earlier}
}

// SandboxTime returns when the pod's latest sandbox was created, as far as
// the API shows it, and whether it exists at all: the one dating of a
// sandbox that the signals, the breaker and the race lane share. When the
// kubelet reports the PodReadyToStartContainers condition (Kubernetes 1.29
// and later), the condition alone decides: True dates the latest sandbox by
// its last transition (the kubelet turns it False while a sandbox is being
// recreated, so its True transition always dates the latest one), False
// means a sandbox is being set up (none exists yet, even though the pod
// still shows the IP and containers of an earlier one). Without the
// condition: a pod IP or any started container says a sandbox exists, dated
// by the earliest container start, else the pod's start time, else its
// creation time.
func SandboxTime(pod *corev1.Pod) (time.Time, bool) {
	for _, c := range pod.Status.Conditions {
		if c.Type != corev1.PodReadyToStartContainers {
			continue
		}
		if c.Status != corev1.ConditionTrue {
			return time.Time{}, false
		}
		t := c.LastTransitionTime.Time
		if t.IsZero() {
			t = pod.CreationTimestamp.Time
		}
		return t, true
	}
	return startedSandboxTime(pod)
}

// hasReadyToStart reports whether the kubelet reports the pod's
// PodReadyToStartContainers condition, which alone dates a sandbox exactly
// (signal C trusts no other date).
func hasReadyToStart(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReadyToStartContainers {
			return true
		}
	}
	return false
}

// startedSandboxTime is SandboxTime for a kubelet that does not report the
// PodReadyToStartContainers condition.
func startedSandboxTime(pod *corev1.Pod) (time.Time, bool) {
	var t time.Time
	exists := false
	earliest := func(c time.Time) {
		if c.IsZero() {
			return
		}
		if t.IsZero() || c.Before(t) {
			t = c
		}
	}
	started := func(list []corev1.ContainerStatus) {
		for i := range list {
			cs := &list[i]
			for _, st := range []corev1.ContainerState{cs.State, cs.LastTerminationState} {
				if st.Running != nil {
					exists = true
					earliest(st.Running.StartedAt.Time)
				}
				if st.Terminated != nil {
					exists = true
					earliest(st.Terminated.StartedAt.Time)
				}
			}
			if cs.RestartCount > 0 {
				exists = true
			}
		}
	}
	started(pod.Status.InitContainerStatuses)
	started(pod.Status.ContainerStatuses)
	if pod.Status.PodIP != "" {
		exists = true
	}
	if !exists {
		return time.Time{}, false
	}
	if t.IsZero() && pod.Status.StartTime != nil {
		t = pod.Status.StartTime.Time
	}
	if t.IsZero() {
		t = pod.CreationTimestamp.Time
	}
	return t, true
}

// signalCWritten is signal C for a plugin that writes no cni-applied-at
// (consul-k8s's): the time the status annotation was last written, from the
// pod's managedFields (StatusWrittenAt; statuswritten.go says why no other
// writer can make a meshed pod look recreated), stands for it. A pod with no
// entry owning the annotation is not judged.
func (d Detector) signalCWritten(pod *corev1.Pod, status string) Verdict {
	written, manager, ok := StatusWrittenAt(pod)
	if !ok {
		return Verdict{Ignored: "redirection complete"}
	}
	return d.recreatedAfter(pod, written, func(sandbox time.Time) string {
		return fmt.Sprintf("its sandbox was recreated at %s without consul-cni: %s is %q, last written by %s at %s, %s earlier (it has no %s)",
			annotations.FormatTime(sandbox), annotations.KeyTransparentProxyStatus, status, manager,
			annotations.FormatTime(written), sandbox.Sub(written).Round(time.Second), annotations.KeyCNIAppliedAt)
	})
}
