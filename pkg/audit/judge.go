package audit

import (
	"context"
	"fmt"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/pager"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
)

// Pod is one injected pod outside the mesh.
type Pod struct {
	Namespace string       `json:"namespace"`
	Name      string       `json:"name"`
	Node      string       `json:"node"`
	Owner     string       `json:"owner"`
	Reason    judge.Reason `json:"reason"`
	Detail    string       `json:"detail"`
	Since     time.Time    `json:"since"`
	// Evidence is what the verdict rests on: "verified" (the node
	// verifier's condition for the current sandbox) or "inferred" (the
	// timing and status signals); Inferred says why the verifier did not
	// decide.
	Evidence judge.Evidence `json:"evidence"`
	Inferred string         `json:"inferred,omitempty"`
	// Action is what the controller would do now.
	Action string `json:"action"`

	bare, labelled bool
}

// NotJudged is an injected transparent-proxy pod the controller never
// judges nor acts on, and why: being deleted, a mirror pod, host network,
// finished.
type NotJudged struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Node      string `json:"node"`
	Why       string `json:"why"`
}

// Report is the result of an audit. In machine output it names itself as
// Kubernetes objects do: APIVersion and Kind.
type Report struct {
	APIVersion string    `json:"apiVersion"`
	Kind       string    `json:"kind"`
	Time       time.Time `json:"time"`
	// Examined counts the injected pods listed.
	Examined  int         `json:"examined"`
	Outside   []Pod       `json:"outside"`
	NotJudged []NotJudged `json:"notJudged"`
	// Verification counts the judged pods by what their verdict rests on.
	Verification Verification `json:"verification"`
}

// nodeState is the gate's and the breaker's view of one node.
type nodeState struct {
	open            bool
	since           time.Time
	broken, counted int
}

// auditor judges pods one at a time as the LIST pages arrive.
type auditor struct {
	cfg    judge.Config
	det    judge.Detector
	gate   judge.Gate
	now    time.Time
	nodes  map[string]*nodeState
	report *Report
}

// Run lists nodes, CNI pods (cni-pod gate) and the injected pods, and judges
// every pod as the controller would at now.
func Run(ctx context.Context, client kubernetes.Interface, o *Options, now time.Time) (*Report, error) {
	nodeIdx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	err := list(ctx, o.ChunkSize, metav1.ListOptions{}, func(opts metav1.ListOptions) (runtime.Object, error) {
		return client.CoreV1().Nodes().List(ctx, opts)
	}, nodeIdx.Add)
	if err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	cniIdx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, judge.PodNodeIndexers())
	if o.Config.Gate == judge.GateCNIPod {
		err = list(ctx, o.ChunkSize, metav1.ListOptions{LabelSelector: o.Config.CNIPodSelector}, func(opts metav1.ListOptions) (runtime.Object, error) {
			return client.CoreV1().Pods(o.Config.CNINamespace).List(ctx, opts)
		}, cniIdx.Add)
		if err != nil {
			return nil, fmt.Errorf("listing CNI pods in namespace %q (--cni-namespace) with selector %q: %w", o.Config.CNINamespace, o.Config.CNIPodSelector, err)
		}
	}
	a := &auditor{
		cfg: o.Config, det: detector(o.Config, nodeIdx), now: now,
		gate:   judge.NewGate(o.Config.Gate, corelisters.NewNodeLister(nodeIdx), cniIdx, now, false),
		nodes:  map[string]*nodeState{},
		report: &Report{APIVersion: APIVersion, Kind: Kind, Time: now, Outside: []Pod{}, NotJudged: []NotJudged{}},
	}
	sel := o.podSelector()
	err = list(ctx, o.ChunkSize, metav1.ListOptions{LabelSelector: sel}, func(opts metav1.ListOptions) (runtime.Object, error) {
		return client.CoreV1().Pods(o.Namespace).List(ctx, opts)
	}, a.add)
	if err != nil {
		return nil, fmt.Errorf("listing pods with selector %q: %w", sel, err)
	}
	a.decide()
	return a.report, nil
}

