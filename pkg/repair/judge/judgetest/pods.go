// Package judgetest builds the pods of the judgement's tests: an injected
// transparent-proxy pod (Pod) shaped by options (its status, sandbox, check
// init container, phase, owner), and a CNI DaemonSet pod (CNIPod). Times are
// offsets from T0.
package judgetest

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
)

// T0 is the reference time of the tests.
var T0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// At is T0+d as an API time.
func At(d time.Duration) metav1.Time { return metav1.NewTime(T0.Add(d)) }

// PodOpt shapes a Pod.
type PodOpt func(*corev1.Pod)

var podSeq int

// Pod returns an injected transparent-proxy pod with status "enabled",
// owned by a ReplicaSet, bound to node n1, with no sandbox yet.
func Pod(opts ...PodOpt) *corev1.Pod {
	podSeq++
	yes := true
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:              "web-" + string(rune('a'+podSeq%26)) + time.Duration(podSeq).String(),
			Namespace:         "app",
			UID:               types.UID("uid-" + time.Duration(podSeq).String()),
			ResourceVersion:   "100",
			CreationTimestamp: At(-time.Hour),
			Labels:            map[string]string{annotations.KeyInjectStatus: annotations.InjectStatusInjected, "app": "web"},
			Annotations: map[string]string{
				annotations.KeyInjectStatus:           annotations.InjectStatusInjected,
				annotations.KeyTransparentProxyStatus: annotations.TProxyStatusEnabled,
			},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-5d8f", UID: "rs-uid", Controller: &yes}},
		},
		Spec:   corev1.PodSpec{NodeName: "n1", RestartPolicy: corev1.RestartPolicyAlways},
		Status: corev1.PodStatus{Phase: corev1.PodPending},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

// WithStatus sets the transparent-proxy-status.
func WithStatus(s string) PodOpt {
	return func(p *corev1.Pod) { p.Annotations[annotations.KeyTransparentProxyStatus] = s }
}

// WithoutAnnotation, WithoutLabel, WithAnnotation, InNamespace, OnNode and
// Bare (no owner) change what their names say.
func WithoutAnnotation(k string) PodOpt { return func(p *corev1.Pod) { delete(p.Annotations, k) } }
func WithoutLabel(k string) PodOpt      { return func(p *corev1.Pod) { delete(p.Labels, k) } }
func WithAnnotation(k, v string) PodOpt { return func(p *corev1.Pod) { p.Annotations[k] = v } }
func InNamespace(ns string) PodOpt      { return func(p *corev1.Pod) { p.Namespace = ns } }
func OnNode(n string) PodOpt            { return func(p *corev1.Pod) { p.Spec.NodeName = n } }
func Bare() PodOpt                      { return func(p *corev1.Pod) { p.OwnerReferences = nil } }

// RestartNever sets restartPolicy Never.
func RestartNever() PodOpt {
	return func(p *corev1.Pod) { p.Spec.RestartPolicy = corev1.RestartPolicyNever }
}

// SandboxAt marks the sandbox ready (PodReadyToStartContainers) At T0+d,
// with a pod IP.
func SandboxAt(d time.Duration) PodOpt {
	return func(p *corev1.Pod) {
		p.Status.PodIP = "10.0.0.7"
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{
			Type: corev1.PodReadyToStartContainers, Status: corev1.ConditionTrue, LastTransitionTime: At(d),
		})
	}
}

// InitStatus adds an init container status.
func InitStatus(cs corev1.ContainerStatus) PodOpt {
	return func(p *corev1.Pod) { p.Status.InitContainerStatuses = append(p.Status.InitContainerStatuses, cs) }
}

// Terminated is a termination with code, started and finished at T0+started
// and T0+finished.
func Terminated(code int32, started, finished time.Duration) *corev1.ContainerStateTerminated {
	return &corev1.ContainerStateTerminated{ExitCode: code, StartedAt: At(started), FinishedAt: At(finished)}
}

