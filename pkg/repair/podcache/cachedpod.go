package podcache

import (
	"math"
	"time"
	"unique"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
)

// cachedPod is what the injected-pod informer holds of a pod: the slim pod
// (slimInjectedPod) in a compact form of its own, about a fifth of the
// bytes. A corev1.Pod is a 1,280-byte allocation even when nearly empty,
// and each metav1.Time 24 bytes; here times are Unix nanoseconds, the
// values many pods share (namespace, node, owner, manager, phase, condition
// types and reasons) are unique handles, and the annotations the markers
// share with other pods stay one interned map.
//
// Readers never see it: PodOf expands it to the very slim pod it was made
// from, so the detector, the gate, the breaker and the actions read one
// type (corev1.Pod), the one the audit judges too. It is
// immutable once made.
type cachedPod struct {
	name, podIP string
	ids         cachedIDs
	// appliedAt is the annotation almost every pod has a value of its own
	// for; markers holds the rest (a shared map unless it holds the rare
	// mirror-pod hash, see keep).
	appliedAt       string
	labels, markers map[string]string

	namespace, node, restartPolicy, phase, manager unique.Handle[string]
	owner                                          unique.Handle[ownerRef]

	created, started, written stamp
	// rare is nil but for the few pods with a UID or resourceVersion not
	// in the compact form (ids), or a deletion time.
	rare *rareFields

	conditions []cachedCondition
	// containers are the check init containers (the first nInits) and
	// the summary of every other container (at most one entry): one slice,
	// one header in every cached pod.
	containers []cachedContainer
	nInits     uint16

	hasAppliedAt, hasDeleted, hasStarted, hasWritten, hasOwner, hostNetwork bool
}

// rareFields are what few cached pods hold: the UID and resourceVersion
// as texts (textIDs) when they have no compact form, the deletion time.
type rareFields struct {
	textIDs              bool
	uid, resourceVersion string
	deleted              stamp
}

// rareOf returns c's rare fields, made on first use.
func (c *cachedPod) rareOf() *rareFields {
	if c.rare == nil {
		c.rare = &rareFields{}
	}
	return c.rare
}

func (c *cachedPod) uid() types.UID {
	if c.rare != nil && c.rare.textIDs {
		return types.UID(c.rare.uid)
	}
	return c.ids.UID()
}

func (c *cachedPod) resourceVersion() string {
	if c.rare != nil && c.rare.textIDs {
		return c.rare.resourceVersion
	}
	return c.ids.ResourceVersion()
}

func (c *cachedPod) key() UIDKey {
	if c.rare != nil && c.rare.textIDs {
		return KeyOfUID(types.UID(c.rare.uid))
	}
	return c.ids.key()
}

// stamp is a time as Unix nanoseconds; 0 is the zero time.
type stamp int64

// ownerRef is the controlling owner reference as the slim pod keeps it.
type ownerRef struct{ apiVersion, kind, name, uid string }

type cachedCondition struct {
	typ, status, reason unique.Handle[string]
	message             string
	transition, probe   stamp
}

type cachedContainer struct {
	name         unique.Handle[string]
	restartCount int32
	state, last  cachedState
}

type cachedState struct {
	running, terminated, waiting bool
	exitCode                     int32
	runningSince                 stamp
	termStarted, termFinished    stamp
}

