//go:build integration

package scenario_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/scenario"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

func TestMain(m *testing.M) { cluster.Main(m) }

// Small runs keep CI fast; the demo runs more pods.
const pods = 3

func run(t *testing.T, cfg scenario.Config) *scenario.Result {
	t.Helper()
	testnet.HostForwardingOff(t)
	c := cluster.Shared(t)
	env := scenario.NewEnv(t, c)
	env.Logf = t.Logf
	if err := env.UseNodes(t, scenario.NodesFromEnv()); err != nil {
		t.Fatalf("%v", err)
	}
	if err := env.Supports(cfg.Mode); err != nil {
		t.Fatalf("%v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	res, err := scenario.Run(ctx, env, cfg)
	if err != nil {
		t.Fatalf("%s run: %v", cfg.Mode, err)
	}
	b, _ := json.MarshalIndent(res, "", "  ")
	t.Logf("result:\n%s", b)
	if res.Pods != cfg.Pods || len(res.PodResults) < cfg.Pods {
		t.Fatalf("result has %d pods (%d records), want %d", res.Pods, len(res.PodResults), cfg.Pods)
	}
	if !strings.HasSuffix(res.Chain, "consul-cni") {
		t.Fatalf("chain at the end %q does not end with consul-cni", res.Chain)
	}
	for _, v := range scenario.Verdict(cfg.Mode, res) {
		t.Errorf("verdict: %s", v)
	}
	return res
}

// The race, reproduced: pods whose sandbox was made before consul-cni was
// chained reach the external service directly, and keep doing so after the
// plugin arrives; a pod created after that is meshed.
func TestRaceNoRepair(t *testing.T) {
	res := run(t, scenario.Config{Mode: scenario.NoRepair, Pods: pods, CNIDelay: 2 * time.Second, Observe: 10 * time.Second})
	if res.EverBypassed != pods || res.BypassingAtEnd != pods {
		t.Fatalf("ever bypassed %d, bypassing at end %d, want %d and %d", res.EverBypassed, res.BypassingAtEnd, pods, pods)
	}
	if res.SecondsToAllMeshed != nil {
		t.Fatalf("seconds_to_all_meshed %v, want null", *res.SecondsToAllMeshed)
	}
	if res.Actions != 0 || res.PodsSeen != pods {
		t.Fatalf("actions %d, pods seen %d: nothing should have replaced a pod", res.Actions, res.PodsSeen)
	}
	for _, p := range res.PodResults {
		if p.Bypass == 0 || p.Meshed != 0 {
			t.Errorf("pod %s: %d bypass, %d meshed results", p.Name, p.Bypass, p.Meshed)
		}
		// Second witness: the external service itself saw the pod.
		if p.ExternalConnections < p.Bypass/2 || p.ExternalConnections == 0 {
			t.Errorf("pod %s (%s): prober reported %d bypasses, the external service saw %d connections", p.Name, p.IP, p.Bypass, p.ExternalConnections)
		}
	}
	if res.Control == nil || res.Control.Meshed == 0 || res.Control.Bypass != 0 {
		t.Fatalf("control pod created after the plugin was chained: %+v (want meshed only)", res.Control)
	}
}

// The same race with the test chaining the plugin itself (no installer):
// the plugin alone, as the runtime calls it.
func TestRaceNoRepairDirectChain(t *testing.T) {
	res := run(t, scenario.Config{Mode: scenario.NoRepair, Pods: 2, CNIDelay: time.Second, Observe: 8 * time.Second, DirectChain: true})
	if res.EverBypassed != 2 || res.BypassingAtEnd != 2 || res.SecondsToAllMeshed != nil {
		t.Fatalf("ever %d, at end %d, all meshed %v", res.EverBypassed, res.BypassingAtEnd, res.SecondsToAllMeshed)
	}
	if res.Control == nil || res.Control.Meshed == 0 || res.Control.Bypass != 0 {
		t.Fatalf("control pod: %+v", res.Control)
	}
}

// With the repair controller, the pods that bypassed are evicted once the
// node's CNI is ready and their replacements are meshed.
func TestRaceRepair(t *testing.T) {
	res := run(t, scenario.Config{Mode: scenario.Repair, Pods: pods, CNIDelay: 2 * time.Second, Observe: 5 * time.Second, MinPodAge: 5 * time.Second})
	if res.EverBypassed != pods {
		t.Fatalf("ever bypassed %d, want %d (the pods ran before the plugin was chained)", res.EverBypassed, pods)
	}
	if res.BypassingAtEnd != 0 || res.SecondsToAllMeshed == nil {
		t.Fatalf("bypassing at end %d, seconds to all meshed %v: the controller did not repair", res.BypassingAtEnd, res.SecondsToAllMeshed)
	}
	if res.Actions < pods || res.PodsSeen < 2*pods {
		t.Fatalf("actions %d, pods seen %d: every bypassing pod should have been replaced", res.Actions, res.PodsSeen)
	}
	for _, p := range res.PodResults {
		if p.Bypass > 0 && !p.Deleted {
			t.Errorf("pod %s bypassed and is still there", p.Name)
		}
		if !p.Deleted && (p.Meshed == 0 || p.Bypass != 0) {
			t.Errorf("replacement %s: %d meshed, %d bypass", p.Name, p.Meshed, p.Bypass)
		}
	}
}

// The prevention run: the node joins with the startup taint; the injected
// Deployment waits (Pending) while the installer DaemonSet pod runs on the
// node for real; the repair controller labels the node and removes the taint
// once that pod is Ready; the pods then land, and not one connection of
// theirs bypasses the proxy.
func TestRacePrevention(t *testing.T) { testPrevention(t, false) }

// The same with no change to the node: it registers with no taint, and the
// MutatingAdmissionPolicy of components/node-startup-taint adds it.
func TestRacePreventionByPolicy(t *testing.T) { testPrevention(t, true) }

func testPrevention(t *testing.T, byPolicy bool) {
	c := cluster.Shared(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := &readinessWitness{cs: c.Client, scheduled: map[string]time.Time{}}
	w.start(ctx, t)

	// With the startup taint on the node, the pods also carry the
	// init-container check: it must pass in every one of them.
	checked := 0
	inspect := func(ctx context.Context, ns string) error {
		l, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, p := range l.Items {
			for _, s := range p.Status.InitContainerStatuses {
				if s.Name != annotations.CheckContainerName {
					continue
				}
				if s.State.Terminated == nil || s.State.Terminated.ExitCode != 0 || s.RestartCount != 0 {
					return fmt.Errorf("pod %s: consul-cni-check %+v, %d restarts: want one exit 0", p.Name, s.State, s.RestartCount)
				}
				checked++
			}
		}
		return nil
	}
	cfg := scenario.Config{Mode: scenario.Prevention, TaintByPolicy: byPolicy, Pods: pods, CNIDelay: 3 * time.Second, Observe: 10 * time.Second}
	if !byPolicy {
		cfg.CheckInit, cfg.Inspect = true, inspect
	}
	res := run(t, cfg)
	if !byPolicy && checked != pods {
		t.Errorf("consul-cni-check passed in %d pods, want %d", checked, pods)
	}

	// Ground truth by traffic: every pod meshed, never a bypass, and the
	// external service never heard from any of them.
	if res.EverBypassed != 0 || res.BypassingAtEnd != 0 {
		t.Errorf("ever bypassed %d, bypassing at the end %d, want 0 and 0", res.EverBypassed, res.BypassingAtEnd)
	}
	if res.SecondsToAllMeshed == nil {
		t.Errorf("the pods were not all meshed at the end")
	}
	for _, p := range res.PodResults {
		if p.Meshed == 0 || p.Bypass != 0 || p.ExternalConnections != 0 {
			t.Errorf("pod %s (%s): %d meshed, %d bypass results, %d connections seen by the external service", p.Name, p.IP, p.Meshed, p.Bypass, p.ExternalConnections)
		}
	}
	// Nothing had to be repaired: no pod was replaced.
	if res.Actions != 0 || res.PodsSeen != pods {
		t.Errorf("repairs %d, pods seen %d: prevention should leave nothing to repair", res.Actions, res.PodsSeen)
	}

	w.mu.Lock()
	defer w.mu.Unlock()
	if w.node == "" || !w.tainted {
		t.Errorf("the run's node (%q) was not seen registering with the startup taint", w.node)
	}
	if w.labelled.IsZero() || w.untainted.IsZero() {
		t.Errorf("node %s: labelled at %v, taint removed at %v: the controller did not make it ready", w.node, w.labelled, w.untainted)
	}
	if len(w.scheduled) < pods {
		t.Errorf("%d injected pods seen bound to the node, want %d", len(w.scheduled), pods)
	}
	for name, at := range w.scheduled {
		if !w.untainted.IsZero() && at.Before(w.untainted) {
			t.Errorf("pod %s was seen bound at %v, before the taint was seen removed at %v", name, at.Format(time.StampMilli), w.untainted.Format(time.StampMilli))
		}
	}
	for _, v := range w.violations {
		t.Error(v)
	}
	t.Logf("%d node events", w.events)
	t.Logf("node %s: label at %s, taint removed at %s; pods bound: %v", w.node,
		w.labelled.Format(time.StampMilli), w.untainted.Format(time.StampMilli), w.scheduled)
}

// A meshed pod whose sandbox is made again without consul-cni (a node
// reboot) bypasses the proxy with its status still complete; the
// controller finds it by cni-applied-at (sandbox_recreated), replaces it,
// and the replacement is meshed. The other pods are never touched.
func TestSandboxRecreatedRepair(t *testing.T) {
	res := run(t, scenario.Config{Mode: scenario.SandboxRecreated, Pods: 2, Observe: 5 * time.Second, SandboxSlack: 5 * time.Second})
	v := res.Recreated
	if v == nil {
		t.Fatal("no record of the pod whose sandbox was recreated")
	}
	if v.Meshed == 0 || v.Bypass == 0 || !v.Deleted {
		t.Fatalf("recreated pod %s: %d meshed, %d bypass results, deleted %v: want meshed, then bypassing, then replaced", v.Name, v.Meshed, v.Bypass, v.Deleted)
	}
	if v.ExternalConnections == 0 {
		t.Errorf("recreated pod %s (%s): the external service never saw it bypass", v.Name, v.IP)
	}
	if res.RecreatedActions != 1 {
		t.Fatalf("repairs with reason sandbox_recreated = %d, want 1", res.RecreatedActions)
	}
	if res.EverBypassed != 1 || res.BypassingAtEnd != 0 || res.SecondsToAllMeshed == nil {
		t.Fatalf("ever bypassed %d, bypassing at end %d, all meshed %v", res.EverBypassed, res.BypassingAtEnd, res.SecondsToAllMeshed)
	}
	for _, p := range res.PodResults {
		if p.UID != v.UID && (p.Bypass != 0 || p.Meshed == 0) {
			t.Errorf("pod %s: %d meshed, %d bypass results", p.Name, p.Meshed, p.Bypass)
		}
	}
}

// The node reboots with every sandbox lost and its conflist rewritten
// without consul-cni while it is down. Whichever pod got its new sandbox
// before the installer chained consul-cni again bypasses with its status
// still complete. The controller runs on the node (the manifests'
// Deployment): it comes back after the installer is Ready again and never
// sees the CNI not ready, so the node keeps its label and an old
// cni-ready-since; the CNI pod's later readiness moves that baseline, the
// breaker does not count the pods the reboot recreated (made before the
// installer chained consul-cni, dated by the kubelet within the slack after
// its readiness, or before it), and every pod that
// came back outside the mesh is replaced (sandbox_recreated) and ends
// meshed; no other pod is replaced.
func TestNodeReboot(t *testing.T) {
	res := run(t, scenario.Config{Mode: scenario.NodeReboot, Pods: pods, Observe: 5 * time.Second, SandboxSlack: 10 * time.Second,
		Timeout: 90 * time.Second})
	cv := res.Controller
	if cv == nil {
		t.Fatal("no controller view in the result")
	}
	t.Logf("node %+v: %d of %d pods bypassed after the reboot, %d still at the end; %d sandbox_recreated repairs; controller: %d broken pods, breaker open on %d nodes",
		res.Node, res.EverBypassed, pods, res.BypassingAtEnd, res.RecreatedActions, cv.BrokenPods, cv.BreakerOpenNodes)
	if cv.BreakerOpenNodes != 0 {
		t.Errorf("breaker open on %d nodes: the pods the reboot recreated were counted as broken after readiness", cv.BreakerOpenNodes)
	}
	rebootRepairedEveryBypass(t, res)
	for _, p := range res.PodResults {
		if p.Deleted && p.Bypass == 0 {
			t.Errorf("pod %s was replaced without ever bypassing", p.Name)
		}
	}
}

// The same reboot with the controller outside the node (a process of the
// test): it keeps running through the reboot, sees the node's CNI readiness
// go and come back, and replaces every pod that came back outside the mesh
// (sandbox_recreated); at the end every pod is meshed. Such a controller
// acts the moment the node's readiness is back, often before a recreated
// pod's app has made a connection: the best outcome, but then no traffic
// shows that the pods were outside the mesh. A cluster-wide cap of 2
// actions a minute keeps the third pod running outside the mesh for a
// minute, long enough for its traffic to show it.
func TestNodeRebootControllerOutside(t *testing.T) {
	res := run(t, scenario.Config{Mode: scenario.NodeReboot, Pods: pods, Observe: 5 * time.Second, SandboxSlack: 10 * time.Second,
		Timeout: 2 * time.Minute, ControllerOutside: true, RepairArgs: []string{"--max-repairs-per-minute=2"}})
	t.Logf("node %+v: %d of %d pods bypassed after the reboot, %d sandbox_recreated repairs", res.Node, res.EverBypassed, pods, res.RecreatedActions)
	rebootRepairedEveryBypass(t, res)
}

// rebootRepairedEveryBypass fails the test unless a pod came back outside
// the mesh after the reboot (else the run proves nothing), every pod ends
// meshed, the controller made a sandbox_recreated repair for each pod that
// bypassed, and none of those is still there.
func rebootRepairedEveryBypass(t *testing.T, res *scenario.Result) {
	t.Helper()
	if res.EverBypassed == 0 {
		t.Fatal("no pod came back outside the mesh after the reboot: the run proves nothing about the repair")
	}
	if res.BypassingAtEnd != 0 || res.SecondsToAllMeshed == nil {
		t.Fatalf("bypassing at end %d, all meshed %v: a pod stayed outside the mesh after the reboot", res.BypassingAtEnd, res.SecondsToAllMeshed)
	}
	if res.RecreatedActions < res.EverBypassed {
		t.Fatalf("%d pods bypassed, %d sandbox_recreated repairs: the controller missed some", res.EverBypassed, res.RecreatedActions)
	}
	for _, p := range res.PodResults {
		if p.Bypass > 0 && !p.Deleted {
			t.Errorf("pod %s bypassed and is still there", p.Name)
		}
	}
}

// A run whose traffic cannot cross the network (here the slot's router stops
// forwarding, as a harness that relied on the host's switch found it on a
// fresh machine) must not pass: no pod's prober is answered by the
// external service, not even the plain pod's, and the verdict says the
// bypass path is broken and the race was not shown, instead of reporting
// "nothing bypassed".
func TestBrokenBypassPathVoidsTheRun(t *testing.T) {
	c := cluster.Shared(t)
	env := scenario.NewEnv(t, c)
	env.Logf = t.Logf
	if err := env.UseNodes(t, scenario.NodesFromEnv()); err != nil {
		t.Fatalf("%v", err)
	}
	if err := env.Range.RouterForwarding(false); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Range.RouterForwarding(true); err != nil {
			t.Error(err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cfg := scenario.Config{Mode: scenario.NoRepair, Pods: 1, CNIDelay: time.Second, Observe: 5 * time.Second, DirectChain: true}
	res, err := scenario.Run(ctx, env, cfg)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	v := strings.Join(scenario.Verdict(cfg.Mode, res), "\n")
	t.Logf("verdict:\n%s", v)
	for _, want := range []string{"the bypass path is broken", "the race was not shown", "not one answered connection"} {
		if !strings.Contains(v, want) {
			t.Errorf("the verdict does not say %q", want)
		}
	}
	if res.Plain == nil || res.Plain.Errors == 0 {
		t.Errorf("the plain pod's prober reported no failed connection: %+v (the probe may not have run at all)", res.Plain)
	}
}
