package repair

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
)

// Node Event reasons of the node-readiness controller.
const (
	// EventCNIReady (Normal, node): labelled ready and/or untainted.
	EventCNIReady = "CNIReady"
	// EventCNINotReady (Warning, node): readiness label removed (and the
	// startup taint re-added when asked).
	EventCNINotReady = "CNINotReady"
	// EventCNIUninstalled (Normal, node): an installer pod in uninstall mode
	// runs on the node; readiness label and startup taint removed.
	EventCNIUninstalled = "CNIUninstalled"
)

// NodeReadiness labels a node consul.hashicorp.com/cni=ready and removes its
// startup taint when the CNI DaemonSet pod on it is Ready, and removes the
// label when that pod is gone or not Ready. Every patch is a JSON patch that
// tests the current value it changes, so a concurrent change makes it fail
// and retry on fresh data instead of overwriting.
type NodeReadiness struct {
	cfg      Config
	client   kubernetes.Interface
	nodes    corelisters.NodeLister
	cniPods  cache.Indexer
	recorder record.EventRecorder
	metrics  *Metrics
	queue    workqueue.TypedRateLimitingInterface[string]
	synced   []cache.InformerSynced
}

// NewNodeReadiness wires the node-readiness controller to the shared
// informers (inf.CNIPods must exist).
func NewNodeReadiness(cfg Config, client kubernetes.Interface, inf *Informers, recorder record.EventRecorder, metrics *Metrics) (*NodeReadiness, error) {
	if inf.CNIPods == nil {
		return nil, errors.New("node readiness needs the CNI pod informer")
	}
	n := &NodeReadiness{
		cfg:      cfg,
		client:   client,
		nodes:    corelisters.NewNodeLister(inf.Nodes.GetIndexer()),
		cniPods:  inf.CNIPods.GetIndexer(),
		recorder: recorder,
		metrics:  metrics,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](200*time.Millisecond, time.Minute),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "nodes", MetricsProvider: metrics.Workqueue}),
		synced: []cache.InformerSynced{inf.Nodes.HasSynced, inf.CNIPods.HasSynced},
	}
	if _, err := inf.CNIPods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: n.enqueueCNIPod,
		UpdateFunc: func(old, obj interface{}) {
			n.enqueueCNIPod(old)
			n.enqueueCNIPod(obj)
		},
		DeleteFunc: n.enqueueCNIPod,
	}); err != nil {
		return nil, err
	}
	if _, err := inf.Nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: n.enqueueNode,
		UpdateFunc: func(old, obj interface{}) {
			o, ok1 := old.(*corev1.Node)
			c, ok2 := obj.(*corev1.Node)
			if ok1 && ok2 && o.Labels[annotations.LabelCNIReady] == c.Labels[annotations.LabelCNIReady] &&
				hasTaint(o.Spec.Taints, cfg.StartupTaintKey) == hasTaint(c.Spec.Taints, cfg.StartupTaintKey) {
				return
			}
			n.enqueueNode(obj)
		},
	}); err != nil {
		return nil, err
	}
	return n, nil
}

func (n *NodeReadiness) enqueueCNIPod(obj interface{}) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if pod, ok := obj.(*corev1.Pod); ok && pod.Spec.NodeName != "" {
		n.queue.Add(pod.Spec.NodeName)
	}
}

func (n *NodeReadiness) enqueueNode(obj interface{}) {
	if node, ok := obj.(*corev1.Node); ok {
		n.queue.Add(node.Name)
	}
}

