package cnichain

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
)

func readGolden(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testbin.RepoRoot(), "pkg", "redirect", "iptables", "testdata", name+".golden"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// GoldenTable returns the nat table of one family after ADD from the
// pkg/redirect/iptables golden file name (the section ends where the next "## "
// heading starts).
func GoldenTable(t testing.TB, name string, fam redirect.Family) string {
	t.Helper()
	s := readGolden(t, name)
	head := "## " + fam.String() + " nat table after ADD (iptables-save -t nat)\n"
	i := strings.Index(s, head)
	if i < 0 {
		t.Fatalf("golden %s has no %s table", name, fam)
	}
	s = s[i+len(head):]
	if j := strings.Index(s, "\n## "); j >= 0 {
		s = s[:j+1]
	}
	return s
}

// GoldenConfig returns the redirect-traffic-config the golden file name was
// made from (its second line).
func GoldenConfig(t testing.TB, name string) string {
	t.Helper()
	lines := strings.SplitN(readGolden(t, name), "\n", 3)
	if len(lines) < 3 || !strings.HasPrefix(lines[1], "# {") {
		t.Fatalf("golden %s: the second line is not the config", name)
	}
	return strings.TrimPrefix(lines[1], "# ")
}
