package verify

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/cri"
)

const cfgJSON = `{"ProxyUserID":"5995","ProxyInboundPort":20000,"ProxyOutboundPort":15001}`

type fakeRuntime struct {
	sandboxes []cri.Sandbox
	status    map[string]cri.Status
	listErr   error
	statusN   int
}

func (f *fakeRuntime) List(context.Context) ([]cri.Sandbox, error) { return f.sandboxes, f.listErr }
func (f *fakeRuntime) Status(_ context.Context, id string) (cri.Status, error) {
	f.statusN++
	st, ok := f.status[id]
	if !ok {
		return cri.Status{}, fmt.Errorf("no sandbox %s", id)
	}
	return st, nil
}

type fakeKernel struct {
	results map[string]Result // by netns
	fps     map[string]Fingerprint
	fpErr   map[string]error
	calls   map[string]int
}

func (k *fakeKernel) Inspect(_ context.Context, netns string, _ annotations.TrafficConfig) Result {
	k.calls[netns]++
	return k.results[netns]
}

func (k *fakeKernel) fingerprint(netns string) (Fingerprint, error) {
	return k.fps[netns], k.fpErr[netns]
}

type recorder struct {
	pods  []PodResult
	gone  []string
	nodes []Summary
}

func (r *recorder) Pod(p PodResult)    { r.pods = append(r.pods, p) }
func (r *recorder) Gone(s cri.Sandbox) { r.gone = append(r.gone, s.PodUID) }
func (r *recorder) Node(s Summary)     { r.nodes = append(r.nodes, s) }

func injected(id, uid string, attempt uint32) cri.Sandbox {
	return cri.Sandbox{ID: id, PodUID: uid, PodName: "p-" + uid, PodNamespace: "app", Attempt: attempt,
		Labels: map[string]string{annotations.KeyInjectStatus: annotations.InjectStatusInjected},
		Annotations: map[string]string{annotations.KeyInjectStatus: annotations.InjectStatusInjected,
			annotations.KeyTransparentProxyStatus: annotations.TProxyStatusEnabled,
			annotations.KeyRedirectTrafficConfig:  cfgJSON}}
}

var (
	redirected   = Result{Verdict: Redirected, Reason: annotations.ReasonRulesInPlace, Backend: "iptables-nft"}
	unredirected = Result{Verdict: Unredirected, Reason: annotations.ReasonRulesMissing, Detail: "nothing"}
)

type rig struct {
	rt  *fakeRuntime
	k   *fakeKernel
	rec *recorder
	v   *Verifier
	now time.Time
}

func newRig(t *testing.T) *rig {
	r := &rig{rt: &fakeRuntime{status: map[string]cri.Status{}},
		k:   &fakeKernel{results: map[string]Result{}, fps: map[string]Fingerprint{}, fpErr: map[string]error{}, calls: map[string]int{}},
		rec: &recorder{}, now: time.Unix(1_800_000_000, 0)}
	v, err := New(Config{Runtime: r.rt, Inspector: r.k, Reporter: r.rec, Fingerprint: r.k.fingerprint,
		ExcludeNamespaces: []string{"kube-system"}, Interval: 2 * time.Second, Resync: time.Minute,
		Now: func() time.Time { return r.now }})
	if err != nil {
		t.Fatal(err)
	}
	r.v = v
	return r
}

// add puts a sandbox on the node with its namespace and kernel state.
func (r *rig) add(s cri.Sandbox, res Result) {
	r.rt.sandboxes = append(r.rt.sandboxes, s)
	ns := "/run/netns/" + s.ID
	r.rt.status[s.ID] = cri.Status{NetNS: ns}
	r.k.results[ns] = res
	r.k.fps[ns] = Fingerprint{Inode: uint64(len(r.rt.sandboxes)), Gen: 1}
}

