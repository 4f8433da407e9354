package manifests

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// helmDocs generates the chart's README.md from README.md.gotmpl and the
// `# --` comments of values.yaml; pinned here, installed with `go install`
// (the module proxy, checksums from go.sum's database), so no go.mod of the
// project carries it.
const helmDocs = "github.com/norwoodj/helm-docs/cmd/helm-docs@v1.14.2"

// updateDocsEnv, set to 1, makes TestChartREADMEGenerated write the README
// (`make chart-docs`).
const updateDocsEnv = "CCR_UPDATE_DOCS"

// chartREADME runs helm-docs on the chart and returns what it renders.
// helm-docs is installed first, on its own: what the go command says while
// it downloads and builds (a cold module cache) is not helm-docs warning.
func chartREADME(t *testing.T) string {
	t.Helper()
	bin := t.TempDir()
	install := exec.Command("go", "install", helmDocs)
	install.Dir = t.TempDir() // outside every module of the project
	install.Env = append(os.Environ(), "GOBIN="+bin, "GOFLAGS=-mod=mod", "GOWORK=off")
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("go install %s: %v\n%s", helmDocs, err, out)
	}
	cmd := exec.Command(filepath.Join(bin, "helm-docs"), "--chart-search-root", chartDir(t), "--sort-values-order", "file",
		"--skip-version-footer", "--log-level", "warning", "--dry-run")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Dir = install.Dir
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\n%s", helmDocs, err, stderr.String())
	}
	if stderr.Len() > 0 {
		t.Fatalf("%s warned (an unparsable value or comment):\n%s", helmDocs, stderr.String())
	}
	return stdout.String()
}

// TestChartREADMEGenerated: the chart's README.md is what helm-docs makes of
// values.yaml, and every value in it has a description.
func TestChartREADMEGenerated(t *testing.T) {
	want := chartREADME(t)
	path := filepath.Join(chartDir(t), "README.md")
	if os.Getenv(updateDocsEnv) == "1" {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("%s differs from what helm-docs makes of values.yaml: run `make chart-docs`", path)
	}
	rows := 0
	for _, l := range strings.Split(want, "\n") {
		cells := strings.Split(l, " | ")
		if !strings.HasPrefix(l, "| ") || len(cells) < 4 || strings.HasPrefix(l, "| Key ") {
			continue
		}
		rows++
		if strings.TrimSpace(strings.TrimSuffix(cells[len(cells)-1], "|")) == "" {
			t.Errorf("value %s has no description: add a `# --` comment above it in values.yaml", strings.TrimPrefix(cells[0], "| "))
		}
	}
	if rows < 20 {
		t.Errorf("the generated README lists %d values", rows)
	}
}
