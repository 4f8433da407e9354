package repair

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
)

// AllReasons lists every Reason, in a fixed order (metrics).
var AllReasons = []Reason{ReasonTProxyStatusStuck, ReasonInitCheckFailed}

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
}

// Verdict is the result of Detect.
type Verdict struct {
	Broken bool
	Reason Reason
	// Since is when the pod became broken by our definition (signal B: the
	// check's finish time; signal A: sandbox time + MinPodAge).
	Since time.Time
	// Detail is a short human explanation of the signal (Events, logs).
	Detail string
	// RecheckAt, when not zero and the pod is not broken, is when signal A
	// would fire if nothing else changes.
	RecheckAt time.Time
	// Ignored, when not empty and the pod is not broken, says why the pod
	// is never considered (not injected, terminating, ...).
	Ignored string
}

// Examinable reports whether the pod is one that can ever be broken: a repair
// candidate that is not being deleted, not a mirror/static pod, not on the
// host network and whose status says redirection is still pending. The
// string says why not.
func Examinable(pod *corev1.Pod) (bool, string) {
	if !annotations.IsRepairCandidate(pod.Labels, pod.Annotations) {
		if !annotations.IsInjected(pod.Labels, pod.Annotations) {
			return false, "not injected"
		}
		return false, "transparent proxy off"
	}
	if pod.DeletionTimestamp != nil {
		return false, "being deleted"
	}
	if IsMirrorPod(pod) {
		return false, "mirror pod"
	}
	if pod.Spec.HostNetwork {
		// The CNI plugin is never called for host-network pods.
		return false, "host network"
	}
	status, _ := annotations.TProxyStatus(pod.Annotations)
	switch status {
	case annotations.TProxyStatusEnabled, annotations.TProxyStatusWaiting:
		return true, ""
	}
	if annotations.IsComplete(status) {
		return false, "redirection complete"
	}
	return false, fmt.Sprintf("transparent-proxy-status %q", status)
}

// IsMirrorPod reports whether pod is the mirror of a static pod.
func IsMirrorPod(pod *corev1.Pod) bool {
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

// Detect applies signals B then A to pod at time now.
func (d Detector) Detect(pod *corev1.Pod, now time.Time) Verdict {
	if ok, why := Examinable(pod); !ok {
		return Verdict{Ignored: why}
	}
	if v, ok := d.signalB(pod, now); ok {
		return v
	}
	return d.signalA(pod, now)
}

// MatchesInitContainer reports whether a container name is one of names or
// one of names followed by "-<service>" (consul-k8s multi-port pods).
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

// signalA: the status is still enabled/waiting although the sandbox exists,
// for at least MinPodAge.
func (d Detector) signalA(pod *corev1.Pod, now time.Time) Verdict {
	sandbox, ok := SandboxTime(pod)
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

// SandboxTime returns when the pod's sandbox was created, as far as the API
// shows it, and whether it exists at all: the PodReadyToStartContainers
// condition, a pod IP, or any container that has started. The earliest
// timestamp among those signals is used; a pod IP alone falls back to the
// pod's start time, then its creation time.
func SandboxTime(pod *corev1.Pod) (time.Time, bool) {
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
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReadyToStartContainers && c.Status == corev1.ConditionTrue {
			exists = true
			earliest(c.LastTransitionTime.Time)
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

// ControllerOf returns the controlling owner reference of pod, or nil for a
// bare pod (nothing would recreate it).
func ControllerOf(pod *corev1.Pod) *metav1.OwnerReference {
	for i := range pod.OwnerReferences {
		ref := &pod.OwnerReferences[i]
		if ref.Controller != nil && *ref.Controller {
			return ref
		}
	}
	return nil
}