// packPod returns the compact form of a slim pod, and false when a time of
// it does not fit in Unix nanoseconds (years 1678 to 2262): the slim pod is
// then cached as it is.
func packPod(p *corev1.Pod) (*cachedPod, bool) {
	var ok = true
	st := func(t metav1.Time) stamp {
		s, fits := toStamp(t)
		ok = ok && fits
		return s
	}
	c := &cachedPod{
		name: p.Name, podIP: p.Status.PodIP,
		labels: p.Labels, namespace: handle(p.Namespace), node: handle(p.Spec.NodeName),
		restartPolicy: handle(string(p.Spec.RestartPolicy)), phase: handle(string(p.Status.Phase)),
		created: st(p.CreationTimestamp), hostNetwork: p.Spec.HostNetwork,
	}
	c.packAnnotations(p.Annotations)
	var compact bool
	if c.ids, compact = idsOf(p.UID, p.ResourceVersion); !compact {
		r := c.rareOf()
		r.textIDs, r.uid, r.resourceVersion = true, string(p.UID), p.ResourceVersion
	}
	if d := p.DeletionTimestamp; d != nil {
		c.hasDeleted, c.rareOf().deleted = true, st(*d)
	}
	if s := p.Status.StartTime; s != nil {
		c.hasStarted, c.started = true, st(*s)
	}
	if len(p.ManagedFields) == 1 && p.ManagedFields[0].Time != nil {
		c.hasWritten, c.manager, c.written = true, handle(p.ManagedFields[0].Manager), st(*p.ManagedFields[0].Time)
	}
	if len(p.OwnerReferences) == 1 {
		r := p.OwnerReferences[0]
		c.hasOwner, c.owner = true, unique.Make(ownerRef{r.APIVersion, r.Kind, r.Name, string(r.UID)})
	}
	for _, k := range p.Status.Conditions {
		c.conditions = append(c.conditions, cachedCondition{typ: handle(string(k.Type)), status: handle(string(k.Status)),
			reason: handle(k.Reason), message: k.Message, transition: st(k.LastTransitionTime), probe: st(k.LastProbeTime)})
	}
	c.containers = packContainers(p.Status.InitContainerStatuses, p.Status.ContainerStatuses, st)
	if len(p.Status.InitContainerStatuses) > math.MaxUint16 {
		return nil, false
	}
	c.nInits = uint16(len(p.Status.InitContainerStatuses))
	return c, ok
}

// packAnnotations keeps cni-applied-at apart from the map of the others,
// which is then shared (interned) with the pods that carry the same markers.
func (c *cachedPod) packAnnotations(m map[string]string) {
	c.appliedAt, c.hasAppliedAt = m[annotations.KeyCNIAppliedAt]
	if !c.hasAppliedAt {
		c.markers = m
		return
	}
	rest := make(map[string]string, len(m))
	for k, v := range m {
		if k != annotations.KeyCNIAppliedAt {
			rest[k] = v
		}
	}
	c.markers = keep(rest, keptPodAnnotations)
}

func packContainers(inits, others []corev1.ContainerStatus, st func(metav1.Time) stamp) []cachedContainer {
	if len(inits)+len(others) == 0 {
		return nil
	}
	out := make([]cachedContainer, 0, len(inits)+len(others))
	for _, list := range [][]corev1.ContainerStatus{inits, others} {
		for i := range list {
			out = append(out, cachedContainer{name: handle(list[i].Name), restartCount: list[i].RestartCount,
				state: packState(list[i].State, st), last: packState(list[i].LastTerminationState, st)})
		}
	}
	return out
}

func packState(s corev1.ContainerState, st func(metav1.Time) stamp) cachedState {
	var out cachedState
	if r := s.Running; r != nil {
		out.running, out.runningSince = true, st(r.StartedAt)
	}
	if t := s.Terminated; t != nil {
		out.terminated, out.exitCode, out.termStarted, out.termFinished = true, t.ExitCode, st(t.StartedAt), st(t.FinishedAt)
	}
	out.waiting = s.Waiting != nil
	return out
}

// Buffer is the storage one expanded pod at a time lives in. Readers that
// judge every cached pod in turn (the metrics' broken counts, the breaker)
// expand each into the same buffer, so a pass over 100,000 pods leaves no
// garbage behind: the pod is valid until the next PodIn with the buffer.
type Buffer struct {
	pod        corev1.Pod
	times      []metav1.Time
	conditions []corev1.PodCondition
	statuses   []corev1.ContainerStatus
	running    []corev1.ContainerStateRunning
	terminated []corev1.ContainerStateTerminated
	waiting    []corev1.ContainerStateWaiting
	managed    [1]metav1.ManagedFieldsEntry
	owner      [1]metav1.OwnerReference
	ann        map[string]string
}

