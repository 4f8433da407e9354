// Package nodeready is the node-readiness controller, the "prevent" layer of
// the repair Deployment: it labels a node consul.hashicorp.com/cni=ready,
// with the time in its consul.hashicorp.com/cni-ready-since annotation, and
// removes the node's startup taint once the consul-cni installer pod on it is
// Ready (consul-cni chained for real), so that injected pods that require the
// label, or do not tolerate the taint, wait instead of starting outside the
// mesh. When that pod is gone or not Ready it removes the label and the
// annotation (and re-adds the taint when asked); when an installer pod in
// uninstall mode runs there it removes label and taint, so that nothing
// waits for a plugin being removed.
//
// The annotation is the node's "CNI ready since" (judge.ReadySince): written
// with the label, kept while the CNI stays ready and over a not-ready spell
// of a running installer shorter than judge.FlapBound, moved forward when the CNI
// pod started again later (a node reboot, a new pod), removed with the label
// or once a spell outlasts judge.FlapBound, so that the gates and the circuit
// breaker of every replica, after a restart or a failover, read the same
// baseline, and a flapping installer readiness does not reset it. Every change is one JSON patch that tests the values it
// replaces: a concurrent change makes it fail and retry on fresh data
// instead of overwriting. In a dry run it patches nothing and says once per
// node and decision what it would change (log, Normal Event).
package nodeready

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/placement"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/metrics"
)

// Node Event reasons of the node-readiness controller.
const (
	// EventCNIReady (Normal, node): labelled ready and/or untainted.
	EventCNIReady = "CNIReady"
	// EventCNINotReady (Warning, node): readiness label removed (and the
	// startup taint re-added when asked).
	EventCNINotReady = "CNINotReady"
	// EventWouldMarkCNIReady and EventWouldMarkCNINotReady (Normal, node):
	// dry run, the changes the two above would have made.
	EventWouldMarkCNIReady    = "WouldMarkCNIReady"
	EventWouldMarkCNINotReady = "WouldMarkCNINotReady"
	// EventCNIUninstalled (Normal, node): an installer pod in uninstall mode
	// runs on the node; readiness label and startup taint removed.
	EventCNIUninstalled = "CNIUninstalled"
	// EventStartupTaintLifted (Warning, node): no watched CNI DaemonSet
	// targets or tolerates the node, so no CNI pod will come to lift its
	// startup taint: lifted, the message says why.
	EventStartupTaintLifted = "StartupTaintLifted"
)

// LiftGrace is how long after a node's creation a startup taint that no
// CNI pod will come to lift is kept: labels that select the node for a CNI
// DaemonSet may be set just after it registers.
const LiftGrace = 2 * time.Minute

// Config is what node readiness needs of the controller's settings.
type Config struct {
	// DryRun: patch nothing, say what would change.
	DryRun bool
	// CNINamespace and CNIPodSelector select the CNI pods (for logs and
	// Events: the informer is given to New).
	CNINamespace   string
	CNIPodSelector string
	// StartupTaintKey is the startup taint removed (any effect) once the
	// node's CNI is ready, and re-added with StartupTaintEffect when it is
	// not and ReaddStartupTaint is set.
	StartupTaintKey    string
	ReaddStartupTaint  bool
	StartupTaintEffect corev1.TaintEffect
}

// Metrics are where node readiness counts: the node_readiness_changes_total
// counter (labels change and result, metrics.LabelChange and
// metrics.LabelResult) and the provider of its workqueue's metrics.
type Metrics struct {
	Changes   *prometheus.CounterVec
	Workqueue workqueue.MetricsProvider
}

// Controller labels a node consul.hashicorp.com/cni=ready and removes its
// startup taint when the CNI DaemonSet pod on it is Ready, and removes the
// label when that pod is gone or not Ready. Every patch is a JSON patch that
// tests the current value it changes, so a concurrent change makes it fail
// and retry on fresh data instead of overwriting.
type Controller struct {
	cfg     Config
	client  kubernetes.Interface
	nodes   corelisters.NodeLister
	cniPods cache.Indexer
	// daemonSets are the CNI DaemonSets' namespace's DaemonSets (nil: the
	// startup taint of a node no CNI pod will come to is not lifted).
	daemonSets cache.Indexer
	liftGrace  time.Duration
	flapBound  time.Duration
	recorder   record.EventRecorder
	metrics    Metrics
	queue      workqueue.TypedRateLimitingInterface[string]
	synced     []cache.InformerSynced
	now        func() time.Time

	mu sync.Mutex
	// dryRun is the last change reported per node in dry run.
	dryRun map[string]string
}