func (r *rig) pass(t *testing.T) {
	t.Helper()
	r.now = r.now.Add(2 * time.Second)
	if err := r.v.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestARedirectedSandboxIsPublishedOnceAndNotInspectedAgainUntilItChanges(t *testing.T) {
	r := newRig(t)
	r.add(injected("sb1", "u1", 0), redirected)
	for range 5 {
		r.pass(t)
	}
	if len(r.rec.pods) != 1 || r.rec.pods[0].Verdict != Redirected || r.rec.pods[0].Sandbox.ID != "sb1" {
		t.Fatalf("published %+v, want one Redirected for sb1", r.rec.pods)
	}
	if n := r.k.calls["/run/netns/sb1"]; n != 1 {
		t.Fatalf("inspected %d times in 5 unchanged passes, want 1", n)
	}
	if r.rt.statusN != 1 {
		t.Fatalf("asked the runtime for the status %d times, want once per sandbox", r.rt.statusN)
	}
	last := r.rec.nodes[len(r.rec.nodes)-1]
	if last.Redirected != 1 || last.Unredirected != 0 || last.Unknown != 0 {
		t.Fatalf("node summary %+v", last)
	}
	// The rules change (fingerprint moves): inspected again, and now found missing.
	r.k.fps["/run/netns/sb1"] = Fingerprint{Inode: 1, Gen: 2}
	r.k.results["/run/netns/sb1"] = unredirected
	r.pass(t)
	if len(r.rec.pods) != 1 {
		t.Fatalf("a first unredirected look was published: %+v", r.rec.pods[1:])
	}
	r.pass(t)
	if len(r.rec.pods) != 2 || r.rec.pods[1].Verdict != Unredirected {
		t.Fatalf("published %+v, want the unredirected verdict confirmed by the second look", r.rec.pods)
	}
	if n := r.k.calls["/run/netns/sb1"]; n != 3 {
		t.Fatalf("inspected %d times, want 3 (first, change, confirmation)", n)
	}
}

func TestAnUnredirectedLookThatIsNotConfirmedIsNeverPublished(t *testing.T) {
	r := newRig(t)
	r.add(injected("sb1", "u1", 0), unredirected)
	r.pass(t)
	r.k.results["/run/netns/sb1"] = redirected
	r.pass(t)
	r.pass(t)
	if len(r.rec.pods) != 1 || r.rec.pods[0].Verdict != Redirected {
		t.Fatalf("published %+v, want only Redirected", r.rec.pods)
	}
}

func TestOnlyInjectedPodsOutsideExcludedNamespacesAndOffTheHostNetworkAreJudged(t *testing.T) {
	r := newRig(t)
	plain := injected("plain", "u1", 0)
	plain.Labels, plain.Annotations = nil, nil
	noStatus := injected("nostatus", "u2", 0)
	delete(noStatus.Annotations, annotations.KeyTransparentProxyStatus)
	sys := injected("sys", "u3", 0)
	sys.PodNamespace = "kube-system"
	host := injected("host", "u4", 0)
	for _, s := range []cri.Sandbox{plain, noStatus, sys, host} {
		r.add(s, unredirected)
	}
	r.rt.status["host"] = cri.Status{HostNetwork: true}
	r.pass(t)
	r.pass(t)
	if len(r.rec.pods) != 0 {
		t.Fatalf("published %+v for pods the plugin never redirects", r.rec.pods)
	}
	if n := len(r.k.calls); n != 0 {
		t.Fatalf("inspected %d namespaces, want none", n)
	}
}

func TestThePodsNewestSandboxIsTheOneJudged(t *testing.T) {
	r := newRig(t)
	old := injected("old", "u1", 0)
	old.Created = r.now.Add(-time.Hour)
	r.add(old, unredirected)
	cur := injected("new", "u1", 1)
	r.add(cur, redirected)
	r.pass(t)
	r.pass(t)
	if len(r.rec.pods) != 1 || r.rec.pods[0].Sandbox.ID != "new" || r.rec.pods[0].Verdict != Redirected {
		t.Fatalf("published %+v, want the attempt-1 sandbox redirected", r.rec.pods)
	}
	if r.k.calls["/run/netns/old"] != 0 {
		t.Fatal("the superseded sandbox was inspected")
	}
}

func TestAPodWithoutSandboxIsReportedGoneAndAReplacedSandboxIsJudgedAnew(t *testing.T) {
	r := newRig(t)
	r.add(injected("sb1", "u1", 0), redirected)
	r.pass(t)
	// Reboot: the sandbox is gone, a new one without rules appears.
	r.rt.sandboxes = nil
	r.pass(t)
	if len(r.rec.gone) != 1 || r.rec.gone[0] != "u1" {
		t.Fatalf("gone %v, want u1", r.rec.gone)
	}
	r.add(injected("sb2", "u1", 1), unredirected)
	r.pass(t)
	r.pass(t)
	if n := len(r.rec.pods); n != 2 || r.rec.pods[1].Sandbox.ID != "sb2" || r.rec.pods[1].Verdict != Unredirected {
		t.Fatalf("published %+v, want sb2 unredirected", r.rec.pods)
	}
}

func TestATransientReadFailureKeepsTheVerdictForTwoLooks(t *testing.T) {
	r := newRig(t)
	r.add(injected("sb1", "u1", 0), redirected)
	r.pass(t)
	r.k.fpErr["/run/netns/sb1"] = errors.New("setns: interrupted")
	r.pass(t)
	r.pass(t)
	if len(r.rec.pods) != 1 {
		t.Fatalf("published %+v after two failed reads, want the verdict kept", r.rec.pods)
	}
	r.pass(t)
	if len(r.rec.pods) != 2 || r.rec.pods[1].Verdict != Unknown {
		t.Fatalf("published %+v, want Unknown after three failed reads", r.rec.pods)
	}
	delete(r.k.fpErr, "/run/netns/sb1")
	r.pass(t)
	if len(r.rec.pods) != 3 || r.rec.pods[2].Verdict != Redirected {
		t.Fatalf("published %+v, want Redirected again once readable", r.rec.pods)
	}
}

func TestResyncInspectsAnUnchangedSandboxAgain(t *testing.T) {
	r := newRig(t)
	r.add(injected("sb1", "u1", 0), redirected)
	r.pass(t)
	r.now = r.now.Add(time.Minute)
	r.pass(t)
	if n := r.k.calls["/run/netns/sb1"]; n != 2 {
		t.Fatalf("inspected %d times, want 2 (first look, resync)", n)
	}
}

func TestABadRedirectConfigIsUnknownNeverUnredirected(t *testing.T) {
	r := newRig(t)
	s := injected("sb1", "u1", 0)
	s.Annotations[annotations.KeyRedirectTrafficConfig] = `{"ProxyUserID":""}`
	r.add(s, unredirected)
	r.pass(t)
	r.pass(t)
	if len(r.rec.pods) != 1 || r.rec.pods[0].Verdict != Unknown {
		t.Fatalf("published %+v, want one Unknown", r.rec.pods)
	}
	if len(r.k.calls) != 0 {
		t.Fatal("inspected without knowing the expected rules")
	}
}

func TestARuntimeThatDoesNotAnswerFailsThePassAndPublishesNothing(t *testing.T) {
	r := newRig(t)
	r.rt.listErr = errors.New("connection refused")
	if err := r.v.Pass(context.Background()); err == nil {
		t.Fatal("pass succeeded without the runtime")
	}
	if len(r.rec.nodes) != 0 {
		t.Fatal("a node summary was published without a list of sandboxes")
	}
}
