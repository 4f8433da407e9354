package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestSBOMListsTheBinarysModules(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	img := image{Repository: "registry.example/p/x", Tag: "v0.1.0", Digest: "sha256:abc", Version: "v0.1.0", Created: "2026-01-01T00:00:00Z"}
	raw, err := sbom(img, []binary{{Name: "x", Platform: "linux/amd64", Data: data}})
	if err != nil {
		t.Fatal(err)
	}
	var bom cdxBOM
	if err := json.Unmarshal(raw, &bom); err != nil {
		t.Fatal(err)
	}
	if bom.BOMFormat != "CycloneDX" || bom.SpecVersion != "1.5" || !strings.HasPrefix(bom.SerialNumber, "urn:uuid:") {
		t.Errorf("header %s %s %s", bom.BOMFormat, bom.SpecVersion, bom.SerialNumber)
	}
	if c := bom.Metadata.Component; c.Type != "container" || c.Name != img.Repository || c.Version != "v0.1.0" {
		t.Errorf("metadata component %+v", c)
	}
	purls := map[string]bool{}
	for _, c := range bom.Components {
		purls[c.PURL] = true
	}
	// The test binary embeds this module's dependencies.
	for _, want := range []string{"pkg:golang/github.com/google/go-containerregistry@v0.22.1", "pkg:golang/sigs.k8s.io/yaml@v1.6.0"} {
		if !purls[want] {
			t.Errorf("SBOM lacks %s", want)
		}
	}
	if len(bom.Dependencies) != 2 || bom.Dependencies[0].DependsOn[0] != "x@linux/amd64" {
		t.Errorf("dependencies %+v", bom.Dependencies)
	}
	if _, err := sbom(img, []binary{{Name: "y", Platform: "linux/amd64", Data: []byte("not a binary")}}); err == nil {
		t.Error("SBOM of a non-Go file: no error")
	}
}

func TestRenderOverlaySetsTags(t *testing.T) {
	y, err := renderOverlay(filepath.Join("..", "..", "..", "manifests"), "overlays/audit", "registry.example/team", "v9.9.9")
	if err != nil {
		t.Fatal(err)
	}
	s := string(y)
	for _, want := range []string{"image: registry.example/team/repair:v9.9.9", "image: registry.example/team/consul-cni-installer:v9.9.9", "--dry-run=true"} {
		if !strings.Contains(s, want) {
			t.Errorf("rendered audit overlay lacks %q", want)
		}
	}
	if strings.Contains(s, "ghcr.io/") {
		t.Error("rendered overlay still names ghcr.io")
	}
}

func TestChecksumsVerify(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "a"), 0o755); err != nil {
		t.Fatal(err)
	}
	for p, c := range map[string]string{"a/one": "1", "two": "2"} {
		if err := os.WriteFile(filepath.Join(dir, p), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := writeChecksums(dir); err != nil {
		t.Fatal(err)
	}
	check := func() error {
		cmd := exec.Command("sha256sum", "--check", "--strict", sumsFile)
		cmd.Dir = dir
		return cmd.Run()
	}
	if err := check(); err != nil {
		t.Fatalf("sha256sum --check: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "two"), []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := check(); err == nil {
		t.Error("sha256sum --check passed after a file changed")
	}
}
