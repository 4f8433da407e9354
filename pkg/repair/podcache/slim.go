package podcache

import (
	"strings"
	"sync"
	"unique"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
)

// keptPodAnnotations are the only annotations the controller reads.
var keptPodAnnotations = []string{
	annotations.KeyInjectStatus,
	annotations.KeyMeshInjectStatus,
	annotations.KeyTransparentProxyStatus,
	annotations.KeyConfigMirror,
	annotations.KeyCNIAppliedAt,
}

// keptPodLabels are the only labels the controller reads.
var keptPodLabels = []string{
	annotations.KeyInjectStatus,
	annotations.LabelUninitialized,
}

// slimInjectedPodFor returns the informer transform of the injected-pod
// informer: it returns a new Pod holding only what detection, the gate, the
// breaker and the actions read: names, UID, resourceVersion, the controller
// owner, our markers, node, restart policy, host network, phase, IP, start
// time, the PodReadyToStartContainers condition, the statuses of the check
// init containers (initNames) without messages, and, standing for every
// other container, at most one status that says when the first of them
// started (all that sandbox detection needs), and of the managed fields one
// entry: the time and manager of the one that owns the status annotation.
// Everything else (the other managed fields, most of the spec, images,
// resources, termination messages) is dropped before the object is cached,
// which is what keeps 10,000 pods in a few tens of MiB.
func slimInjectedPodFor(initNames []string) func(interface{}) (interface{}, error) {
	names := append([]string(nil), initNames...)
	return func(obj interface{}) (interface{}, error) { return slimInjectedPod(obj, names) }
}

// InjectedPodTransform is the informer transform of the injected-pod
// informer: the slim pod (slimInjectedPodFor) in its compact form
// (cachedPod), or the slim pod itself when it has a time the compact form
// cannot hold. PodOf gives readers the slim pod back.
func InjectedPodTransform(initNames []string) func(interface{}) (interface{}, error) {
	slim := slimInjectedPodFor(initNames)
	return func(obj interface{}) (interface{}, error) {
		o, err := slim(obj)
		if p, ok := o.(*corev1.Pod); ok && err == nil {
			if c, packed := packPod(p); packed {
				return c, nil
			}
		}
		return o, err
	}
}

func slimInjectedPod(obj interface{}, initNames []string) (interface{}, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // tombstones and anything unexpected pass through
	}
	out := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:              pod.Name,
			Namespace:         shared(pod.Namespace),
			UID:               pod.UID,
			ResourceVersion:   pod.ResourceVersion,
			CreationTimestamp: pod.CreationTimestamp,
			DeletionTimestamp: pod.DeletionTimestamp,
			Labels:            keep(pod.Labels, keptPodLabels),
			Annotations:       keep(pod.Annotations, keptPodAnnotations),
		},
		Spec: corev1.PodSpec{
			NodeName:      shared(pod.Spec.NodeName),
			RestartPolicy: pod.Spec.RestartPolicy,
			HostNetwork:   pod.Spec.HostNetwork,
		},
		Status: corev1.PodStatus{
			Phase:     pod.Status.Phase,
			PodIP:     pod.Status.PodIP,
			StartTime: pod.Status.StartTime,
		},
	}
	// Of the managed fields, the time of the entry that owns the status
	// annotation (signal C without cni-applied-at).
	if at, manager, ok := judge.StatusWrittenAt(pod); ok {
		t := metav1.NewTime(at)
		out.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: shared(manager), Time: &t, FieldsType: "FieldsV1", FieldsV1: statusFields}}
	}
	for _, ref := range pod.OwnerReferences {
		if ref.Controller != nil && *ref.Controller {
			out.OwnerReferences = []metav1.OwnerReference{{
				APIVersion: shared(ref.APIVersion), Kind: shared(ref.Kind), Name: shared(ref.Name),
				UID: types.UID(shared(string(ref.UID))), Controller: &isController,
			}}
			break
		}
	}
	out.Status.Conditions = slimPodConditions(pod.Status.Conditions)
	var others containerSummary
	for i := range pod.Status.InitContainerStatuses {
		cs := &pod.Status.InitContainerStatuses[i]
		if judge.MatchesInitContainer(cs.Name, initNames) {
			out.Status.InitContainerStatuses = append(out.Status.InitContainerStatuses, corev1.ContainerStatus{
				Name:                 cs.Name,
				RestartCount:         cs.RestartCount,
				State:                slimState(cs.State),
				LastTerminationState: slimState(cs.LastTerminationState),
			})
		} else {
			others.add(cs)
		}
	}
	for i := range pod.Status.ContainerStatuses {
		others.add(&pod.Status.ContainerStatuses[i])
	}
	if others.started || others.restarted {
		s := corev1.ContainerStatus{State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: others.first}}}
		if others.restarted {
			s.RestartCount = 1
		}
		s.LastTerminationState = others.lastTermination()
		out.Status.ContainerStatuses = []corev1.ContainerStatus{s}
	}
	return out, nil
}

