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
