package judge

import (
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
)

// IndexByNode is the index of pods by spec.nodeName (PodNodeIndexers).
const IndexByNode = "byNode"

// PodNodeIndexers index pods by spec.nodeName, as the gate's CNI pod
// indexer must be.
func PodNodeIndexers() cache.Indexers {
	return cache.Indexers{IndexByNode: func(obj interface{}) ([]string, error) {
		pod, ok := obj.(*corev1.Pod)
		if !ok || pod.Spec.NodeName == "" {
			return nil, nil
		}
		return []string{pod.Spec.NodeName}, nil
	}}
}

// Gate tells whether a node's CNI is ready now. Acting on a node whose CNI is
// not ready would only make the owner recreate a pod that bypasses again.
type Gate interface {
	// Open reports whether the node's CNI is ready now and, if so, since
	// when (ReadySince; as precisely as known; never in the future).
	Open(node string) (bool, time.Time)
	// Dated reports whether Open's "since" for node is the moment its CNI
	// became ready rather than a stand-in: under the cni-pod gate the CNI
	// pod's readiness; under the node-label gate only a valid
	// cni-ready-since annotation on the labelled node (not the time this
	// process first saw the label), or in a dry run the CNI pod the label
	// would follow; never without a gate.
	Dated(node string) bool
	// Observe records a node as the node informer delivers it (initial:
	// of its initial list) and Forget drops a deleted one: the node-label
	// gate dates a label it cannot read a time for by when it first saw
	// it. The other gates keep no state.
	Observe(node *corev1.Node, initial bool)
	Forget(node string)
	Mode() GateMode
}

// NewGate builds the gate of mode. nodes is needed for node-label, cniPods
// (indexed with PodNodeIndexers) for cni-pod; start is used as the "since"
// of nodes whose readiness predates what the gate can date. With
// wouldLabel (a dry run with node readiness, the CNI pods cached in
// cniPods), the node-label gate also opens a node that is not labelled but
// that node readiness would have labelled (a Ready CNI pod on it): a dry run
// writes no label, and an audit that waited for one would never report
// anything.
func NewGate(mode GateMode, nodes corelisters.NodeLister, cniPods cache.Indexer, start time.Time, wouldLabel bool) Gate {
	switch mode {
	case GateCNIPod:
		return &cniPodGate{pods: cniPods}
	case GateNone:
		return noGate{start: start}
	default:
		g := &nodeLabelGate{nodes: nodes, cniPods: cniPods, start: start, since: map[string]time.Time{}, now: time.Now}
		if wouldLabel {
			g.wouldLabel = &cniPodGate{pods: cniPods}
		}
		return g
	}
}

// nodeLabelGate: open when the node is labelled consul.hashicorp.com/cni=ready.
// "since" is the node's cni-ready-since annotation, written with the label
// by the node-readiness controller, so a restart or a failover keeps it.
// Without a valid one (a label set by someone else, a dry run) it is when
// this process first saw the label (Observe from the node informer's
// handlers), or start for nodes labelled before this process ran. When the
// CNI pods are cached, a Ready CNI pod on the node whose readiness (see
// ReadySince) is later than that moves it forward: the CNI was not
// continuously ready since the annotation (a node reboot), and node readiness
// moves the annotation to the same time, so the gate does not wait for that
// patch and both give the cni-pod gate's baseline.
type nodeLabelGate struct {
	nodes corelisters.NodeLister
	// cniPods, when not nil, are the CNI pods indexed by node.
	cniPods cache.Indexer
	start   time.Time
	now     func() time.Time
	// wouldLabel, in a dry run with node readiness, opens a node that is
	// not labelled but that node readiness would have labelled (NewGate).
	wouldLabel *cniPodGate

	mu    sync.Mutex
	since map[string]time.Time
}

func (g *nodeLabelGate) Mode() GateMode { return GateNodeLabel }

