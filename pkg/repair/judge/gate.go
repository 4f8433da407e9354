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
	// became ready rather than a stand-in: under the cni-pod gate always
	// (its baseline, or the fallback to the installer's container start,
	// which is never later); under the node-label gate only a valid
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
	// ObserveCNI records what node's CNI pods show now (the controller
	// calls it on every event of a CNI pod there): the cni-pod gate keeps
	// its baseline over a not-ready spell of a running installer shorter
	// than FlapBound and drops it once a spell has lasted that long. It
	// returns when to call it again for the current spell to reach the
	// bound (zero: no need). The other gates keep no such memory.
	ObserveCNI(node string) (again time.Duration)
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
		return newCNIPodGate(cniPods)
	case GateNone:
		return noGate{start: start}
	default:
		g := &nodeLabelGate{nodes: nodes, cniPods: cniPods, start: start, since: map[string]time.Time{}, now: time.Now}
		if wouldLabel {
			g.wouldLabel = newCNIPodGate(cniPods)
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
	if g.wouldLabel != nil {
		g.wouldLabel.Forget(name)
	}
}

func (g *nodeLabelGate) ObserveCNI(name string) time.Duration {
	if g.wouldLabel == nil {
		return 0
	}
	return g.wouldLabel.ObserveCNI(name)
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

// cniPodGate: open when a CNI DaemonSet pod on the node is Ready. Its "since"
// is the node's baseline as ReadySince keeps it, recorded in memory here
// since no Node annotation holds it: kept over a not-ready spell of a
// running installer shorter than FlapBound, moved when one of the CNI pod's
// containers started later, dropped once a spell has lasted FlapBound (the
// next Ready CNI pod then dates a new one), so a flapping installer does
// not re-date the node's readiness at each flap. The gate sees spells
// through its own calls and the CNI pod informer's events (ObserveCNI),
// measured as node readiness measures them: from the not-Ready pod's Ready
// transition, read from the pod, to the moment of the look. A spell it
// never looked at FlapBound or more into keeps the baseline: a baseline kept
// too long only makes pods count for the breaker instead of the race lane
// (fewer actions), one dropped too early would do the reverse.
//
// A node the gate holds nothing for (a controller just started, `repair
// audit`) falls back to the start of the Ready CNI pod's latest container
// (lastStart): never later than the baseline the memory would give, which
// ReadySince moves only forward from there, so the race lane takes no pod
// the memory would not have given it. A node seen without a running
// installer needs no fallback: whatever runs there next dates its
// readiness anew, as ReadySince would move it by its container start
// anyway.
type cniPodGate struct {
	pods cache.Indexer
	now  func() time.Time

	mu sync.Mutex
	// since is the baseline per node; a zero time: none, the next Ready
	// CNI pod dates one. A node missing here falls back (see above).
	since map[string]time.Time
}

func newCNIPodGate(pods cache.Indexer) *cniPodGate {
	return &cniPodGate{pods: pods, now: time.Now, since: map[string]time.Time{}}
}

func (g *cniPodGate) Mode() GateMode { return GateCNIPod }

func (g *cniPodGate) Open(node string) (bool, time.Time) {
	since, open, _ := g.observe(node)
	if !open {
		return false, time.Time{}
	}
	if now := g.now(); since.After(now) {
		since = now // another node's clock: never in the future
	}
	return true, since
}

func (g *cniPodGate) ObserveCNI(node string) time.Duration {
	_, _, again := g.observe(node)
	return again
}

// observe brings node's baseline in line with its CNI pods now: with a
// Ready one, ReadySince from the recorded baseline (or the fallback);
// without, a not-ready spell of a running installer that has lasted
// FlapBound, or no running installer, drops it, and a shorter spell keeps
// it and says when it reaches the bound.
func (g *cniPodGate) observe(node string) (since time.Time, open bool, again time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if pod := ReadyCNIPod(g.pods, node); pod != nil {
		recorded, ok := g.since[node]
		if !ok {
			recorded = lastStart(pod)
		}
		since, _ = ReadySince(recorded, pod)
		g.since[node] = since
		return since, true, 0
	}
	start, running := NotReadySpell(g.pods, node)
	if !running {
		g.since[node] = time.Time{}
		return time.Time{}, false, 0
	}
	if start.IsZero() {
		return time.Time{}, false, FlapBound // not dated: kept, looked at again
	}
	if spell := g.now().Sub(start); spell < FlapBound {
		return time.Time{}, false, min(FlapBound-spell, FlapBound)
	}
	g.since[node] = time.Time{}
	return time.Time{}, false, 0
}

// NotReadySpell finds a running installer on node that is not Ready (a CNI
// pod neither terminating nor uninstalling, running, its Ready condition not
// True) in pods (indexed with PodNodeIndexers) and returns when its spell
// began, the Ready condition's transition (zero: not known). running is
// false when there is none. The cni-pod gate and node readiness both measure
// a spell against FlapBound with it.
func NotReadySpell(pods cache.Indexer, node string) (start time.Time, running bool) {
	objs, err := pods.ByIndex(IndexByNode, node)
	if err != nil {
		return time.Time{}, false
	}
	for _, o := range objs {
		pod, ok := o.(*corev1.Pod)
		if !ok || pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning || uninstalling(pod) {
			continue
		}
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status != corev1.ConditionTrue {
				return c.LastTransitionTime.Time, true
			}
		}
	}
	return time.Time{}, false
}