// Run starts workers and blocks until ctx is done.
func (n *NodeReadiness) Run(ctx context.Context, workers int) error {
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

func (n *NodeReadiness) processNext(ctx context.Context) bool {
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

// sync brings one node's label and taint in line with its CNI pod.
func (n *NodeReadiness) sync(ctx context.Context, name string) error {
	node, err := n.nodes.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	var ops []jsonOp
	var changes []string
	cniPod := ReadyCNIPod(n.cniPods, name)
	remover := UninstallingCNIPod(n.cniPods, name)
	switch {
	case remover != nil:
		// The plugin is being removed from the node: nothing may wait for
		// it or select the node for it any more.
		ops, changes = n.removeLabelOps(node, ops, changes)
		ops, changes = n.removeTaintOps(node, ops, changes)
	case cniPod != nil:
		ops, changes = n.addLabelOps(node, ops, changes)
		ops, changes = n.removeTaintOps(node, ops, changes)
	default:
		ops, changes = n.removeLabelOps(node, ops, changes)
		if n.cfg.ReaddStartupTaint {
			ops, changes = n.addTaintOps(node, ops, changes)
		}
	}
	return n.patch(ctx, node, ops, changes, cniPod, remover)
}

func (n *NodeReadiness) addLabelOps(node *corev1.Node, ops []jsonOp, changes []string) ([]jsonOp, []string) {
	if NodeLabelledReady(node) {
		return ops, changes
	}
	if node.Labels == nil {
		// Adding the whole map replaces any labels the node has meanwhile:
		// only on the version that has none.
		ops = append(ops,
			jsonOp{Op: "test", Path: "/metadata/resourceVersion", Value: node.ResourceVersion},
			jsonOp{Op: "add", Path: "/metadata/labels", Value: map[string]string{annotations.LabelCNIReady: annotations.LabelCNIReadyValue}})
	} else {
		ops = append(ops, jsonOp{Op: "add", Path: labelPath, Value: annotations.LabelCNIReadyValue})
	}
	return ops, append(changes, ChangeLabelAdded)
}

func (n *NodeReadiness) removeLabelOps(node *corev1.Node, ops []jsonOp, changes []string) ([]jsonOp, []string) {
	if !NodeLabelledReady(node) {
		return ops, changes
	}
	ops = append(ops,
		jsonOp{Op: "test", Path: labelPath, Value: annotations.LabelCNIReadyValue},
		jsonOp{Op: "remove", Path: labelPath})
	return ops, append(changes, ChangeLabelRemoved)
}

func (n *NodeReadiness) removeTaintOps(node *corev1.Node, ops []jsonOp, changes []string) ([]jsonOp, []string) {
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
	return ops, append(changes, ChangeTaintRemoved)
}

func (n *NodeReadiness) addTaintOps(node *corev1.Node, ops []jsonOp, changes []string) ([]jsonOp, []string) {
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
	return ops, append(changes, ChangeTaintAdded)
}

var labelPath = "/metadata/labels/" + jsonPointerEscape(annotations.LabelCNIReady)

// patch sends the node's patch, counts and announces it.
func (n *NodeReadiness) patch(ctx context.Context, node *corev1.Node, ops []jsonOp, changes []string, cniPod, remover *corev1.Pod) error {
	name := node.Name
	if len(ops) == 0 {
		return nil
	}
	patch, err := json.Marshal(ops)
	if err != nil {
		return err
	}
	logger := klog.FromContext(ctx).WithValues("node", name, "changes", changes)
	_, err = n.client.CoreV1().Nodes().Patch(ctx, name, types.JSONPatchType, patch, metav1.PatchOptions{})
	result := ResultSuccess
	if err != nil {
		result = ResultFailure
	}
	for _, c := range changes {
		n.metrics.NodeReadinessChanges.WithLabelValues(c, result).Inc()
	}
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		// 422 (a test op failed) or 409: the cache was stale; retry
		// once the informer has the current node.
		return fmt.Errorf("patch node %s: %w", name, err)
	}
	desc := strings.Join(changes, ", ")
	if remover != nil {
		logger.Info("Node CNI uninstalling", "cniPod", klog.KObj(remover))
		n.recorder.Eventf(node, corev1.EventTypeNormal, EventCNIUninstalled,
			"CNI pod %s/%s removes consul-cni from this node: %s", remover.Namespace, remover.Name, desc)
		return nil
	}
	if cniPod != nil {
		logger.Info("Node CNI ready", "cniPod", klog.KObj(cniPod))
		n.recorder.Eventf(node, corev1.EventTypeNormal, EventCNIReady,
			"CNI pod %s/%s is Ready: %s (%s=%s, startup taint %s)", cniPod.Namespace, cniPod.Name, desc,
			annotations.LabelCNIReady, annotations.LabelCNIReadyValue, n.cfg.StartupTaintKey)
	} else {
		logger.Info("Node CNI not ready")
		n.recorder.Eventf(node, corev1.EventTypeWarning, EventCNINotReady,
			"No Ready CNI pod (%s in %s) on this node: %s", n.cfg.CNIPodSelector, n.cfg.CNINamespace, desc)
	}
	return nil
}

func hasTaint(taints []corev1.Taint, key string) bool {
	for _, t := range taints {
		if t.Key == key {
			return true
		}
	}
	return false
}
