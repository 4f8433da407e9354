//go:build integration

package scenario_test

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/consulk8s"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/scenario"
)

// repairOnly is a run of the repair-only profile: consul-k8s's real
// install-cni chains consul-k8s's real consul-cni, and only the controller
// of this project runs (the repair-only overlay's flags).
func repairOnly(t *testing.T, cfg scenario.Config) *scenario.Result {
	t.Helper()
	bins := consulk8s.Unpack(t)
	cfg.Profile, cfg.ConsulK8s = scenario.ProfileRepairOnly, &bins
	res := run(t, cfg)
	b, err := os.ReadFile(bins.Plugin())
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	if want := hex.EncodeToString(sum[:]); res.PluginSHA256 != want {
		t.Errorf("the node's consul-cni at the end has sha256 %q, want consul-k8s's plugin (%s)", res.PluginSHA256, want)
	}
	return res
}

// The race with the repair-only profile: pods that started before
// consul-k8s's installer chained its plugin bypass the proxy; once
// consul-k8s's CNI pod is Ready the controller labels the node and
// replaces every pod that bypassed, and consul-k8s's plugin meshes the
// replacements. consul-k8s's pod is Ready when its container runs, before
// its installer has copied the plugin (44 MB) and chained it: replacements
// made in that window bypass too and are replaced in turn (counted in the
// log).
func TestRaceRepairOnlyConsulK8s(t *testing.T) {
	res := repairOnly(t, scenario.Config{Mode: scenario.Repair, Pods: pods, CNIDelay: 2 * time.Second, Observe: 5 * time.Second, MinPodAge: 5 * time.Second})
	t.Logf("%d pods bypassed (%d of them replacements made before consul-k8s's installer chained), %d repairs, %d pods seen, all meshed %.1f s after the chain",
		res.EverBypassed, res.EverBypassed-pods, res.Actions, res.PodsSeen, ptrOr(res.SecondsToAllMeshed))
	if res.EverBypassed < pods {
		t.Fatalf("ever bypassed %d, want at least %d (the pods ran before the plugin was chained)", res.EverBypassed, pods)
	}
	if res.BypassingAtEnd != 0 || res.SecondsToAllMeshed == nil {
		t.Fatalf("bypassing at end %d, seconds to all meshed %v: the controller did not repair", res.BypassingAtEnd, res.SecondsToAllMeshed)
	}
	if res.Actions < res.EverBypassed {
		t.Fatalf("actions %d for %d pods that bypassed: every bypassing pod should have been replaced", res.Actions, res.EverBypassed)
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

func ptrOr(f *float64) float64 {
	if f == nil {
		return -1
	}
	return *f
}

// The node reboot with the repair-only profile: the pods are meshed by
// consul-k8s's plugin (status complete, written by that plugin), then the
// node reboots with its conflist rewritten without consul-cni. consul-k8s's
// installer, started again with its pod, waits 100 s (its binary watcher's
// grace) before it chains its plugin again, so every pod comes back
// bypassing with its status still complete, and consul-k8s's plugin wrote
// no cni-applied-at. The controller dates the plugin's ADD by the
// managedFields entry that owns the status annotation: every pod that came
// back with a stale complete is replaced (sandbox_recreated), replacements
// made before consul-k8s's installer chained (its pod is Ready at once) are
// replaced in turn, and at the end every pod is meshed.
//
// The sandbox slack is the controller's default, 2 min, and no shorter:
// the breaker counts only sandboxes dated a slack or more after the CNI
// pod's readiness, and consul-k8s's pod is Ready some 100 s before its
// plugin is chained. With a 10 s slack the replacements made in that window
// opened the breaker, which then held them outside the mesh to the end of
// the run (it closes only when the counts change, and nothing repaired them).
func TestNodeRebootRepairOnlyConsulK8s(t *testing.T) {
	res := repairOnly(t, scenario.Config{Mode: scenario.NodeReboot, Pods: pods, Observe: 5 * time.Second, SandboxSlack: 2 * time.Minute,
		Timeout: 2 * time.Minute})
	stale := rebootReplacedEveryBypass(t, res)
	if res.RecreatedActions < len(stale) {
		t.Fatalf("%d pods came back with a stale complete, %d sandbox_recreated repairs: the controller missed some", len(stale), res.RecreatedActions)
	}
}

// The same node reboot with the node verifier running, as the repair-only
// overlay deploys it: every pod that came back without rules is found by
// looking into its sandbox's network namespace (verified_unredirected),
// not dated by the managedFields time of its stale complete.
func TestNodeRebootRepairOnlyConsulK8sVerified(t *testing.T) {
	res := repairOnly(t, scenario.Config{Mode: scenario.NodeReboot, Pods: pods, Observe: 5 * time.Second, SandboxSlack: 2 * time.Minute,
		Timeout: 2 * time.Minute, Verifier: true})
	stale := rebootReplacedEveryBypass(t, res)
	t.Logf("%d verified_unredirected repairs, %d sandbox_recreated, %d in all", res.VerifiedActions, res.RecreatedActions, res.Actions)
	if res.VerifiedActions < len(stale) {
		t.Fatalf("%d pods came back with a stale complete, %d verified_unredirected repairs: the verifier's evidence did not decide them",
			len(stale), res.VerifiedActions)
	}
}

// rebootReplacedEveryBypass asserts what both reboot runs of the
// repair-only profile show: some pod meshed before the reboot bypassed
// after it (a stale complete), none bypasses at the end, every pod that
// bypassed was replaced and no meshed one was; it returns the stale ones.
func rebootReplacedEveryBypass(t *testing.T, res *scenario.Result) []string {
	t.Helper()
	var stale []string
	for _, p := range res.PodResults {
		// Meshed before the reboot, bypassing after it: status complete
		// from a sandbox consul-k8s's plugin never saw.
		if p.Meshed > 0 && p.Bypass > 0 {
			stale = append(stale, p.Name)
		}
	}
	t.Logf("node %+v: %d pods bypassed after the reboot, %d of them with a stale complete (%v), %d still at the end; %d repairs, %d sandbox_recreated; all meshed %.1f s after the chain",
		res.Node, res.EverBypassed, len(stale), stale, res.BypassingAtEnd, res.Actions, res.RecreatedActions, ptrOr(res.SecondsToAllMeshed))
	if res.Controller != nil {
		t.Logf("controller at the end: %d broken pods, breaker open on %d nodes", res.Controller.BrokenPods, res.Controller.BreakerOpenNodes)
	}
	if len(stale) == 0 {
		t.Fatal("no pod meshed before the reboot was seen bypassing after it: the run proves nothing about a stale complete")
	}
	if res.BypassingAtEnd != 0 || res.SecondsToAllMeshed == nil {
		t.Fatalf("bypassing at end %d, all meshed %v: a pod stayed outside the mesh after the reboot", res.BypassingAtEnd, res.SecondsToAllMeshed)
	}
	if res.Actions < res.EverBypassed {
		t.Fatalf("actions %d for %d pods that bypassed: every bypassing pod should have been replaced", res.Actions, res.EverBypassed)
	}
	for _, p := range res.PodResults {
		if p.Bypass > 0 && !p.Deleted {
			t.Errorf("pod %s bypassed and is still there", p.Name)
		}
		if p.Deleted && p.Bypass == 0 && p.Meshed > 0 {
			t.Errorf("pod %s was replaced while meshed, without ever bypassing", p.Name)
		}
		if !p.Deleted && (p.Meshed == 0 || p.Bypass != 0) {
			t.Errorf("pod %s at the end: %d meshed, %d bypass", p.Name, p.Meshed, p.Bypass)
		}
	}
	return stale
}