// New wires the node-readiness controller to the shared informers of nodes,
// of CNI pods (indexed with judge.PodNodeIndexers) and of the DaemonSets of
// the CNI namespace (nil: no startup taint is lifted for want of a CNI pod).
func New(cfg Config, client kubernetes.Interface, nodes, cniPods, daemonSets cache.SharedIndexInformer, recorder record.EventRecorder, m Metrics) (*Controller, error) {
	if cniPods == nil {
		return nil, errors.New("node readiness needs the CNI pod informer")
	}
	n := &Controller{
		cfg:      cfg,
		client:   client,
		nodes:    corelisters.NewNodeLister(nodes.GetIndexer()),
		cniPods:  cniPods.GetIndexer(),
		recorder: recorder,
		metrics:  m,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](200*time.Millisecond, time.Minute),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "nodes", MetricsProvider: m.Workqueue}),
		synced:    []cache.InformerSynced{nodes.HasSynced, cniPods.HasSynced},
		now:       time.Now,
		dryRun:    map[string]string{},
		liftGrace: LiftGrace,
		flapBound: judge.FlapBound,
	}
	if daemonSets != nil {
		n.daemonSets = daemonSets.GetIndexer()
		n.synced = append(n.synced, daemonSets.HasSynced)
		if _, err := daemonSets.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(interface{}) { n.enqueueTainted() },
			UpdateFunc: func(interface{}, interface{}) { n.enqueueTainted() },
			DeleteFunc: func(interface{}) { n.enqueueTainted() },
		}); err != nil {
			return nil, err
		}
	}
	if _, err := cniPods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: n.enqueueCNIPod,
		UpdateFunc: func(old, obj interface{}) {
			n.enqueueCNIPod(old)
			n.enqueueCNIPod(obj)
		},
		DeleteFunc: n.enqueueCNIPod,
	}); err != nil {
		return nil, err
	}
	if _, err := nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: n.enqueueNode,
		UpdateFunc: func(old, obj interface{}) {
			o, ok1 := old.(*corev1.Node)
			c, ok2 := obj.(*corev1.Node)
			if ok1 && ok2 && o.Labels[annotations.LabelCNIReady] == c.Labels[annotations.LabelCNIReady] &&
				o.Annotations[annotations.AnnotationCNIReadySince] == c.Annotations[annotations.AnnotationCNIReadySince] &&
				hasTaint(o.Spec.Taints, cfg.StartupTaintKey) == hasTaint(c.Spec.Taints, cfg.StartupTaintKey) &&
				!(hasTaint(c.Spec.Taints, cfg.StartupTaintKey) && placementChanged(o, c)) {
				return
			}
			n.enqueueNode(obj)
		},
	}); err != nil {
		return nil, err
	}
	return n, nil
}

func (n *Controller) enqueueCNIPod(obj interface{}) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if pod, ok := obj.(*corev1.Pod); ok && pod.Spec.NodeName != "" {
		n.queue.Add(pod.Spec.NodeName)
	}
}

// enqueueTainted queues every node with the startup taint: a CNI
// DaemonSet changed, and with it where CNI pods will come.
func (n *Controller) enqueueTainted() {
	nodes, err := n.nodes.List(labels.Everything())
	if err != nil {
		return
	}
	for _, node := range nodes {
		if hasTaint(node.Spec.Taints, n.cfg.StartupTaintKey) {
			n.queue.Add(node.Name)
		}
	}
}

// placementChanged: what decides whether a daemon pod runs on the node
// (labels, taints) changed.
func placementChanged(o, c *corev1.Node) bool {
	return !maps.Equal(o.Labels, c.Labels) || !equality.Semantic.DeepEqual(o.Spec.Taints, c.Spec.Taints)
}

func (n *Controller) enqueueNode(obj interface{}) {
	if node, ok := obj.(*corev1.Node); ok {
		n.queue.Add(node.Name)
	}
}