func (g *nodeLabelGate) Open(name string) (bool, time.Time) {
	node, err := g.nodes.Get(name)
	if err != nil {
		return false, time.Time{}
	}
	if open, since := g.observe(node, false); open || g.wouldLabel == nil {
		return open, since
	}
	return g.wouldLabel.Open(name)
}

func (g *nodeLabelGate) Dated(name string) bool {
	n, err := g.nodes.Get(name)
	if err != nil {
		return false
	}
	if !LabelledReady(n) {
		return g.wouldLabel != nil
	}
	_, ok := RecordedReadySince(n)
	return ok
}

func (g *nodeLabelGate) Observe(node *corev1.Node, initial bool) { g.observe(node, initial) }

// observe records the node's label state and returns the gate's view of it;
// initial is true for nodes of the informer's initial list.
func (g *nodeLabelGate) observe(node *corev1.Node, initial bool) (bool, time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !LabelledReady(node) {
		delete(g.since, node.Name)
		return false, time.Time{}
	}
	t, ok := RecordedReadySince(node)
	if ok {
		g.since[node.Name] = t
	} else if t, ok = g.since[node.Name]; !ok {
		t = g.now()
		if initial || t.Before(g.start) {
			t = g.start
		}
		g.since[node.Name] = t
	}
	if g.cniPods != nil {
		t, _ = ReadySince(t, ReadyCNIPod(g.cniPods, node.Name))
	}
	if now := g.now(); t.After(now) {
		t = now // another node's clock: never in the future
	}
	return true, t
}

func (g *nodeLabelGate) Forget(name string) {
	g.mu.Lock()
	delete(g.since, name)
	g.mu.Unlock()
}

// RecordedReadySince returns the node's cni-ready-since annotation, when it
// holds a valid time: the baseline node readiness recorded (see ReadySince).
func RecordedReadySince(node *corev1.Node) (time.Time, bool) {
	v, ok := node.Annotations[annotations.AnnotationCNIReadySince]
	if !ok {
		return time.Time{}, false
	}
	t, err := annotations.ParseTime(annotations.AnnotationCNIReadySince, v)
	return t, err == nil
}

// LabelledReady reports whether node carries the CNI readiness label.
func LabelledReady(node *corev1.Node) bool {
	return node.Labels[annotations.LabelCNIReady] == annotations.LabelCNIReadyValue
}

// cniPodGate: open when a CNI DaemonSet pod on the node is Ready; since is
// that pod's Ready transition time.
type cniPodGate struct{ pods cache.Indexer }

func (g *cniPodGate) Mode() GateMode { return GateCNIPod }

func (g *cniPodGate) Open(node string) (bool, time.Time) {
	pod := ReadyCNIPod(g.pods, node)
	if pod == nil {
		return false, time.Time{}
	}
	since, _ := ReadySince(time.Time{}, pod)
	return true, since
}

func (g *cniPodGate) Dated(string) bool          { return true }
func (g *cniPodGate) Observe(*corev1.Node, bool) {}
func (g *cniPodGate) Forget(string)              {}

// ReadyCNIPod returns a Ready, not terminating CNI pod on node from pods
// (indexed with PodNodeIndexers), or nil. A pod of the installer in
// uninstall mode is never one.
func ReadyCNIPod(pods cache.Indexer, node string) *corev1.Pod {
	objs, err := pods.ByIndex(IndexByNode, node)
	if err != nil {
		return nil
	}
	for _, o := range objs {
		pod, ok := o.(*corev1.Pod)
		if ok && podReady(pod) && !uninstalling(pod) {
			return pod
		}
	}
	return nil
}