// time stores t in the buffer and returns its address.
func (b *Buffer) time(s stamp) *metav1.Time {
	b.times = append(b.times, s.time())
	return &b.times[len(b.times)-1]
}

// expand expands c into b and returns b's pod.
func (c *cachedPod) expand(b *Buffer) *corev1.Pod {
	b.times, b.conditions, b.statuses = b.times[:0], b.conditions[:0], b.statuses[:0]
	b.running, b.terminated, b.waiting = b.running[:0], b.terminated[:0], b.waiting[:0]
	b.pod = corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: c.name, Namespace: str(c.namespace), UID: c.uid(),
			ResourceVersion: c.resourceVersion(), CreationTimestamp: c.created.time(), Labels: c.labels,
			Annotations: c.annotationsIn(b)},
		Spec: corev1.PodSpec{NodeName: str(c.node), RestartPolicy: corev1.RestartPolicy(str(c.restartPolicy)),
			HostNetwork: c.hostNetwork},
		Status: corev1.PodStatus{Phase: corev1.PodPhase(str(c.phase)), PodIP: c.podIP},
	}
	p := &b.pod
	if c.hasDeleted {
		p.DeletionTimestamp = b.time(c.rare.deleted)
	}
	if c.hasStarted {
		p.Status.StartTime = b.time(c.started)
	}
	if c.hasWritten {
		b.managed[0] = metav1.ManagedFieldsEntry{Manager: str(c.manager), Time: b.time(c.written),
			FieldsType: "FieldsV1", FieldsV1: statusFields}
		p.ManagedFields = b.managed[:]
	}
	if c.hasOwner {
		r := c.owner.Value()
		b.owner[0] = metav1.OwnerReference{APIVersion: r.apiVersion, Kind: r.kind, Name: r.name,
			UID: types.UID(r.uid), Controller: &isController}
		p.OwnerReferences = b.owner[:]
	}
	for _, k := range c.conditions {
		b.conditions = append(b.conditions, corev1.PodCondition{Type: corev1.PodConditionType(str(k.typ)),
			Status: corev1.ConditionStatus(str(k.status)), Reason: str(k.reason), Message: k.message,
			LastTransitionTime: k.transition.time(), LastProbeTime: k.probe.time()})
	}
	if len(b.conditions) > 0 {
		p.Status.Conditions = b.conditions
	}
	p.Status.InitContainerStatuses = b.containers(c.containers[:c.nInits])
	p.Status.ContainerStatuses = b.containers(c.containers[c.nInits:])
	return p
}

// annotationsIn returns the pod's annotations: the markers as they are, or
// with cni-applied-at a copy in the buffer's map.
func (c *cachedPod) annotationsIn(b *Buffer) map[string]string {
	if !c.hasAppliedAt {
		return c.markers
	}
	if b.ann == nil {
		b.ann = make(map[string]string, len(c.markers)+2)
	}
	clear(b.ann)
	for k, v := range c.markers {
		b.ann[k] = v
	}
	b.ann[annotations.KeyCNIAppliedAt] = c.appliedAt
	return b.ann
}

func (b *Buffer) containers(list []cachedContainer) []corev1.ContainerStatus {
	if len(list) == 0 {
		return nil
	}
	first := len(b.statuses)
	for _, cs := range list {
		b.statuses = append(b.statuses, corev1.ContainerStatus{Name: str(cs.name), RestartCount: cs.restartCount,
			State: b.state(cs.state), LastTerminationState: b.state(cs.last)})
	}
	return b.statuses[first:len(b.statuses):len(b.statuses)]
}

func (b *Buffer) state(s cachedState) corev1.ContainerState {
	var out corev1.ContainerState
	if s.running {
		b.running = append(b.running, corev1.ContainerStateRunning{StartedAt: s.runningSince.time()})
		out.Running = &b.running[len(b.running)-1]
	}
	if s.terminated {
		b.terminated = append(b.terminated, corev1.ContainerStateTerminated{ExitCode: s.exitCode,
			StartedAt: s.termStarted.time(), FinishedAt: s.termFinished.time()})
		out.Terminated = &b.terminated[len(b.terminated)-1]
	}
	if s.waiting {
		b.waiting = append(b.waiting, corev1.ContainerStateWaiting{})
		out.Waiting = &b.waiting[len(b.waiting)-1]
	}
	return out
}

