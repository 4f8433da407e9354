package repair

import (
	"context"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	appsinformers "k8s.io/client-go/informers/apps/v1"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/podcache"
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
	// selector cfg.InjectedPodSelector), held in package podcache's
	// compact form (podcache.PodOf reads them), indexed by node.
	Pods cache.SharedIndexInformer
	// Nodes are every node, slimmed by podcache.NodeTransform.
	Nodes cache.SharedIndexInformer
	// CNIPods are the CNI DaemonSet's pods (cfg.CNINamespace,
	// cfg.CNIPodSelector), indexed by node; nil when neither node
	// readiness nor the cni-pod gate needs them.
	CNIPods cache.SharedIndexInformer
	// CNIDaemonSets are the DaemonSets of cfg.CNINamespace (node readiness
	// lifts a startup taint where none of the CNI's would run a pod); nil
	// without node readiness.
	CNIDaemonSets cache.SharedIndexInformer
}

// cniPodKey is the factory key of the CNI pod informer.
type cniPodKey struct{ corev1.Pod }

// newInformers creates the informers cfg needs. Start them with
// Factory.Start.
func newInformers(client kubernetes.Interface, cfg Config) (*Informers, error) {
	f := informers.NewSharedInformerFactory(client, cfg.Resync)
	inf := &Informers{Factory: f}

	slim := podcache.InjectedPodTransform(cfg.InitContainerNames)
	inf.Pods = f.InformerFor(&corev1.Pod{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		sel := func(o *metav1.ListOptions) { o.LabelSelector = cfg.InjectedPodSelector }
		lw := &cache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				sel(&o)
				return listSlim(ctx, o, func(ctx context.Context, o metav1.ListOptions) (*corev1.PodList, error) {
					return c.CoreV1().Pods(metav1.NamespaceAll).List(ctx, o)
				}, func(l *corev1.PodList) (int, string, string) { return len(l.Items), l.ResourceVersion, l.Continue },
					func(l *corev1.PodList, i int) *corev1.Pod { return &l.Items[i] }, slim)
			},
			WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				sel(&o)
				return c.CoreV1().Pods(metav1.NamespaceAll).Watch(ctx, o)
			},
			DisableChunking: true,
		}
		i := cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, c), &corev1.Pod{}, resync, podcache.Indexers())
		_ = i.SetTransform(slim)
		return i
	})
	inf.Nodes = f.InformerFor(&corev1.Node{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		lw := &cache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				return listSlim(ctx, o, func(ctx context.Context, o metav1.ListOptions) (*corev1.NodeList, error) {
					return c.CoreV1().Nodes().List(ctx, o)
				}, func(l *corev1.NodeList) (int, string, string) { return len(l.Items), l.ResourceVersion, l.Continue },
					func(l *corev1.NodeList, i int) *corev1.Node { return &l.Items[i] }, podcache.NodeTransform)
			},
			WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				return c.CoreV1().Nodes().Watch(ctx, o)
			},
			DisableChunking: true,
		}
		i := cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, c), &corev1.Node{}, resync, cache.Indexers{})
		_ = i.SetTransform(podcache.NodeTransform)
		return i
	})
	if cfg.NodeReadiness || cfg.Gate == judge.GateCNIPod {
		inf.CNIPods = f.InformerFor(&cniPodKey{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
			i := coreinformers.NewFilteredPodInformer(c, cfg.CNINamespace, resync, judge.PodNodeIndexers(), func(o *metav1.ListOptions) {
				o.LabelSelector = cfg.CNIPodSelector
			})
			_ = i.SetTransform(podcache.CNIPodTransform)
			return i
		})
	}
	if cfg.NodeReadiness {
		inf.CNIDaemonSets = f.InformerFor(&appsv1.DaemonSet{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
			return appsinformers.NewFilteredDaemonSetInformer(c, cfg.CNINamespace, resync, cache.Indexers{}, nil)
		})
	}
	return inf, nil
}

// listPageSize is the page size of the informers' own paginated lists.
const listPageSize = 200

// listSlim lists page by page and slims every item before the next page is
// fetched, so a relist never holds more than one page of full objects.
//
// Informers stream their initial state (WatchList) when the apiserver can,
// and then the transform applies object by object. When it cannot (its
// storage lacks watch progress requests, e.g. etcd older than 3.5.13) they
// fall back to LIST, and a LIST at resourceVersion "0" is answered whole
// from the watch cache: every full object at once, only slimmed after the
// whole list is decoded. Here the list is instead read at the latest
// resourceVersion (never older than what the reflector asked for) in pages
// of listPageSize.
func listSlim[L runtime.Object, T runtime.Object](ctx context.Context, o metav1.ListOptions,
	list func(context.Context, metav1.ListOptions) (L, error),
	meta func(L) (n int, rv, cont string), item func(L, int) T, slim cache.TransformFunc) (runtime.Object, error) {
	o.ResourceVersion, o.ResourceVersionMatch = "", ""
	o.Limit, o.Continue = listPageSize, ""
	var items []runtime.Object
	var rv string
	for {
		page, err := list(ctx, o)
		if err != nil {
			return nil, err
		}
		n, pageRV, cont := meta(page)
		for i := 0; i < n; i++ {
			s, err := slim(item(page, i))
			if err != nil {
				return nil, err
			}
			items = append(items, s.(runtime.Object))
		}
		rv = pageRV
		if cont == "" {
			break
		}
		o.Continue = cont
	}
	out := &metav1.List{ListMeta: metav1.ListMeta{ResourceVersion: rv}}
	for _, it := range items {
		out.Items = append(out.Items, runtime.RawExtension{Object: it})
	}
	return out, nil
}

// HasSynced reports whether every informer has synced (readiness).
func (i *Informers) HasSynced() bool {
	for _, s := range []cache.SharedIndexInformer{i.Pods, i.Nodes, i.CNIPods, i.CNIDaemonSets} {
		if s != nil && !s.HasSynced() {
			return false
		}
	}
	return true
}

func metav1ObjectMeta(ns, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: ns, Name: name}
}