// UninstallingCNIPod returns a CNI pod on node that runs the installer in
// uninstall mode (label annotations.LabelInstallerMode), nil when there is
// none. Such a pod is never a ready CNI pod, whatever its readiness.
func UninstallingCNIPod(pods cache.Indexer, node string) *corev1.Pod {
	objs, err := pods.ByIndex(IndexByNode, node)
	if err != nil {
		return nil
	}
	for _, o := range objs {
		pod, ok := o.(*corev1.Pod)
		if ok && pod.DeletionTimestamp == nil && uninstalling(pod) {
			return pod
		}
	}
	return nil
}

func uninstalling(pod *corev1.Pod) bool {
	return pod.Labels[annotations.LabelInstallerMode] == annotations.InstallerModeUninstall
}

// podReady reports whether pod is Ready, running and not being deleted.
func podReady(pod *corev1.Pod) bool {
	if pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// ReadySince is a node's "CNI ready since", the baseline the gates, the
// breaker, the race lane and node readiness all rest on, defined here only:
// recorded (the node's cni-ready-since annotation, RecordedReadySince, or a
// stand-in for it; zero when there is none) moved forward to the readiness
// of cniPod, the node's Ready CNI pod (nil: none known), when one of its
// running containers started later than recorded, to the second (the
// precision of API times): the installer started again since (a node
// reboot, a restart, a new pod), so the CNI was not continuously ready since
// recorded. A later Ready transition alone, its containers running since
// before, is a readiness flap of a running installer and moves nothing: node
// readiness, which sees the not-ready spell, removes the annotation of a
// spell longer than its bound (nodeready.FlapBound), so that such a spell
// dates a new baseline when the CNI pod is Ready again, and keeps it over a
// shorter one. With no recorded time the pod's readiness is the baseline.
// moved says whether it was moved; node readiness then moves the annotation,
// guarded by a test of the value it replaces. The result is not clamped to
// now: the gates clamp what they return, node readiness writes it as is
// (clamped, a later patch would move it again and again while the clocks
// differ).
func ReadySince(recorded time.Time, cniPod *corev1.Pod) (since time.Time, moved bool) {
	if cniPod == nil {
		return recorded, false
	}
	if !recorded.IsZero() && !lastStart(cniPod).Truncate(time.Second).After(recorded) {
		return recorded, false // no restart since: at most a readiness flap
	}
	if r := podReadySince(cniPod); r.Truncate(time.Second).After(recorded) {
		return r, true
	}
	return recorded, false
}

// podReadySince dates since when a Ready CNI pod has been continuously ready:
// its Ready transition, unless one of its containers is running since a later
// time. The installer chains consul-cni when it starts, so a container start
// is the last moment the chain was (re)written; a node reboot (kubelet and
// runtime restarted, every sandbox lost) restarts it. The Ready transition
// alone can miss that: when the kubelet is down while the container
// restarts, the first status it writes may already say Ready, and the
// condition keeps its old transition time. The other signs of a restart the
// controller could see are weaker: the Node's status.nodeInfo.bootID changes
// only on a real reboot (not when kubelet and the runtime restart) and its
// change is seen only by a process that watched across it, and a
// container's restartCount says that it restarted but not when. Container
// start times are on the pod, read by every process the same way.
func podReadySince(pod *corev1.Pod) time.Time {
	t := lastStart(pod)
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady && c.LastTransitionTime.After(t) {
			t = c.LastTransitionTime.Time
		}
	}
	return t
}

// lastStart is the latest start of pod's running containers (zero: none
// known).
func lastStart(pod *corev1.Pod) time.Time {
	var t time.Time
	for i := range pod.Status.ContainerStatuses {
		if r := pod.Status.ContainerStatuses[i].State.Running; r != nil && r.StartedAt.After(t) {
			t = r.StartedAt.Time
		}
	}
	return t
}

type noGate struct{ start time.Time }

func (noGate) Mode() GateMode                  { return GateNone }
func (g noGate) Open(string) (bool, time.Time) { return true, g.start }
func (noGate) Dated(string) bool               { return false }
func (noGate) Observe(*corev1.Node, bool)      {}
func (noGate) Forget(string)                   {}