// SandboxDown reports the PodReadyToStartContainers condition False since
// T0+d (a sandbox is being set up), with a pod IP kept from an earlier one.
func SandboxDown(d time.Duration) PodOpt {
	return func(p *corev1.Pod) {
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{
			Type: corev1.PodReadyToStartContainers, Status: corev1.ConditionFalse, LastTransitionTime: At(d),
		})
	}
}

// AppliedAt sets cni-applied-At to T0+d.
func AppliedAt(d time.Duration) PodOpt {
	return WithAnnotation(annotations.KeyCNIAppliedAt, annotations.FormatTime(T0.Add(d)))
}

// StatusWritten adds a managedFields entry of manager, at T0+d, that owns
// the transparent-proxy-status annotation (the last update that changed it).
func StatusWritten(manager string, d time.Duration) PodOpt {
	return ManagedFields(manager, d, `{"f:metadata":{"f:annotations":{"f:`+annotations.KeyTransparentProxyStatus+`":{}}}}`)
}

// ManagedFields adds a managedFields entry (an update) of manager, at T0+d,
// with fieldsV1 fields.
func ManagedFields(manager string, d time.Duration, fields string) PodOpt {
	return func(p *corev1.Pod) {
		t := At(d)
		p.ManagedFields = append(p.ManagedFields, metav1.ManagedFieldsEntry{
			Manager: manager, Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1",
			Time: &t, FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(fields)},
		})
	}
}

// StartedApp adds an app container running since T0+d.
func StartedApp(d time.Duration) PodOpt {
	return func(p *corev1.Pod) {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: "app", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: At(d)}},
		})
	}
}

// InPhase sets the pod's phase.
func InPhase(phase corev1.PodPhase) PodOpt {
	return func(p *corev1.Pod) { p.Status.Phase = phase }
}

// CNIPod returns a running CNI DaemonSet pod on node, in the default CNI
// namespace, Ready (or not) since T0+since; opts change it further.
func CNIPod(node string, ready bool, since time.Duration, opts ...func(*corev1.Pod)) *corev1.Pod {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "consul-cni-" + node, Namespace: judge.DefaultConfig().CNINamespace, UID: types.UID("cni-uid-" + node),
			Labels: map[string]string{"app.kubernetes.io/name": "consul-cni"}},
		Spec:   corev1.PodSpec{NodeName: node},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st, LastTransitionTime: At(since)}}},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

// ReadyAt sets a CNI pod's Ready transition to T0+d.
func ReadyAt(d time.Duration) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Status.Conditions[0].LastTransitionTime = At(d) }
}

// RunningSince adds a container running since T0+d to a CNI pod, its Ready
// transition left as it was.
func RunningSince(d time.Duration) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{Name: "installer", RestartCount: 1,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: At(d)}}})
	}
}

// Restarted adds an app container restarted once: its previous run ended at
// T0+finished (a run in an earlier sandbox when that is before the current
// one), its current run started a second later.
func Restarted(finished time.Duration) PodOpt {
	return func(p *corev1.Pod) {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: "app", RestartCount: 1,
			State:                corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: At(finished + time.Second)}},
			LastTerminationState: corev1.ContainerState{Terminated: Terminated(0, finished-time.Hour, finished)},
		})
	}
}

// RanAgain adds init container name, succeeded in its current run that
// started at T0+started and ran before until T0+before.
func RanAgain(name string, before, started time.Duration) PodOpt {
	return InitStatus(corev1.ContainerStatus{
		Name: name, RestartCount: 1,
		State:                corev1.ContainerState{Terminated: Terminated(0, started, started+time.Second)},
		LastTerminationState: corev1.ContainerState{Terminated: Terminated(0, before-time.Second, before)},
	})
}

// Lost adds an app container whose previous run the kubelet lost with its
// sandbox: a termination without times (ContainerStatusUnknown).
func Lost() PodOpt {
	return func(p *corev1.Pod) {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: "app", RestartCount: 1,
			LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "ContainerStatusUnknown"}},
		})
	}
}
