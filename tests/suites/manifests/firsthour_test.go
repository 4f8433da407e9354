package manifests

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
)

// firstHourMarker precedes, on a line of its own, each ```sh block of the
// README on the path from its first screen to a verified install, so that a
// test can run that path as the README gives it.
const firstHourMarker = "<!-- first-hour -->"

// projectRegistry is where the README's commands find the chart and the
// images (a test that publishes elsewhere replaces it).
const projectRegistry = "ghcr.io/consul-cni-repair"

// TestFirstHourBlocksExtracted: the README's first-hour blocks are found, in
// the order of its path, and hold the commands that path needs.
func TestFirstHourBlocksExtracted(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(testbin.RepoRoot(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := markedBlocks(b, "README.md", firstHourMarker)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"pod-security.kubernetes.io/enforce=privileged",
		"helm install consul-cni-repair oci://" + projectRegistry + "/charts/consul-cni-repair",
		"kubectl -n consul patch daemonset consul-cni",
		"rollout status deployment/consul-cni-repair",
		"repair audit\nhelm test consul-cni-repair -n consul-cni-repair",
		"reason=WouldRepair",
		"controller.dryRun=false",
		"helm uninstall consul-cni-repair",
	}
	if len(blocks) != len(want) {
		t.Fatalf("%d first-hour blocks, want %d", len(blocks), len(want))
	}
	for i, w := range want {
		if !strings.Contains(blocks[i], w) {
			t.Errorf("first-hour block %d does not hold %q:\n%s", i+1, w, blocks[i])
		}
	}
}
