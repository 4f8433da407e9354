package leave

import (
	"context"
	"fmt"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	appsinformers "k8s.io/client-go/informers/apps/v1"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/placement"
)

// WatchGrace is how long a decision whose GET did not answer waits
// for the watch to deliver an event that may be on its way (the DaemonSet's
// deletion races the garbage collector's deletion of the pod).
const WatchGrace = 2 * time.Second

// Watch holds what the watch saw of the objects that decide whether
// the node keeps an installer.
type Watch struct {
	namespace, pod string

	mu     sync.Mutex
	dsName string // the DaemonSet that owns the pod, once read
	node   *corev1.Node
	ds     *appsv1.DaemonSet
	ns     *corev1.Namespace
	dsGone bool // seen, then deleted
	nsGone bool
}

// StartWatch starts watching, until ctx ends, the DaemonSet that owns
// the installer pod namespace/name, the namespace and the pod's node. It
// reads the pod first (retried until it answers) to learn the DaemonSet's
// and the node's names.
func StartWatch(ctx context.Context, c kubernetes.Interface, namespace, name string) *Watch {
	w := &Watch{namespace: namespace, pod: name}
	go w.run(ctx, c)
	return w
}

func (w *Watch) run(ctx context.Context, c kubernetes.Interface) {
	log := klog.FromContext(ctx).WithValues("pod", w.namespace+"/"+w.pod)
	var dsName, nodeName string
	err := wait.PollUntilContextCancel(ctx, 2*time.Second, true, func(ctx context.Context) (bool, error) {
		pod, err := c.CoreV1().Pods(w.namespace).Get(ctx, w.pod, metav1.GetOptions{})
		if err != nil {
			log.V(2).Info("Cannot read this installer's pod yet; the leave watch waits", "err", err.Error())
			return false, nil
		}
		owner := metav1.GetControllerOf(pod)
		if owner == nil || owner.Kind != "DaemonSet" {
			return false, fmt.Errorf("pod %s/%s is not run by a DaemonSet", w.namespace, w.pod)
		}
		dsName, nodeName = owner.Name, pod.Spec.NodeName
		return true, nil
	})
	if err != nil {
		if ctx.Err() == nil {
			log.Info("Not watching whether this node keeps an installer", "reason", err.Error())
		}
		return
	}
	w.mu.Lock()
	w.dsName = dsName
	w.mu.Unlock()
	byName := func(n string) func(*metav1.ListOptions) {
		return func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", n).String()
		}
	}
	informers := []cache.SharedIndexInformer{
		appsinformers.NewFilteredDaemonSetInformer(c, w.namespace, 0, cache.Indexers{}, byName(dsName)),
		coreinformers.NewFilteredNamespaceInformer(c, 0, cache.Indexers{}, byName(w.namespace)),
		coreinformers.NewFilteredNodeInformer(c, 0, cache.Indexers{}, byName(nodeName)),
	}
	for _, i := range informers {
		_, _ = i.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { w.seen(o, false) },
			UpdateFunc: func(_, o any) { w.seen(o, false) },
			DeleteFunc: func(o any) { w.seen(o, true) },
		})
		go i.Run(ctx.Done())
	}
	log.V(2).Info("Watching whether this node keeps an installer", "daemonSet", dsName, "node", nodeName)
}

// seen records an object's latest state; names are checked again, as a
// server that ignored the field selector would send others too.
func (w *Watch) seen(o any, deleted bool) {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o, deleted = d.Obj, true
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	switch o := o.(type) {
	case *appsv1.DaemonSet:
		if o.Namespace == w.namespace && o.Name == w.dsName {
			w.ds, w.dsGone = o, deleted
		}
	case *corev1.Namespace:
		if o.Name == w.namespace {
			w.ns, w.nsGone = o, deleted
		}
	case *corev1.Node:
		if !deleted && (w.node == nil || w.node.Name == o.Name) {
			w.node = o
		}
	}
}

// Leaving says whether what the watch saw means that no installer pod
// will run on the node again, and why.
func (w *Watch) Leaving() (why string, leaving bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	dsName := w.namespace + "/" + w.dsName
	switch {
	case w.ns != nil && w.nsGone:
		return "namespace " + w.namespace + " was deleted", true
	case w.ns != nil && w.ns.DeletionTimestamp != nil:
		return "namespace " + w.namespace + " is being deleted", true
	case w.ds == nil:
		return "", false
	case w.dsGone:
		return "DaemonSet " + dsName + " was deleted", true
	case w.ds.DeletionTimestamp != nil:
		return "DaemonSet " + dsName + " is being deleted", true
	case w.node == nil:
		return "", false
	}
	if why, ok := placement.DaemonPodFits(&w.ds.Spec.Template.Spec, w.node, nil); !ok {
		return "DaemonSet " + dsName + " " + why, true
	}
	return "", false
}

// Decider returns a Decider that asks get first and, when get does not
// answer, leaves if the watch saw the installer leaving (waiting up to
// WatchGrace for an event on its way); otherwise get's error stands.
func (w *Watch) Decider(get Decider) Decider {
	return func(ctx context.Context) (Decision, error) {
		d, err := get(ctx)
		if err == nil {
			return d, nil
		}
		var why string
		var leaving bool
		wctx, cancel := context.WithTimeout(ctx, WatchGrace)
		defer cancel()
		_ = wait.PollUntilContextCancel(wctx, 50*time.Millisecond, true, func(context.Context) (bool, error) {
			why, leaving = w.Leaving()
			return leaving, nil
		})
		if !leaving {
			return Decision{}, err
		}
		klog.FromContext(ctx).Info("The API did not answer at SIGTERM; deciding from what the installer's watch saw before", "err", err.Error())
		return Decision{Leaving: true, Why: why + " (seen by the installer's watch; the API then answered: " + err.Error() + ")"}, nil
	}
}
