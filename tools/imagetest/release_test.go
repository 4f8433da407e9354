//go:build images

package imagetest

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/consul-cni-repair/consul-cni-repair/tools/ociimage"
)

// TestRelease assembles a release from the built archives the way make
// release does and checks it: checksums verify, the archives are the built
// ones, every rendered overlay names our images with the version's tag
// only, and each SBOM lists every binary of its image per platform with the
// modules it was built from.
func TestRelease(t *testing.T) {
	version := wantVersion(t)
	tag, err := ociimage.Tag(version)
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	tool := filepath.Join(tmp, "release")
	if out, err := exec.Command("go", "build", "-o", tool, "../cmd/release").CombinedOutput(); err != nil {
		t.Fatalf("building the release tool: %v\n%s", err, out)
	}
	dist := filepath.Join(tmp, "dist")
	for _, args := range [][]string{
		{"assemble", "--images", imagesDir(), "--out", dist, "--manifests", filepath.Join(repoRoot, "manifests"), "--version", version},
		{"checksums", "--dir", dist},
	} {
		if out, err := exec.Command(tool, args...).CombinedOutput(); err != nil {
			t.Fatalf("release %s: %v\n%s", args[0], err, out)
		}
	}
	sum := exec.Command("sha256sum", "--check", "--strict", "--quiet", "SHA256SUMS")
	sum.Dir = dist
	if out, err := sum.CombinedOutput(); err != nil {
		t.Errorf("sha256sum --check: %v\n%s", err, out)
	}
	for _, spec := range ociimage.Specs {
		built, err := os.ReadFile(filepath.Join(imagesDir(), spec.ArchiveName()))
		if err != nil {
			t.Fatal(err)
		}
		released, err := os.ReadFile(filepath.Join(dist, "images", spec.Name+"-"+tag+".oci.tar"))
		if err != nil || !bytes.Equal(built, released) {
			t.Errorf("released archive of %s differs from the built one (%v)", spec.Name, err)
		}
		checkSBOM(t, filepath.Join(dist, "sbom", spec.Name+".cdx.json"), spec, tag)
	}
	checkRenderedManifests(t, filepath.Join(dist, "manifests"), tag)
}

var ourImage = regexp.MustCompile(`image: (\S*/(repair|consul-cni-installer|consul-cni-check))(:\S+)?`)

func checkRenderedManifests(t *testing.T, dir, tag string) {
	t.Helper()
	for _, name := range []string{"default", "audit", "delete", "label"} {
		raw, err := os.ReadFile(filepath.Join(dir, "consul-cni-repair-"+name+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		found := map[string]bool{}
		for _, m := range ourImage.FindAllStringSubmatch(string(raw), -1) {
			found[m[2]] = true
			if m[3] != ":"+tag {
				t.Errorf("%s: %q, want tag %s", name, m[0], tag)
			}
		}
		if !found["repair"] || !found["consul-cni-installer"] {
			t.Errorf("%s: images of repair and consul-cni-installer not both found (%v)", name, found)
		}
	}
}

// wantModules are modules each image's binaries certainly embed.
var wantModules = map[string][]string{
	"repair":               {"k8s.io/client-go", "github.com/prometheus/client_golang"},
	"consul-cni-installer": {"github.com/containernetworking/cni", "k8s.io/client-go"},
	"consul-cni-check":     {"k8s.io/client-go"},
}

func checkSBOM(t *testing.T, path string, spec ociimage.Spec, tag string) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var bom struct {
		BOMFormat, SpecVersion string
		Metadata               struct {
			Component struct{ Name, Version string }
		}
		Components []struct {
			Type, Name, Version, PURL string
			BOMRef                    string `json:"bom-ref"`
		}
	}
	if err := json.Unmarshal(raw, &bom); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if bom.BOMFormat != "CycloneDX" || bom.Metadata.Component.Version != tag || !strings.HasSuffix(bom.Metadata.Component.Name, "/"+spec.Name) {
		t.Errorf("%s: format %q, component %+v; want CycloneDX, .../%s %s", path, bom.BOMFormat, bom.Metadata.Component, spec.Name, tag)
	}
	apps, mods := map[string]bool{}, map[string]bool{}
	for _, c := range bom.Components {
		switch c.Type {
		case "application":
			apps[c.BOMRef] = true
		case "library":
			if c.Version == "" || !strings.HasPrefix(c.PURL, "pkg:golang/") {
				t.Errorf("%s: module %s without version or Go purl (%q)", path, c.Name, c.PURL)
			}
			mods[c.Name] = true
		}
	}
	for _, b := range spec.Binaries {
		for _, p := range []string{"linux/amd64", "linux/arm64"} {
			if !apps[b+"@"+p] {
				t.Errorf("%s: no component for %s on %s", path, b, p)
			}
		}
	}
	for _, m := range append(wantModules[spec.Name], "stdlib") {
		if !mods[m] {
			t.Errorf("%s: module %s not listed", path, m)
		}
	}
}