// handle is the unique handle of s (the zero handle for "").
func handle(s string) unique.Handle[string] {
	if s == "" {
		return unique.Handle[string]{}
	}
	return unique.Make(s)
}

// str is the string of a handle ("" for the zero handle).
func str(h unique.Handle[string]) string {
	if h == (unique.Handle[string]{}) {
		return ""
	}
	return h.Value()
}

// toStamp converts t, reporting whether it fits.
func toStamp(t metav1.Time) (stamp, bool) {
	if t.IsZero() {
		return 0, true
	}
	const minSec, maxSec = math.MinInt64/int64(time.Second) + 1, math.MaxInt64/int64(time.Second) - 1
	if s := t.Unix(); s < minSec || s > maxSec || t.UnixNano() == 0 {
		return 0, false
	}
	return stamp(t.UnixNano()), true
}

func (s stamp) time() metav1.Time {
	if s == 0 {
		return metav1.Time{}
	}
	return metav1.NewTime(time.Unix(0, int64(s)))
}

func (s stamp) timePtr() *metav1.Time {
	t := s.time()
	return &t
}

// The informer keys, indexes and stores a cachedPod as an object: a
// runtime.Object whose metadata accessor gives its namespace, name, UID,
// resourceVersion and labels.

func (c *cachedPod) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

func (c *cachedPod) DeepCopyObject() runtime.Object {
	out := *c // immutable: the copy may share everything
	return &out
}

func (c *cachedPod) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Name: c.name, Namespace: str(c.namespace), UID: c.uid(),
		ResourceVersion: c.resourceVersion(), Labels: c.labels}
}

// PodOf returns the pod an informer or indexer object stands for: a
// cachedPod expanded, a pod as it is, the last state of a tombstone.
func PodOf(obj interface{}) (*corev1.Pod, bool) { return PodIn(obj, &Buffer{}) }

// PodIn is PodOf expanding into b (valid until b's next use).
func PodIn(obj interface{}, b *Buffer) (*corev1.Pod, bool) {
	c, p := unwrap(obj)
	if c != nil {
		return c.expand(b), true
	}
	return p, p != nil
}

// UIDOf returns the UID of an informer or indexer object without
// expanding it.
func UIDOf(obj interface{}) (types.UID, bool) {
	c, p := unwrap(obj)
	if c != nil {
		return c.uid(), true
	}
	if p != nil {
		return p.UID, true
	}
	return "", false
}

// KeyOf returns the UIDKey of an informer or indexer object without
// allocating.
func KeyOf(obj interface{}) (UIDKey, bool) {
	c, p := unwrap(obj)
	if c != nil {
		return c.key(), true
	}
	if p != nil {
		return KeyOfUID(p.UID), true
	}
	return UIDKey{}, false
}

// unwrap returns what an informer or indexer object holds (the last state
// of a tombstone): a compact pod, or a pod as it is; neither for anything
// else.
func unwrap(obj interface{}) (*cachedPod, *corev1.Pod) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	switch o := obj.(type) {
	case *cachedPod:
		return o, nil
	case *corev1.Pod:
		return nil, o
	}
	return nil, nil
}

// Indexers index the injected-pod informer's objects by node
// (judge.IndexByNode), cachedPods and pods alike.
func Indexers() cache.Indexers {
	return cache.Indexers{judge.IndexByNode: func(obj interface{}) ([]string, error) {
		node := ""
		switch o := obj.(type) {
		case *cachedPod:
			node = str(o.node)
		case *corev1.Pod:
			node = o.Spec.NodeName
		}
		if node == "" {
			return nil, nil
		}
		return []string{node}, nil
	}}
}
