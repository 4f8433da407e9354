package repair

import (
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
)

// indexByNode indexes pods by spec.nodeName.
const indexByNode = "byNode"

// podNodeIndexer indexes pods by spec.nodeName.
func podNodeIndexer() cache.Indexers {
	return cache.Indexers{indexByNode: func(obj interface{}) ([]string, error) {
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
	// when (as precisely as known; never in the future).
	Open(node string) (bool, time.Time)
	Mode() GateMode
}

// newGate builds the gate of mode. nodes is needed for node-label, cniPods
// (indexed with podNodeIndexer) for cni-pod; start is used as the "since" of
// nodes whose readiness predates what the gate can date.
func newGate(mode GateMode, nodes corelisters.NodeLister, cniPods cache.Indexer, start time.Time) Gate {
	switch mode {
	case GateCNIPod:
		return &cniPodGate{pods: cniPods}
	case GateNone:
		return noGate{start: start}
	default:
		return &nodeLabelGate{nodes: nodes, cniPods: cniPods, start: start, since: map[string]time.Time{}, now: time.Now}
	}
}

// nodeLabelGate: open when the node is labelled consul.hashicorp.com/cni=ready.
// "since" is the node's cni-ready-since annotation, written with the label
// by the node-readiness controller, so a restart or a failover keeps it.
// Without a valid one (a label set by someone else, a dry run) it is when
// this process first saw the label (Observe from the node informer's
// handlers), or start for nodes labelled before this process ran. When the
// CNI pods are cached, a Ready CNI pod on the node whose readiness (see
// readySince) is later than that moves it forward: the CNI was not
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
	// not labelled but that node readiness would have labelled (a Ready
	// CNI pod on it): it writes no label then, and an audit that waits
	// for one would never report anything.
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
	if open, since := g.Observe(node, false); open || g.wouldLabel == nil {
		return open, since
	}
	return g.wouldLabel.Open(name)
}

// Observe records the node's label state; initial is true for nodes of the
// informer's initial list.
func (g *nodeLabelGate) Observe(node *corev1.Node, initial bool) (bool, time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !nodeLabelledReady(node) {
		delete(g.since, node.Name)
		return false, time.Time{}
	}
	t, ok := nodeReadySince(node)
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
		if pod := readyCNIPod(g.cniPods, node.Name); pod != nil {
			if r := readySince(pod); r.After(t) {
				t = r
			}
		}
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

// nodeReadySince returns the node's cni-ready-since annotation, when it
// holds a valid time.
func nodeReadySince(node *corev1.Node) (time.Time, bool) {
	v, ok := node.Annotations[annotations.AnnotationCNIReadySince]
	if !ok {
		return time.Time{}, false
	}
	t, err := annotations.ParseTime(annotations.AnnotationCNIReadySince, v)
	return t, err == nil
}

// nodeLabelledReady reports whether node carries the CNI readiness label.
func nodeLabelledReady(node *corev1.Node) bool {
	return node.Labels[annotations.LabelCNIReady] == annotations.LabelCNIReadyValue
}

// cniPodGate: open when a CNI DaemonSet pod on the node is Ready; since is
// that pod's Ready transition time.
type cniPodGate struct{ pods cache.Indexer }

func (g *cniPodGate) Mode() GateMode { return GateCNIPod }

func (g *cniPodGate) Open(node string) (bool, time.Time) {
	pod := readyCNIPod(g.pods, node)
	if pod == nil {
		return false, time.Time{}
	}
	return true, readySince(pod)
}

// readyCNIPod returns a Ready, not terminating CNI pod on node, or nil.
func readyCNIPod(pods cache.Indexer, node string) *corev1.Pod {
	objs, err := pods.ByIndex(indexByNode, node)
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

// uninstallingCNIPod returns a CNI pod on node that runs the installer in
// uninstall mode (label annotations.LabelInstallerMode), nil when there is
// none. Such a pod is never a ready CNI pod, whatever its readiness.
func uninstallingCNIPod(pods cache.Indexer, node string) *corev1.Pod {
	objs, err := pods.ByIndex(indexByNode, node)
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

// readySince dates since when a Ready CNI pod has been continuously ready:
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
func readySince(pod *corev1.Pod) time.Time {
	var t time.Time
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			t = c.LastTransitionTime.Time
		}
	}
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