// Run starts workers and blocks until ctx is done.
func (n *Controller) Run(ctx context.Context, workers int) error {
	defer utilruntime.HandleCrashWithContext(ctx)
	defer n.queue.ShutDown()
	logger := klog.FromContext(ctx)
	logger.Info("Starting node readiness controller", "cniNamespace", n.cfg.CNINamespace, "cniPodSelector", n.cfg.CNIPodSelector, "startupTaint", n.cfg.StartupTaintKey)
	if !cache.WaitForNamedCacheSyncWithContext(ctx, n.synced...) {
		if ctx.Err() != nil {
			return nil // shut down while waiting
		}
		return errors.New("node readiness: caches did not sync")
	}
	var wg sync.WaitGroup
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wait.UntilWithContext(ctx, func(ctx context.Context) {
				for n.processNext(ctx) {
				}
			}, time.Second)
		}()
	}
	<-ctx.Done()
	logger.Info("Stopping node readiness controller")
	n.queue.ShutDown()
	wg.Wait()
	return nil
}

func (n *Controller) processNext(ctx context.Context) bool {
	key, shutdown := n.queue.Get()
	if shutdown {
		return false
	}
	defer n.queue.Done(key)
	if err := n.sync(ctx, key); err != nil {
		klog.FromContext(ctx).V(1).Info("Node readiness patch failed; will retry", "node", key, "err", err)
		n.queue.AddRateLimited(key)
		return true
	}
	n.queue.Forget(key)
	return true
}

type jsonOp struct {
	Op    string      `json:"op"`
	Path  string      `json:"path"`
	Value interface{} `json:"value,omitempty"`
}

// sync brings one node's label, ready-since annotation and taint in line
// with its CNI pod (or, in dry run, says what it would change).
func (n *Controller) sync(ctx context.Context, name string) error {
	node, err := n.nodes.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	cniPod := judge.ReadyCNIPod(n.cniPods, name)
	remover := judge.UninstallingCNIPod(n.cniPods, name)
	var ops []jsonOp
	var changes []string
	var lifted string
	switch {
	case remover != nil:
		// The plugin is being removed from the node: nothing may wait for
		// it or select the node for it any more.
		ops, changes = n.notReadyOps(node, false)
		ops, changes = n.removeTaintOps(node, ops, changes)
	case cniPod != nil:
		ops, changes = n.readyOps(node, cniPod)
		ops, changes = n.removeTaintOps(node, ops, changes)
	default:
		ops, changes, lifted = n.withoutCNIPodOps(node)
	}
	if len(ops) == 0 {
		n.forgetDryRun(name)
		return nil
	}
	if n.cfg.DryRun {
		n.reportDryRun(ctx, node, cniPod, changes)
		return nil
	}
	return n.patch(ctx, node, cniPod, remover, lifted, ops, changes)
}

// withoutCNIPodOps: a node without a Ready CNI pod loses the label; its
// startup taint is lifted when no watched CNI DaemonSet will ever run a pod
// there (lifted says why), once the node is LiftGrace old, and otherwise
// re-added when asked.
func (n *Controller) withoutCNIPodOps(node *corev1.Node) (ops []jsonOp, changes []string, lifted string) {
	ops, changes = n.notReadyOps(node, n.shortSpell(node.Name))
	why, none := n.noCNIPodComing(node)
	switch {
	case none && hasTaint(node.Spec.Taints, n.cfg.StartupTaintKey):
		if wait := n.liftGrace - n.now().Sub(node.CreationTimestamp.Time); wait > 0 {
			n.queue.AddAfter(node.Name, wait)
			return ops, changes, ""
		}
		ops, changes = n.removeTaintOps(node, ops, changes)
		return ops, changes, why
	case none:
		// Nothing to re-add: no CNI pod would lift it.
	case n.cfg.ReaddStartupTaint:
		ops, changes = n.addTaintOps(node, ops, changes)
	}
	return ops, changes, ""
}

// noCNIPodComing reports whether CNI DaemonSets (of the CNI namespace, their
// pod template matching the CNI pod selector) exist and none would run a
// pod on node, with each one's reason. Taints the node's lifecycle lifts by
// itself are left out (placement.Transient). No such DaemonSet at all is
// not "none coming": it may be on its way (an install, a re-creation).
func (n *Controller) noCNIPodComing(node *corev1.Node) (why string, none bool) {
	if n.daemonSets == nil {
		return "", false
	}
	sel, err := labels.Parse(n.cfg.CNIPodSelector)
	if err != nil {
		return "", false
	}
	var whys []string
	for _, obj := range n.daemonSets.List() {
		ds, ok := obj.(*appsv1.DaemonSet)
		if !ok || ds.Namespace != n.cfg.CNINamespace || !sel.Matches(labels.Set(ds.Spec.Template.Labels)) {
			continue
		}
		name := "DaemonSet " + ds.Namespace + "/" + ds.Name
		if ds.DeletionTimestamp != nil {
			whys = append(whys, name+" is being deleted")
			continue
		}
		w, fits := placement.DaemonPodFits(&ds.Spec.Template.Spec, node, placement.Transient)
		if fits {
			return "", false
		}
		whys = append(whys, name+" "+w)
	}
	if len(whys) == 0 {
		return "", false
	}
	return strings.Join(whys, "; "), true
}

