package main

import (
	"bytes"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/consul-cni-repair/consul-cni-repair/tools/ociimage"
)

func TestPublishRefusesARegistryThatIsNotHostAndPath(t *testing.T) {
	for _, tc := range []struct {
		registry, version string
		ok                bool
	}{
		{"127.0.0.1:5000/ccr", "v0.1.0", true},
		{"ghcr.io/consul-cni-repair", "v0.1.0", true},
		{"", "v0.1.0", false},
		{"https://ghcr.io/consul-cni-repair", "v0.1.0", false},
		{"ghcr.io/Upper/Case", "v0.1.0", false},
		{"ghcr.io/consul-cni-repair", "", false},
	} {
		o := &publishOptions{registry: tc.registry, version: tc.version}
		err := o.validate()
		if (err == nil) != tc.ok {
			t.Errorf("registry %q version %q: error %v, want ok=%v", tc.registry, tc.version, err, tc.ok)
		}
	}
}

func TestPublishSpeaksPlainHTTPOnlyToLoopbackOrWhenAsked(t *testing.T) {
	for _, tc := range []struct {
		registry  string
		plainHTTP bool
		want      bool
	}{
		{"127.0.0.1:5000/ccr", false, true},
		{"localhost:5000/ccr", false, true},
		{"ghcr.io/consul-cni-repair", false, false},
		{"registry.internal:5000/ccr", true, true},
	} {
		o := &publishOptions{registry: tc.registry, plainHTTP: tc.plainHTTP}
		if got := o.plain(); got != tc.want {
			t.Errorf("%s (--plain-http=%v): plain %v, want %v", tc.registry, tc.plainHTTP, got, tc.want)
		}
	}
}

// TestPushImageWritesTheIndexWithEveryPlatform pushes an archive of a
// two-platform index to a registry served in the test and reads it back.
func TestPushImageWritesTheIndexWithEveryPlatform(t *testing.T) {
	srv := httptest.NewServer(registry.New())
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")

	var idx v1.ImageIndex = empty.Index
	for _, arch := range []string{"amd64", "arm64"} {
		img, err := random.Image(512, 2)
		if err != nil {
			t.Fatal(err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img,
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}}})
	}
	spec := ociimage.Specs[0]
	images := t.TempDir()
	if err := ociimage.WriteArchive(filepath.Join(images, spec.ArchiveName()), idx, spec.Ref(ociimage.ManifestRegistry, "v0.1.0"), time.Unix(0, 0)); err != nil {
		t.Fatal(err)
	}

	o := &publishOptions{images: images, registry: host + "/ccr", version: "v0.1.0"}
	var out bytes.Buffer
	if err := pushImage(o, spec, "v0.1.0", &out); err != nil {
		t.Fatal(err)
	}
	ref, err := name.NewTag(host + "/ccr/" + spec.Name + ":v0.1.0")
	if err != nil {
		t.Fatal(err)
	}
	got, err := remote.Index(ref)
	if err != nil {
		t.Fatalf("the pushed index: %v", err)
	}
	want, _ := idx.Digest()
	if d, _ := got.Digest(); d != want {
		t.Errorf("registry holds %s, want %s", d, want)
	}
	im, err := got.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range im.Manifests {
		if _, err := got.Image(m.Digest); err != nil {
			t.Errorf("platform %s image %s: %v", m.Platform, m.Digest, err)
		}
	}
	line := out.String()
	for _, w := range []string{ref.String() + "@" + want.String(), "linux/amd64 ", "linux/arm64 "} {
		if !strings.Contains(line, w) {
			t.Errorf("output %q lacks %q", line, w)
		}
	}
}

// TestRetargetImagesNamesTheRegistryPublishedTo works on a copy of the
// real chart.
func TestRetargetImagesNamesTheRegistryPublishedTo(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "consul-cni-repair")
	if err := copyChart(filepath.Join("..", "..", "..", "charts", "consul-cni-repair"), dir); err != nil {
		t.Fatal(err)
	}
	if err := retargetImages(dir, "127.0.0.1:5000/ccr"); err != nil {
		t.Fatal(err)
	}
	values, err := os.ReadFile(filepath.Join(dir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, spec := range []string{"repair", "consul-cni-installer"} {
		if !bytes.Contains(values, []byte("127.0.0.1:5000/ccr/"+spec)) {
			t.Errorf("values.yaml does not name 127.0.0.1:5000/ccr/%s", spec)
		}
	}
	if bytes.Contains(values, []byte(ociimage.ManifestRegistry+"/")) {
		t.Errorf("values.yaml still names %s", ociimage.ManifestRegistry)
	}
	// A second pass finds nothing of the project's registry to retarget.
	if err := retargetImages(dir, "registry.example/other"); err == nil {
		t.Error("retargeting a chart without the project's image repositories: no error")
	}
}
