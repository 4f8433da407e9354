package repair

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
)

// keptPodAnnotations are the only annotations the controller reads.
var keptPodAnnotations = []string{
	annotations.KeyInjectStatus,
	annotations.KeyMeshInjectStatus,
	annotations.KeyTransparentProxyStatus,
	MirrorPodAnnotation,
}

// keptPodLabels are the only labels the controller reads.
var keptPodLabels = []string{
	annotations.KeyInjectStatus,
	annotations.LabelUninitialized,
}

// SlimInjectedPod is the informer transform of the injected-pod informer: it
// returns a new Pod holding only what detection, the gate, the breaker and
// the actions read (names, UID, resourceVersion, owners, the markers, node,
// restart policy, host network, phase, IP, conditions, container states
// without messages). Everything else (managed fields, most of the spec,
// images, resources, termination messages) is dropped before the object is
// cached, which is what keeps 10,000 pods in a few tens of MiB.
func SlimInjectedPod(obj interface{}) (interface{}, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // tombstones and anything unexpected pass through
	}
	out := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:              pod.Name,
			Namespace:         pod.Namespace,
			UID:               pod.UID,
			ResourceVersion:   pod.ResourceVersion,
			CreationTimestamp: pod.CreationTimestamp,
			DeletionTimestamp: pod.DeletionTimestamp,
			Labels:            keep(pod.Labels, keptPodLabels),
			Annotations:       keep(pod.Annotations, keptPodAnnotations),
		},
		Spec: corev1.PodSpec{
			NodeName:      pod.Spec.NodeName,
			RestartPolicy: pod.Spec.RestartPolicy,
			HostNetwork:   pod.Spec.HostNetwork,
		},
		Status: corev1.PodStatus{
			Phase:                 pod.Status.Phase,
			PodIP:                 pod.Status.PodIP,
			StartTime:             pod.Status.StartTime,
			InitContainerStatuses: slimStatuses(pod.Status.InitContainerStatuses),
			ContainerStatuses:     slimStatuses(pod.Status.ContainerStatuses),
		},
	}
	for _, ref := range pod.OwnerReferences {
		if ref.Controller != nil && *ref.Controller {
			out.OwnerReferences = []metav1.OwnerReference{{
				APIVersion: ref.APIVersion, Kind: ref.Kind, Name: ref.Name, UID: ref.UID, Controller: ref.Controller,
			}}
			break
		}
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReadyToStartContainers || c.Type == corev1.PodReady {
			out.Status.Conditions = append(out.Status.Conditions, corev1.PodCondition{
				Type: c.Type, Status: c.Status, LastTransitionTime: c.LastTransitionTime,
			})
		}
	}
	return out, nil
}

// SlimCNIPod is the transform of the CNI DaemonSet pod informer: name,
// node, labels, deletion and the Ready condition.
func SlimCNIPod(obj interface{}) (interface{}, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	out := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:              pod.Name,
			Namespace:         pod.Namespace,
			UID:               pod.UID,
			ResourceVersion:   pod.ResourceVersion,
			DeletionTimestamp: pod.DeletionTimestamp,
			Labels:            pod.Labels,
		},
		Spec:   corev1.PodSpec{NodeName: pod.Spec.NodeName},
		Status: corev1.PodStatus{Phase: pod.Status.Phase},
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			out.Status.Conditions = []corev1.PodCondition{{Type: c.Type, Status: c.Status, LastTransitionTime: c.LastTransitionTime}}
		}
	}
	return out, nil
}

// SlimNode keeps a node's name, UID, resourceVersion, labels and taints (the
// taints whole: the readiness patch tests them for equality).
func SlimNode(obj interface{}) (interface{}, error) {
	node, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:              node.Name,
			UID:               node.UID,
			ResourceVersion:   node.ResourceVersion,
			CreationTimestamp: node.CreationTimestamp,
			DeletionTimestamp: node.DeletionTimestamp,
			Labels:            node.Labels,
		},
		Spec: corev1.NodeSpec{Taints: node.Spec.Taints},
	}, nil
}

func keep(m map[string]string, keys []string) map[string]string {
	var out map[string]string
	for _, k := range keys {
		if v, ok := m[k]; ok {
			if out == nil {
				out = make(map[string]string, len(keys))
			}
			out[k] = v
		}
	}
	return out
}

func slimStatuses(in []corev1.ContainerStatus) []corev1.ContainerStatus {
	if len(in) == 0 {
		return nil
	}
	out := make([]corev1.ContainerStatus, len(in))
	for i := range in {
		out[i] = corev1.ContainerStatus{
			Name:                 in[i].Name,
			RestartCount:         in[i].RestartCount,
			State:                slimState(in[i].State),
			LastTerminationState: slimState(in[i].LastTerminationState),
		}
	}
	return out
}

func slimState(s corev1.ContainerState) corev1.ContainerState {
	var out corev1.ContainerState
	if s.Running != nil {
		out.Running = &corev1.ContainerStateRunning{StartedAt: s.Running.StartedAt}
	}
	if s.Terminated != nil {
		out.Terminated = &corev1.ContainerStateTerminated{
			ExitCode: s.Terminated.ExitCode, StartedAt: s.Terminated.StartedAt, FinishedAt: s.Terminated.FinishedAt,
		}
	}
	if s.Waiting != nil {
		out.Waiting = &corev1.ContainerStateWaiting{}
	}
	return out
}
