package manifests

import (
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// runbookURL is where every alert's runbook_url points: a section of
// docs/runbook.md, anchored by the alert's name as GitHub renders headings.
const runbookURL = "https://github.com/consul-cni-repair/consul-cni-repair/blob/main/docs/runbook.md#"

var runbookHeading = regexp.MustCompile(`(?m)^## (\S+)\s*$`)

// runbookSections splits docs/runbook.md into its "## Name" sections, keyed
// by GitHub's anchor of the heading (lower case).
func runbookSections(tb testing.TB) map[string]string {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join(testbin.RepoRoot(), "docs", "runbook.md"))
	if err != nil {
		tb.Fatal(err)
	}
	text := string(b)
	out := map[string]string{}
	locs := runbookHeading.FindAllStringSubmatchIndex(text, -1)
	for i, l := range locs {
		end := len(text)
		if i+1 < len(locs) {
			end = locs[i+1][0]
		}
		out[strings.ToLower(text[l[2]:l[3]])] = text[l[1]:end]
	}
	return out
}

// TestRunbook: every shipped alert has a runbook_url to its own section of
// docs/runbook.md, and that section says what it means, how to confirm it
// (Events, metrics) and what to do.
func TestRunbook(t *testing.T) {
	sections := runbookSections(t)
	_, groups := shippedRules(t)
	n := 0
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			n++
			url := r.Annotations["runbook_url"]
			anchor, ok := strings.CutPrefix(url, runbookURL)
			if !ok {
				t.Errorf("alert %s: runbook_url %q, want %s<anchor>", r.Alert, url, runbookURL)
				continue
			}
			if anchor != strings.ToLower(r.Alert) {
				t.Errorf("alert %s: runbook_url anchor %q, want its own section %q", r.Alert, anchor, strings.ToLower(r.Alert))
			}
			sec, ok := sections[anchor]
			if !ok {
				t.Errorf("alert %s: docs/runbook.md has no section \"## %s\"", r.Alert, r.Alert)
				continue
			}
			// The section names the metrics of whoever exports the alert's.
			prefix := "consul_cni_repair_"
			if strings.Contains(r.Expr, "consul_cni_installer_") {
				prefix = "consul_cni_installer_"
			}
			for _, want := range []string{"**Meaning**", "**Confirm.**", "**Act.**", prefix} {
				if !strings.Contains(sec, want) {
					t.Errorf("alert %s: its runbook section lacks %q", r.Alert, want)
				}
			}
			if !strings.Contains(sec, "kubectl") {
				t.Errorf("alert %s: its runbook section gives no kubectl command to confirm it", r.Alert)
			}
		}
	}
	if n == 0 {
		t.Fatal("no alert in the shipped rules")
	}
}
