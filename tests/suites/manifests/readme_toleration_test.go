package manifests

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
)

// repairOnlyTolerationMarker precedes the block that gives consul-k8s's
// CNI DaemonSet the toleration of the startup taint, in the README's
// repair-only paragraph and in docs/install.md.
const repairOnlyTolerationMarker = "<!-- repair-only-toleration -->"

// TestReadmeShowsTheRepairOnlyToleration: the README shows (not only
// names) the patch that lets consul-k8s's CNI DaemonSet run under the
// startup taint, the same block as docs/install.md, and the toleration it
// adds tolerates the taint the admission policy puts on new nodes, on the
// DaemonSet the README's hand-over step names.
func TestReadmeShowsTheRepairOnlyToleration(t *testing.T) {
	var blocks []string
	for _, f := range []string{"README.md", "docs/install.md"} {
		b, err := os.ReadFile(filepath.Join(testbin.RepoRoot(), f))
		if err != nil {
			t.Fatal(err)
		}
		got, err := markedBlocks(b, f, repairOnlyTolerationMarker)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 {
			t.Fatalf("%s: %d blocks after %s, want 1", f, len(got), repairOnlyTolerationMarker)
		}
		blocks = append(blocks, got[0])
	}
	if blocks[0] != blocks[1] {
		t.Fatalf("README.md's toleration block differs from docs/install.md's:\n%s\n---\n%s", blocks[0], blocks[1])
	}
	m := regexp.MustCompile(`(?s)^kubectl -n consul patch daemonset (\S+) --type=json -p '(.*)'\n$`).FindStringSubmatch(blocks[0])
	if m == nil {
		t.Fatalf("the block is not one kubectl JSON patch of consul-k8s's DaemonSet:\n%s", blocks[0])
	}
	if m[1] != "consul-cni" {
		t.Errorf("the block patches DaemonSet %q; the README's hand-over step names consul-k8s's consul-cni", m[1])
	}
	var ops []struct {
		Op, Path string
		Value    corev1.Toleration
	}
	if err := json.Unmarshal([]byte(m[2]), &ops); err != nil {
		t.Fatalf("the patch %s: %v", m[2], err)
	}
	taint := corev1.Taint{Key: startupTaintKey, Value: "true", Effect: corev1.TaintEffectNoSchedule}
	if len(ops) != 1 || ops[0].Op != "add" || ops[0].Path != "/spec/template/spec/tolerations/-" {
		t.Fatalf("the patch %+v: want one add to /spec/template/spec/tolerations/-", ops)
	}
	if !ops[0].Value.ToleratesTaint(klog.Background(), &taint, false) {
		t.Fatalf("the toleration %+v does not tolerate the startup taint %s", ops[0].Value, taint.ToString())
	}
}
