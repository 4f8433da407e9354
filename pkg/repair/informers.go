package repair

import (
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

var everything = labels.Everything()

// Informers are the shared informers of the repair and node-readiness
// controllers. They all come from one SharedInformerFactory: nodes through
// the factory's own node informer, injected pods and CNI DaemonSet pods
// through InformerFor with their own selectors and transforms (the CNI pods
// under a distinct key type, since the factory keeps one informer per type).
type Informers struct {
	Factory informers.SharedInformerFactory
	// Pods are the injected pods of every namespace (server-side label
	// selector cfg.InjectedPodSelector), slimmed by SlimInjectedPod and
	// indexed by node.
	Pods cache.SharedIndexInformer
	// Nodes are every node, slimmed by SlimNode.
	Nodes cache.SharedIndexInformer
	// CNIPods are the CNI DaemonSet's pods (cfg.CNINamespace,
	// cfg.CNIPodSelector), indexed by node; nil when neither node
	// readiness nor the cni-pod gate needs them.
	CNIPods cache.SharedIndexInformer
}

// cniPodKey is the factory key of the CNI pod informer.
type cniPodKey struct{ corev1.Pod }

// NewInformers creates the informers cfg needs. Start them with
// Factory.Start.
func NewInformers(client kubernetes.Interface, cfg Config) (*Informers, error) {
	f := informers.NewSharedInformerFactory(client, cfg.Resync)
	inf := &Informers{Factory: f}

	inf.Pods = f.InformerFor(&corev1.Pod{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		i := coreinformers.NewFilteredPodInformer(c, metav1.NamespaceAll, resync, PodNodeIndexer(), func(o *metav1.ListOptions) {
			o.LabelSelector = cfg.InjectedPodSelector
		})
		_ = i.SetTransform(SlimInjectedPod)
		return i
	})
	inf.Nodes = f.InformerFor(&corev1.Node{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		i := coreinformers.NewNodeInformer(c, resync, cache.Indexers{})
		_ = i.SetTransform(SlimNode)
		return i
	})
	if cfg.NodeReadiness || cfg.Gate == GateCNIPod {
		inf.CNIPods = f.InformerFor(&cniPodKey{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
			i := coreinformers.NewFilteredPodInformer(c, cfg.CNINamespace, resync, PodNodeIndexer(), func(o *metav1.ListOptions) {
				o.LabelSelector = cfg.CNIPodSelector
			})
			_ = i.SetTransform(SlimCNIPod)
			return i
		})
	}
	return inf, nil
}

// HasSynced reports whether every informer has synced (readiness).
func (i *Informers) HasSynced() bool {
	for _, s := range []cache.SharedIndexInformer{i.Pods, i.Nodes, i.CNIPods} {
		if s != nil && !s.HasSynced() {
			return false
		}
	}
	return true
}

// jsonPointerEscape escapes a map key for a JSON patch path (RFC 6901).
func jsonPointerEscape(s string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(s)
}

func metav1ObjectMeta(ns, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: ns, Name: name}
}