// containerSummary is what sandbox detection needs of a set of containers:
// whether any started (or restarted), the earliest start time, and of the
// previous runs (last terminations) the earliest end, or that one has none
// (signal C's evidence of an earlier sandbox).
type containerSummary struct {
	started, restarted bool
	first              metav1.Time
	ended, lost        bool
	firstEnd           metav1.Time
}

func (c *containerSummary) add(cs *corev1.ContainerStatus) {
	if cs.RestartCount > 0 {
		c.restarted = true
	}
	if last := cs.LastTerminationState.Terminated; last != nil {
		c.ended = true
		switch t := last.FinishedAt; {
		case t.IsZero():
			c.lost = true
		case c.firstEnd.IsZero() || t.Before(&c.firstEnd):
			c.firstEnd = t
		}
	}
	for _, st := range []corev1.ContainerState{cs.State, cs.LastTerminationState} {
		var t metav1.Time
		switch {
		case st.Running != nil:
			t = st.Running.StartedAt
		case st.Terminated != nil:
			t = st.Terminated.StartedAt
		default:
			continue
		}
		c.started = true
		if !t.IsZero() && (c.first.IsZero() || t.Before(&c.first)) {
			c.first = t
		}
	}
}

// lastTermination is the summary's previous run: none, one without times
// when a container's was lost, else the earliest end.
func (c *containerSummary) lastTermination() corev1.ContainerState {
	switch {
	case !c.ended:
		return corev1.ContainerState{}
	case c.lost:
		return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{}}
	}
	return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{FinishedAt: c.firstEnd}}
}

// CNIPodTransform is the transform of the CNI DaemonSet pod informer: name,
// node, labels, deletion, the Ready condition and the start times of the
// running containers.
func CNIPodTransform(obj interface{}) (interface{}, error) {
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
	// Running containers' start times date a restart (judge.ReadySince).
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.State.Running != nil {
			out.Status.ContainerStatuses = append(out.Status.ContainerStatuses, corev1.ContainerStatus{
				Name: cs.Name, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: cs.State.Running.StartedAt}}})
		}
	}
	return out, nil
}

// NodeTransform keeps a node's name, UID, resourceVersion, labels, taints (the
// taints whole: the readiness patch tests them for equality) and of its
// annotations only the ready-since one (in a map that is nil only when the
// node has no annotations: the readiness patch adds the whole map then).
func NodeTransform(obj interface{}) (interface{}, error) {
	node, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	var ann map[string]string
	if node.Annotations != nil {
		ann = map[string]string{}
		if v, ok := node.Annotations[annotations.AnnotationCNIReadySince]; ok {
			ann[annotations.AnnotationCNIReadySince] = v
		}
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:              node.Name,
			UID:               node.UID,
			ResourceVersion:   node.ResourceVersion,
			CreationTimestamp: node.CreationTimestamp,
			DeletionTimestamp: node.DeletionTimestamp,
			Labels:            node.Labels,
			Annotations:       ann,
		},
		Spec:   corev1.NodeSpec{Taints: node.Spec.Taints},
		Status: corev1.NodeStatus{Conditions: slimNodeConditions(node.Status.Conditions)},
	}, nil
}