func (g *cniPodGate) Dated(string) bool          { return true }
func (g *cniPodGate) Observe(*corev1.Node, bool) {}

func (g *cniPodGate) Forget(node string) {
	g.mu.Lock()
	delete(g.since, node)
	g.mu.Unlock()
}

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

// FlapBound is the longest not-ready spell of a node's installer pod, its
// container running, over which the node keeps its "CNI ready since": under
// the node-label gate node readiness removes the label at once (the gate
// closes) and the cni-ready-since annotation only once the spell has lasted
// FlapBound; the cni-pod gate keeps its baseline in memory the same way. The
// installer's readiness probe runs every 5 s and reports not Ready after 2
// failures, so a passing hiccup (a probe timing out on a loaded node, a
// foreign rewrite of the conflist the installer puts back within
// milliseconds) ends at the next passing probe, 5 to 15 s into the spell; 30
// s is twice that. Longer spells are outages the breaker should not hold
// against the node: pods made during them are of the race, so they date a
// new baseline. A restart is not a flap, whatever its length: a node reboot
// loses every sandbox, so a CNI pod whose container started after the
// baseline moves it (ReadySince). Kept over short spells, the baseline lets
// the breaker count the pods a flapping node breaks instead of the race lane
// taking them at the cluster-wide cap.
const FlapBound = 30 * time.Second

// ReadySince is a node's "CNI ready since", the baseline the gates, the
// breaker, the race lane and node readiness all rest on, defined here only:
// recorded (the node's cni-ready-since annotation, RecordedReadySince, the
// cni-pod gate's memory, or a stand-in for them; zero when there is none)
// moved forward to the readiness of cniPod, the node's Ready CNI pod (nil:
// none known), when one of its running containers started later than
// recorded, to the second (the precision of API times): the installer
// started again since (a node reboot, a restart, a new pod), so the CNI was
// not continuously ready since recorded. A later Ready transition alone, its
// containers running since before, is a readiness flap of a running
// installer and moves nothing: node readiness and the cni-pod gate, which
// see the not-ready spell, drop the baseline of a spell longer than
// FlapBound, so that such a spell dates a new one when the CNI pod is Ready
// again, and keep it over a shorter one. With no recorded time the pod's
// readiness is the baseline.
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
func (noGate) ObserveCNI(string) time.Duration { return 0 }