// list pages through a LIST, chunk items at a time, and calls add on each.
func list(ctx context.Context, chunk int64, opts metav1.ListOptions, fn func(metav1.ListOptions) (runtime.Object, error), add func(interface{}) error) error {
	p := pager.New(pager.SimplePageFunc(fn))
	p.PageSize = chunk
	return p.EachListItem(ctx, opts, func(obj runtime.Object) error { return add(obj) })
}

func (a *auditor) node(name string) *nodeState {
	st, ok := a.nodes[name]
	if !ok {
		st = &nodeState{}
		st.open, st.since = a.gate.Open(name)
		a.nodes[name] = st
	}
	return st
}

// add judges one pod and counts it for its node's breaker.
func (a *auditor) add(obj interface{}) error {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return fmt.Errorf("LIST returned a %T, not a Pod", obj)
	}
	a.report.Examined++
	v := a.det.Detect(pod, a.now)
	a.report.Verification.count(v)
	if n := pod.Spec.NodeName; n != "" {
		if st := a.node(n); st.open && a.det.CountedByBreaker(pod, st.since) {
			st.counted++
			if v.Broken {
				st.broken++
			}
		}
	}
	if !v.Broken {
		// Pods the controller never judges whose redirection was never
		// marked complete: outside its reach, reported as such.
		status, _ := annotations.TProxyStatus(pod.Annotations)
		if v.Ignored != "" && annotations.UsesTransparentProxy(pod.Labels, pod.Annotations) && !annotations.IsComplete(status) {
			a.report.NotJudged = append(a.report.NotJudged, NotJudged{
				Namespace: pod.Namespace, Name: pod.Name, Node: pod.Spec.NodeName, Why: v.Ignored})
		}
		return nil
	}
	owner := "<none>"
	ref := metav1.GetControllerOf(pod)
	if ref != nil {
		owner = ref.Kind + "/" + ref.Name
	}
	a.report.Outside = append(a.report.Outside, Pod{
		Namespace: pod.Namespace, Name: pod.Name, Node: pod.Spec.NodeName, Owner: owner,
		Reason: v.Reason, Detail: v.Detail, Since: v.Since, Evidence: v.Evidence, Inferred: v.Inferred,
		bare:     ref == nil,
		labelled: pod.Labels[annotations.LabelUninitialized] == annotations.LabelUninitializedValue,
	})
	return nil
}

// decide fills in what the controller would do with each pod, in the order
// of its checks, and sorts the pods.
func (a *auditor) decide() {
	breaker := judge.NewBreaker(a.cfg.BreakerThreshold, a.cfg.BreakerMinPods)
	for i := range a.report.Outside {
		p := &a.report.Outside[i]
		switch {
		case a.cfg.Action == judge.ActionLabel && p.labelled:
			p.Action = "none: already labelled"
		case p.bare && !a.cfg.AllowBarePods:
			p.Action = "none: bare pod, nothing would recreate it (Event only)"
		case p.Node == "":
			p.Action = "none: not scheduled"
		case !a.node(p.Node).open:
			p.Action = fmt.Sprintf("wait: CNI not ready on the node (--cni-ready-gate=%s)", a.cfg.Gate)
		case a.cfg.Breaker && breaker.Trips(a.node(p.Node).broken, a.node(p.Node).counted):
			st := a.node(p.Node)
			p.Action = fmt.Sprintf("none: circuit breaker open on the node (%d of %d pods created since its CNI became ready are broken)", st.broken, st.counted)
		default:
			p.Action = string(a.cfg.Action)
		}
	}
	sort.Slice(a.report.Outside, func(i, j int) bool {
		x, y := a.report.Outside[i], a.report.Outside[j]
		if x.Namespace != y.Namespace {
			return x.Namespace < y.Namespace
		}
		return x.Name < y.Name
	})
}