// Shared by every slim pod, never mutated: the managed fields entry's fields
// and the owner's controller flag.
var (
	statusFields = judge.StatusFieldsV1()
	isController = true
)

// shared returns s as the one copy every cached object that carries the
// same value shares: namespaces, node names, owners and managers take few
// values across many pods, and each decoded object brings its own copy.
// unique's handles are weak: a value no object holds any more is collected,
// so the table never outgrows what the cache holds.
func shared(s string) string {
	if s == "" {
		return s
	}
	return unique.Make(s).Value()
}

// uniqueAnnotations have a value of their own on almost every pod (a time,
// a hash): a map holding one is never shared, and never fills the intern
// table in place of the common marker sets.
var uniqueAnnotations = map[string]bool{annotations.KeyCNIAppliedAt: true, annotations.KeyConfigMirror: true}

// keep returns the entries of m under keys, as a shared (interned) map when
// the same entries were seen before: almost every injected pod carries the
// same few markers, and a small Go map costs hundreds of bytes. Cached
// objects are never mutated, so sharing is safe.
func keep(m map[string]string, keys []string) map[string]string {
	var out map[string]string
	var id strings.Builder
	unique := false
	for _, k := range keys {
		if v, ok := m[k]; ok {
			if out == nil {
				out = make(map[string]string, len(keys))
			}
			u := uniqueAnnotations[k]
			if !u {
				v = shared(v)
			}
			out[k] = v
			unique = unique || u
			id.WriteString(k)
			id.WriteByte(0)
			id.WriteString(v)
			id.WriteByte(0)
		}
	}
	if out == nil || unique {
		return out
	}
	return interned.get(id.String(), out)
}

// maxInterned bounds the intern table (values such as the mirror-pod hash
// are unique per pod and must not grow it without bound).
const maxInterned = 256

var interned = &internTable{m: map[string]map[string]string{}}

type internTable struct {
	mu sync.Mutex
	m  map[string]map[string]string
}

func (t *internTable) get(id string, m map[string]string) map[string]string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if shared, ok := t.m[id]; ok {
		return shared
	}
	if len(t.m) < maxInterned {
		t.m[id] = m
	}
	return m
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

// slimPodConditions keeps of a pod's conditions what the detector reads:
// PodReadyToStartContainers (its status and transition), and the node
// verifier's condition (status, reason, probe time; its message only when
// it is evidence against the pod, for the Event).
func slimPodConditions(conds []corev1.PodCondition) []corev1.PodCondition {
	var out []corev1.PodCondition
	for _, c := range conds {
		switch c.Type {
		case corev1.PodReadyToStartContainers:
			out = append(out, corev1.PodCondition{Type: c.Type, Status: c.Status, LastTransitionTime: c.LastTransitionTime})
		case annotations.ConditionRedirectVerified:
			k := corev1.PodCondition{Type: c.Type, Status: c.Status, Reason: c.Reason,
				LastProbeTime: c.LastProbeTime, LastTransitionTime: c.LastTransitionTime}
			if c.Status == corev1.ConditionFalse {
				k.Message = c.Message
			}
			out = append(out, k)
		}
	}
	return out
}

// slimNodeConditions keeps the node verifier's condition (status, reason,
// heartbeat) of a Node's conditions.
func slimNodeConditions(conds []corev1.NodeCondition) []corev1.NodeCondition {
	for _, c := range conds {
		if c.Type == annotations.NodeConditionCNIVerified {
			return []corev1.NodeCondition{{Type: c.Type, Status: c.Status, Reason: c.Reason, LastHeartbeatTime: c.LastHeartbeatTime}}
		}
	}
	return nil
}