// readyOps: label the node ready with its ready-since annotation (written
// together, so the breaker's baseline is the label's own time), backfill the
// annotation of a node labelled without one, and keep it meaning
// "continuously ready since, readiness flaps shorter than the flap bound
// aside" (judge.ReadySince): an existing valid one is kept unless one of the
// CNI pod's containers started later, which means the installer started
// again (a node reboot the label and the annotation outlived, maybe while
// this process was down, so it never saw the CNI not ready); then it is
// moved forward to the pod's readiness, guarded by a test of the value it
// replaces.
func (n *Controller) readyOps(node *corev1.Node, cniPod *corev1.Pod) ([]jsonOp, []string) {
	var ops []jsonOp
	var changes []string
	if !judge.LabelledReady(node) {
		ops = append(ops, addMapEntry(node, "labels", node.Labels, annotations.LabelCNIReady, annotations.LabelCNIReadyValue)...)
		changes = append(changes, metrics.ChangeLabelAdded)
	}
	// An annotation kept while the label is missing means a not-ready
	// spell shorter than the flap bound, or the label removed by someone
	// else while the CNI stayed ready (a longer spell or a removal of
	// readiness here removes both): the baseline stands, unless the CNI pod
	// started again since.
	current, ok := judge.RecordedReadySince(node)
	since, moved := judge.ReadySince(current, cniPod)
	switch {
	case !ok:
		since := annotations.FormatTime(n.now())
		ops = append(ops, addMapEntry(node, "annotations", node.Annotations, annotations.AnnotationCNIReadySince, since)...)
		if judge.LabelledReady(node) {
			changes = append(changes, metrics.ChangeReadySinceAdded)
		}
	case moved:
		path := "/metadata/annotations/" + jsonPointerEscape(annotations.AnnotationCNIReadySince)
		ops = append(ops,
			jsonOp{Op: "test", Path: path, Value: node.Annotations[annotations.AnnotationCNIReadySince]},
			jsonOp{Op: "replace", Path: path, Value: annotations.FormatTime(since)})
		changes = append(changes, metrics.ChangeReadySinceMoved)
	}
	return ops, changes
}

// shortSpell reports whether the node's installer is in a not-ready spell
// shorter than the flap bound: a CNI pod there, neither terminating nor
// uninstalling, running but not Ready since less than the bound ago (its
// Ready condition's transition, on the pod, so every process reads the same
// spell). The node is then queued again for when the bound is reached: a
// spell that outlasts it loses the annotation.
func (n *Controller) shortSpell(name string) bool {
	start, running := judge.NotReadySpell(n.cniPods, name)
	if !running || start.IsZero() {
		return false
	}
	spell := n.now().Sub(start)
	if spell >= n.flapBound {
		return false
	}
	n.queue.AddAfter(name, min(n.flapBound-spell, n.flapBound))
	return true
}

// notReadyOps: remove the label and, unless keepSince (a not-ready spell
// shorter than the flap bound), its ready-since annotation.
func (n *Controller) notReadyOps(node *corev1.Node, keepSince bool) ([]jsonOp, []string) {
	var ops []jsonOp
	var changes []string
	if judge.LabelledReady(node) {
		labelPath := "/metadata/labels/" + jsonPointerEscape(annotations.LabelCNIReady)
		ops = append(ops,
			jsonOp{Op: "test", Path: labelPath, Value: annotations.LabelCNIReadyValue},
			jsonOp{Op: "remove", Path: labelPath})
		changes = append(changes, metrics.ChangeLabelRemoved)
	}
	if v, ok := node.Annotations[annotations.AnnotationCNIReadySince]; ok && !keepSince {
		path := "/metadata/annotations/" + jsonPointerEscape(annotations.AnnotationCNIReadySince)
		ops = append(ops, jsonOp{Op: "test", Path: path, Value: v}, jsonOp{Op: "remove", Path: path})
		if !judge.LabelledReady(node) {
			changes = append(changes, metrics.ChangeReadySinceRemoved)
		}
	}
	return ops, changes
}

