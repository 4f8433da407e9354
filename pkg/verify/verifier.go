// Package verify is the node verifier: on one node it looks, in the network
// namespace of each injected pod's current sandbox, at what the kernel
// holds, and says whether Consul's redirection is in place. The repair
// controller acts on that evidence first and falls back to timing signals
// only where no verifier reports.
//
// # What is read, and from where
//
// The sandboxes come from the container runtime over the CRI socket
// (pkg/cri: ListPodSandbox, ready sandboxes only; for each new sandbox its
// verbose status, whose OCI spec names the network namespace path the
// runtime bound). The pod's labels and annotations are those the runtime
// received at RunPodSandbox, so the verifier needs no right to read pods:
// a sandbox is judged if its pod is injected with a transparent-proxy
// status (annotations.UsesTransparentProxy, as the plugin decides) and its
// namespace is not excluded; the expected rules are built from its
// redirect-traffic-config and dual-stack annotations exactly as the plugin
// builds them. A pod with several ready sandboxes is judged by its newest.
//
// The comparison is the plugin's CHECK (Kernel): the table inet
// consul_tproxy compared over netlink (nftables backend), else the nat table
// of the iptables variant that holds our chains (FindIptablesRules tells
// without running a tool), read with the host's own iptables-save and
// compared by iptables.RuleSet.Check. Any complete set is Redirected; a
// namespace read without finding one is Unredirected (RulesMissing, or
// RulesDrifted when some of ours is there); a namespace that cannot be read
// is Unknown, which is never evidence against a pod.
//
// # When
//
// Every Interval the verifier lists the sandboxes and reads each judged
// namespace's Fingerprint (nf_tables' generation and the legacy nat
// tables' size: a few system calls, no tool). A sandbox is inspected when
// it appears, when its fingerprint changes, and every Resync; nothing else
// runs a tool. A first Unredirected verdict is published only when the next
// look confirms it (same sandbox, still unredirected), so a sandbox read in
// the middle of a change is never reported on one look.
//
// # What is published
//
// Through a Reporter (report.go): the pod condition
// annotations.ConditionRedirectVerified on each judged pod (written when its
// verdict changes), a Warning Event on a pod found without rules, the Node
// condition annotations.NodeConditionCNIVerified (the chain and the pods of
// the node, with a heartbeat the controller reads as "a verifier reports
// here"), and the gauges of metrics.go.
package verify

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/cri"
)

// PodResult is the published verdict of one pod's current sandbox.
type PodResult struct {
	Sandbox cri.Sandbox
	Result
}

// Summary is the node's state after a pass.
type Summary struct {
	// Redirected, Unredirected and Unknown count the judged pods.
	Redirected, Unredirected, Unknown int
	// Chain is nil when the chain is not checked, else whether the
	// runtime's network ends with consul-cni, with the reason when not.
	Chain *ChainState
}

// ChainState is what the verifier found in the node's CNI configuration.
type ChainState struct {
	OK     bool
	Detail string
}

// Reporter publishes verdicts. Its methods must not block on the API.
type Reporter interface {
	// Pod is called when a pod's published verdict changes.
	Pod(r PodResult)
	// Gone is called when a judged pod has no ready sandbox any more.
	Gone(s cri.Sandbox)
	// Node is called after every pass.
	Node(s Summary)
}

