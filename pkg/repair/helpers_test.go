package repair

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
)

// t0 is the reference time of the tests.
var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func at(d time.Duration) metav1.Time { return metav1.NewTime(t0.Add(d)) }

type podOpt func(*corev1.Pod)

var podSeq int

// mkPod returns an injected transparent-proxy pod with status "enabled",
// owned by a ReplicaSet, bound to node n1, with no sandbox yet.
func mkPod(opts ...podOpt) *corev1.Pod {
	podSeq++
	yes := true
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:              "web-" + string(rune('a'+podSeq%26)) + time.Duration(podSeq).String(),
			Namespace:         "app",
			UID:               types.UID("uid-" + time.Duration(podSeq).String()),
			ResourceVersion:   "100",
			CreationTimestamp: at(-time.Hour),
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

func withStatus(s string) podOpt {
	return func(p *corev1.Pod) { p.Annotations[annotations.KeyTransparentProxyStatus] = s }
}

func withoutAnnotation(k string) podOpt { return func(p *corev1.Pod) { delete(p.Annotations, k) } }
func withoutLabel(k string) podOpt      { return func(p *corev1.Pod) { delete(p.Labels, k) } }
func withAnnotation(k, v string) podOpt { return func(p *corev1.Pod) { p.Annotations[k] = v } }
func inNamespace(ns string) podOpt      { return func(p *corev1.Pod) { p.Namespace = ns } }
func onNode(n string) podOpt            { return func(p *corev1.Pod) { p.Spec.NodeName = n } }
func bare() podOpt                      { return func(p *corev1.Pod) { p.OwnerReferences = nil } }

func restartNever() podOpt {
	return func(p *corev1.Pod) { p.Spec.RestartPolicy = corev1.RestartPolicyNever }
}

// sandboxAt marks the sandbox ready (PodReadyToStartContainers) at t0+d,
// with a pod IP.
func sandboxAt(d time.Duration) podOpt {
	return func(p *corev1.Pod) {
		p.Status.PodIP = "10.0.0.7"
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{
			Type: corev1.PodReadyToStartContainers, Status: corev1.ConditionTrue, LastTransitionTime: at(d),
		})
	}
}

func initStatus(cs corev1.ContainerStatus) podOpt {
	return func(p *corev1.Pod) { p.Status.InitContainerStatuses = append(p.Status.InitContainerStatuses, cs) }
}

func terminated(code int32, started, finished time.Duration) *corev1.ContainerStateTerminated {
	return &corev1.ContainerStateTerminated{ExitCode: code, StartedAt: at(started), FinishedAt: at(finished)}
}

// sandboxDown reports the PodReadyToStartContainers condition False since
// t0+d (a sandbox is being set up), with a pod IP kept from an earlier one.
func sandboxDown(d time.Duration) podOpt {
	return func(p *corev1.Pod) {
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{
			Type: corev1.PodReadyToStartContainers, Status: corev1.ConditionFalse, LastTransitionTime: at(d),
		})
	}
}

// appliedAt sets cni-applied-at to t0+d.
func appliedAt(d time.Duration) podOpt {
	return withAnnotation(annotations.KeyCNIAppliedAt, annotations.FormatTime(t0.Add(d)))
}

// startedApp adds an app container running since t0+d.
func startedApp(d time.Duration) podOpt {
	return func(p *corev1.Pod) {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: "app", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: at(d)}},
		})
	}
}

func inPhase(phase corev1.PodPhase) podOpt {
	return func(p *corev1.Pod) { p.Status.Phase = phase }
}