// removeTaintOps appends the ops that remove the startup taint.
func (n *Controller) removeTaintOps(node *corev1.Node, ops []jsonOp, changes []string) ([]jsonOp, []string) {
	if !hasTaint(node.Spec.Taints, n.cfg.StartupTaintKey) {
		return ops, changes
	}
	kept := make([]corev1.Taint, 0, len(node.Spec.Taints))
	for _, t := range node.Spec.Taints {
		if t.Key != n.cfg.StartupTaintKey {
			kept = append(kept, t)
		}
	}
	ops = append(ops, jsonOp{Op: "test", Path: "/spec/taints", Value: node.Spec.Taints})
	if len(kept) == 0 {
		ops = append(ops, jsonOp{Op: "remove", Path: "/spec/taints"})
	} else {
		ops = append(ops, jsonOp{Op: "replace", Path: "/spec/taints", Value: kept})
	}
	return ops, append(changes, metrics.ChangeTaintRemoved)
}

// addTaintOps appends the ops that add the startup taint back.
func (n *Controller) addTaintOps(node *corev1.Node, ops []jsonOp, changes []string) ([]jsonOp, []string) {
	if hasTaint(node.Spec.Taints, n.cfg.StartupTaintKey) {
		return ops, changes
	}
	taint := corev1.Taint{Key: n.cfg.StartupTaintKey, Effect: n.cfg.StartupTaintEffect}
	if len(node.Spec.Taints) == 0 {
		ops = append(ops,
			jsonOp{Op: "test", Path: "/metadata/resourceVersion", Value: node.ResourceVersion},
			jsonOp{Op: "add", Path: "/spec/taints", Value: []corev1.Taint{taint}})
	} else {
		ops = append(ops,
			jsonOp{Op: "test", Path: "/spec/taints", Value: node.Spec.Taints},
			jsonOp{Op: "add", Path: "/spec/taints/-", Value: taint})
	}
	return ops, append(changes, metrics.ChangeTaintAdded)
}

// addMapEntry returns the ops that set key=value in the node's labels or
// annotations (field). Adding the whole map when the node has none would
// replace any the node got meanwhile: only on the version that has none.
func addMapEntry(node *corev1.Node, field string, m map[string]string, key, value string) []jsonOp {
	if m == nil {
		return []jsonOp{
			{Op: "test", Path: "/metadata/resourceVersion", Value: node.ResourceVersion},
			{Op: "add", Path: "/metadata/" + field, Value: map[string]string{key: value}},
		}
	}
	return []jsonOp{{Op: "add", Path: "/metadata/" + field + "/" + jsonPointerEscape(key), Value: value}}
}

// patch sends the JSON patch and reports it (metrics, log, Event).
func (n *Controller) patch(ctx context.Context, node *corev1.Node, cniPod, remover *corev1.Pod, lifted string, ops []jsonOp, changes []string) error {
	name := node.Name
	patch, err := json.Marshal(ops)
	if err != nil {
		return err
	}
	logger := klog.FromContext(ctx).WithValues("node", name, "changes", changes)
	_, err = n.client.CoreV1().Nodes().Patch(ctx, name, types.JSONPatchType, patch, metav1.PatchOptions{})
	result := metrics.ResultSuccess
	if err != nil {
		result = metrics.ResultFailure
	}
	for _, c := range changes {
		n.metrics.Changes.WithLabelValues(c, result).Inc()
	}
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		// 422 (a test op failed) or 409: the cache was stale; retry
		// once the informer has the current node.
		return fmt.Errorf("patch node %s: %w", name, err)
	}
	desc := n.describeChanges(changes)
	switch {
	case remover != nil:
		logger.Info("Node CNI uninstalling", "cniPod", klog.KObj(remover))
		n.recorder.Eventf(node, corev1.EventTypeNormal, EventCNIUninstalled,
			"CNI pod %s/%s removes consul-cni from this node: %s", remover.Namespace, remover.Name, desc)
	case cniPod != nil:
		logger.Info("Node CNI ready", "cniPod", klog.KObj(cniPod))
		n.recorder.Eventf(node, corev1.EventTypeNormal, EventCNIReady,
			"CNI pod %s/%s is Ready: %s", cniPod.Namespace, cniPod.Name, desc)
	case lifted != "":
		logger.Info("No CNI pod will come to this node; startup taint lifted", "why", lifted)
		n.recorder.Eventf(node, corev1.EventTypeWarning, EventStartupTaintLifted,
			"No CNI pod (%s in %s) will run on this node, so none would lift its startup taint (%s): %s; consul-cni is not chained here",
			n.cfg.CNIPodSelector, n.cfg.CNINamespace, lifted, desc)
	default:
		logger.Info("Node CNI not ready")
		n.recorder.Eventf(node, corev1.EventTypeWarning, EventCNINotReady,
			"No Ready CNI pod (%s in %s) on this node: %s", n.cfg.CNIPodSelector, n.cfg.CNINamespace, desc)
	}
	return nil
}