// Config configures a Verifier.
type Config struct {
	Runtime   cri.Runtime
	Inspector Inspector
	Reporter  Reporter
	// Fingerprint reads a namespace's fingerprint (default ReadFingerprint).
	Fingerprint func(netns string) (Fingerprint, error)
	// Root prefixes the runtime's netns paths (the host's root as mounted in
	// the verifier's container; "" on the host).
	Root string
	// ExcludeNamespaces are the plugin's exclude_namespaces: their pods are
	// passed through by design and never judged.
	ExcludeNamespaces []string
	// Chain checks the node's CNI chain (nil: not checked).
	Chain func() ChainState
	// Interval between passes; Resync between inspections of an unchanged
	// sandbox.
	Interval, Resync time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// entry is what the verifier knows of one judged sandbox.
type entry struct {
	sb        cri.Sandbox
	netns     string
	cfg       *annotations.TrafficConfig
	cfgErr    string
	fp        Fingerprint
	inspected time.Time
	// last is the latest look; published what the Reporter was told.
	last      Result
	published *Result
	// misses and unknowns count consecutive Unredirected and Unknown looks.
	misses, unknowns int
}

// confirmed reports whether an Unredirected verdict was seen twice in a
// row on this sandbox.
func (e *entry) confirmed() bool { return e.misses >= 2 }

// record keeps a look's result and the streaks.
func (e *entry) record(r Result) {
	e.last = r
	e.misses, e.unknowns = 0, 0
	switch r.Verdict {
	case Unredirected:
		e.misses++
	case Unknown:
		e.unknowns++
	}
}

// Verifier is the node verifier's state; Run drives it, Pass is one pass.
type Verifier struct {
	cfg     Config
	entries map[string]*entry // by sandbox ID
	byPod   map[string]string // pod UID -> current sandbox ID
	// Inspections counts Inspect calls (for the benchmark and tests).
	Inspections int
	// OnPass, when set, is called by Run after each pass with its error
	// (nil: the pass completed).
	OnPass func(err error)
}

// New validates cfg and returns a Verifier.
func New(cfg Config) (*Verifier, error) {
	if cfg.Runtime == nil || cfg.Inspector == nil || cfg.Reporter == nil {
		return nil, errors.New("verify: Runtime, Inspector and Reporter are required")
	}
	if cfg.Fingerprint == nil {
		cfg.Fingerprint = ReadFingerprint
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Interval <= 0 {
		return nil, fmt.Errorf("verify: Interval %s is not positive", cfg.Interval)
	}
	if cfg.Resync < cfg.Interval {
		return nil, fmt.Errorf("verify: Resync %s is shorter than Interval %s", cfg.Resync, cfg.Interval)
	}
	return &Verifier{cfg: cfg, entries: map[string]*entry{}, byPod: map[string]string{}}, nil
}

// Run makes a pass every Interval until ctx ends. A failed pass (the
// runtime not answering) is logged when its error changes and retried at
// the next tick; the node's state is then not refreshed, so its heartbeat
// goes stale and the controller takes the node for one without a verifier.
func (v *Verifier) Run(ctx context.Context) {
	log := klog.FromContext(ctx)
	t := time.NewTicker(v.cfg.Interval)
	defer t.Stop()
	last := ""
	for {
		err := v.Pass(ctx)
		switch {
		case ctx.Err() != nil:
		case err != nil && err.Error() != last:
			log.Error(err, "Verification pass failed; retrying every interval", "interval", v.cfg.Interval)
			last = err.Error()
		case err == nil && last != "":
			log.Info("Verification passes complete again")
			last = ""
		}
		if v.OnPass != nil {
			v.OnPass(err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Pass lists the sandboxes, judges the current one of every injected pod
// where something changed, publishes what changed and the node's summary.
func (v *Verifier) Pass(ctx context.Context) error {
	list, err := v.cfg.Runtime.List(ctx)
	if err != nil {
		return err
	}
	current := currentSandboxes(list)
	v.forgetGone(current)
	var sum Summary
	for _, sb := range current {
		if !v.judged(sb) {
			continue
		}
		e := v.look(ctx, sb)
		if e == nil {
			continue
		}
		v.publish(e)
		switch {
		case e.published == nil:
			sum.Unknown++
		case e.published.Verdict == Redirected:
			sum.Redirected++
		case e.published.Verdict == Unredirected:
			sum.Unredirected++
		default:
			sum.Unknown++
		}
	}
	if v.cfg.Chain != nil {
		c := v.cfg.Chain()
		sum.Chain = &c
	}
	v.cfg.Reporter.Node(sum)
	return nil
}

// currentSandboxes keeps each pod's newest ready sandbox (highest attempt,
// then latest creation), in a stable order.
func currentSandboxes(list []cri.Sandbox) []cri.Sandbox {
	best := map[string]cri.Sandbox{}
	for _, s := range list {
		if s.PodUID == "" {
			continue
		}
		b, ok := best[s.PodUID]
		if !ok || s.Attempt > b.Attempt || (s.Attempt == b.Attempt && s.Created.After(b.Created)) {
			best[s.PodUID] = s
		}
	}
	out := make([]cri.Sandbox, 0, len(best))
	for _, s := range best {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b cri.Sandbox) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// judged reports whether the plugin would have redirected the sandbox.
func (v *Verifier) judged(sb cri.Sandbox) bool {
	if slices.Contains(v.cfg.ExcludeNamespaces, sb.PodNamespace) {
		return false
	}
	return annotations.UsesTransparentProxy(sb.Labels, sb.Annotations)
}

// forgetGone drops sandboxes that are no longer any pod's current one and
// tells the Reporter of pods that have none left.
func (v *Verifier) forgetGone(current []cri.Sandbox) {
	keep := make(map[string]bool, len(current))
	pods := make(map[string]bool, len(current))
	for _, s := range current {
		keep[s.ID] = true
		pods[s.PodUID] = true
	}
	for id, e := range v.entries {
		if keep[id] {
			continue
		}
		delete(v.entries, id)
		if v.byPod[e.sb.PodUID] == id {
			delete(v.byPod, e.sb.PodUID)
			if !pods[e.sb.PodUID] && e.published != nil {
				v.cfg.Reporter.Gone(e.sb)
			}
		}
	}
}

// look returns the sandbox's entry after inspecting it if it is new, its
// fingerprint changed, its resync is due or a verdict awaits confirmation;
// nil for a host-network sandbox.
func (v *Verifier) look(ctx context.Context, sb cri.Sandbox) *entry {
	e, ok := v.entries[sb.ID]
	if !ok {
		e = v.newEntry(ctx, sb)
		if e == nil {
			return nil
		}
	} else if e.netns == "" && !v.resolve(ctx, e) {
		delete(v.entries, sb.ID)
		return nil
	}
	if e.cfg == nil {
		e.record(Result{Detail: e.cfgErr})
		return e
	}
	fp, err := v.cfg.Fingerprint(e.netns)
	if err != nil {
		u := e.unknowns
		e.record(Result{Detail: "reading the namespace: " + err.Error()})
		e.unknowns = u + 1
		e.inspected = time.Time{}
		return e
	}
	now := v.cfg.Now()
	pending := e.last.Verdict == Unredirected && (e.published == nil || e.published.Verdict != Unredirected)
	if !ok || fp != e.fp || pending || e.inspected.IsZero() || now.Sub(e.inspected) >= v.cfg.Resync {
		e.fp = fp
		r := v.cfg.Inspector.Inspect(ctx, e.netns, *e.cfg)
		v.Inspections++
		e.inspected = now
		if r.Verdict == Unredirected && !v.sameNamespace(e, fp) {
			r = Result{Detail: "the namespace changed while it was read"}
		}
		misses, unknowns := e.misses, e.unknowns
		e.record(r)
		switch r.Verdict {
		case Unredirected:
			e.misses = misses + 1
		case Unknown:
			e.unknowns = unknowns + 1
		}
	}
	return e
}

// sameNamespace re-reads the fingerprint after an Unredirected look: a
// namespace torn down (or bound anew) during the look reads as empty.
func (v *Verifier) sameNamespace(e *entry, before Fingerprint) bool {
	after, err := v.cfg.Fingerprint(e.netns)
	return err == nil && after == before
}

func (v *Verifier) newEntry(ctx context.Context, sb cri.Sandbox) *entry {
	e := &entry{sb: sb}
	if !v.resolve(ctx, e) {
		return nil
	}
	v.entries[sb.ID] = e
	v.byPod[sb.PodUID] = sb.ID
	return e
}

// resolve finds the sandbox's namespace and expected rules; false for a
// host-network sandbox. A runtime error leaves netns empty, to be asked
// again at the next look.
func (v *Verifier) resolve(ctx context.Context, e *entry) bool {
	st, err := v.cfg.Runtime.Status(ctx, e.sb.ID)
	if err != nil {
		e.cfgErr = err.Error()
		return true
	}
	if st.HostNetwork {
		return false
	}
	e.netns = joinRoot(v.cfg.Root, st.NetNS)
	e.cfg, err = trafficConfig(e.sb.Annotations)
	if err != nil {
		e.cfgErr = err.Error()
	} else {
		e.cfgErr = ""
	}
	return true
}

func joinRoot(root, p string) string {
	if root == "" || root == "/" {
		return p
	}
	return strings.TrimSuffix(root, "/") + p
}

// trafficConfig parses the pod's redirect configuration as the plugin does.
func trafficConfig(ann map[string]string) (*annotations.TrafficConfig, error) {
	raw, ok := ann[annotations.KeyRedirectTrafficConfig]
	if !ok {
		return nil, fmt.Errorf("annotation %s is missing: the expected rules are unknown", annotations.KeyRedirectTrafficConfig)
	}
	dual, err := annotations.DualStack(ann)
	if err != nil {
		return nil, err
	}
	cfg, err := annotations.ParseRedirectTrafficConfig([]byte(raw), dual)
	if err != nil {
		return nil, err
	}
	return &cfg, nil
}

// publish tells the Reporter when the verdict to publish changed: Redirected
// and Unknown at once, Unredirected only when confirmed by a second look
// (the look before was Unredirected too, on the same sandbox).
func (v *Verifier) publish(e *entry) {
	next := e.last
	if next.Verdict == Unredirected && (e.published == nil || e.published.Verdict != Unredirected) && !e.confirmed() {
		return
	}
	if e.published != nil && sameVerdict(*e.published, next) {
		return
	}
	if next.Verdict == Unknown && e.published != nil && e.published.Verdict != Unknown && e.unknowns < 3 {
		// A transient failure to read keeps the last verdict for two
		// more looks.
		return
	}
	e.published = &next
	v.cfg.Reporter.Pod(PodResult{Sandbox: e.sb, Result: next})
}

func sameVerdict(a, b Result) bool {
	return a.Verdict == b.Verdict && a.Reason == b.Reason && a.Backend == b.Backend
}