// reportDryRun logs and announces (Normal Event) the changes a patch would
// make, once per node and decision: the node does not change, so without
// this every update of its CNI pod would repeat it.
func (n *Controller) reportDryRun(ctx context.Context, node *corev1.Node, cniPod *corev1.Pod, changes []string) {
	if len(changes) == 0 || (len(changes) == 1 && (changes[0] == metrics.ChangeReadySinceAdded || changes[0] == metrics.ChangeReadySinceMoved ||
		changes[0] == metrics.ChangeReadySinceRemoved)) {
		return // only the ready-since annotation: backfilled, moved or removed
	}
	desc := n.describeChanges(changes)
	n.mu.Lock()
	same := n.dryRun[node.Name] == desc
	n.dryRun[node.Name] = desc
	n.mu.Unlock()
	if same {
		return
	}
	logger := klog.FromContext(ctx).WithValues("node", node.Name, "changes", changes)
	if cniPod != nil {
		logger.Info("Dry run: would mark node CNI ready", "cniPod", klog.KObj(cniPod))
		n.recorder.Eventf(node, corev1.EventTypeNormal, EventWouldMarkCNIReady,
			"Dry run: CNI pod %s/%s is Ready: would have %s", cniPod.Namespace, cniPod.Name, desc)
		return
	}
	logger.Info("Dry run: would mark node CNI not ready")
	n.recorder.Eventf(node, corev1.EventTypeNormal, EventWouldMarkCNINotReady,
		"Dry run: no Ready CNI pod (%s in %s) on this node: would have %s", n.cfg.CNIPodSelector, n.cfg.CNINamespace, desc)
}

func (n *Controller) forgetDryRun(name string) {
	n.mu.Lock()
	delete(n.dryRun, name)
	n.mu.Unlock()
}

// describeChanges says what the patch changed, and only that, for an Event.
func (n *Controller) describeChanges(changes []string) string {
	label := annotations.LabelCNIReady + "=" + annotations.LabelCNIReadyValue
	out := make([]string, 0, len(changes))
	for _, c := range changes {
		switch c {
		case metrics.ChangeLabelAdded:
			out = append(out, "added label "+label)
		case metrics.ChangeLabelRemoved:
			out = append(out, "removed label "+label)
		case metrics.ChangeTaintRemoved:
			out = append(out, "removed startup taint "+n.cfg.StartupTaintKey)
		case metrics.ChangeTaintAdded:
			out = append(out, "added startup taint "+n.cfg.StartupTaintKey+":"+string(n.cfg.StartupTaintEffect))
		case metrics.ChangeReadySinceAdded:
			out = append(out, "added annotation "+annotations.AnnotationCNIReadySince)
		case metrics.ChangeReadySinceMoved:
			out = append(out, "moved annotation "+annotations.AnnotationCNIReadySince+" forward to the CNI pod's readiness")
		case metrics.ChangeReadySinceRemoved:
			out = append(out, "removed annotation "+annotations.AnnotationCNIReadySince+
				" (the CNI pod not Ready for "+n.flapBound.String()+" or more)")
		default:
			out = append(out, c)
		}
	}
	return strings.Join(out, ", ")
}

// jsonPointerEscape escapes a map key for a JSON patch path (RFC 6901).
func jsonPointerEscape(s string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(s)
}

func hasTaint(taints []corev1.Taint, key string) bool {
	for _, t := range taints {
		if t.Key == key {
			return true
		}
	}
	return false
}
