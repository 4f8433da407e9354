package ociimage

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestTag(t *testing.T) {
	for in, want := range map[string]string{
		"v0.1.0":                     "v0.1.0",
		"v0.1.0-3-gabcdef0-dirty":    "v0.1.0-3-gabcdef0-dirty",
		"v0.0.0-dev+gabcdef012345":   "v0.0.0-dev-gabcdef012345",
		"v0.0.0-dev+g1-dirty/x y":    "v0.0.0-dev-g1-dirty-x-y",
		"v1.2.3+build.7":             "v1.2.3-build.7",
		strings.Repeat("a", 128):     strings.Repeat("a", 128),
		"0.1.0_rc1":                  "0.1.0_rc1",
		"v0.1.0+meta.with_underline": "v0.1.0-meta.with_underline",
	} {
		got, err := Tag(in)
		if err != nil || got != want {
			t.Errorf("Tag(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "-v1", ".v1", strings.Repeat("a", 129)} {
		if got, err := Tag(bad); err == nil {
			t.Errorf("Tag(%q) = %q, want an error", bad, got)
		}
	}
}

// fakeBins writes small stand-in binaries for every spec's files.
func fakeBins(t *testing.T, content string) []Platform {
	t.Helper()
	var ps []Platform
	for _, arch := range []string{"amd64", "arm64"} {
		dir := filepath.Join(t.TempDir(), "linux_"+arch)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, s := range Specs {
			for _, b := range s.Binaries {
				if err := os.WriteFile(filepath.Join(dir, b), []byte(content+b+arch), 0o755); err != nil {
					t.Fatal(err)
				}
			}
		}
		ps = append(ps, Platform{OS: "linux", Arch: arch, BinDir: dir})
	}
	return ps
}

func TestBuildIsReproducible(t *testing.T) {
	created := time.Unix(1700000000, 0)
	labels := Labels{Source: "https://example.invalid/src", Revision: "abc", Version: "v0.1.0", Created: created.UTC().Format(time.RFC3339)}
	digest := func(ps []Platform, c time.Time) string {
		idx, err := Build(Specs[1], ps, labels, c)
		if err != nil {
			t.Fatal(err)
		}
		d, err := idx.Digest()
		if err != nil {
			t.Fatal(err)
		}
		return d.String()
	}
	a := digest(fakeBins(t, "one"), created)
	if b := digest(fakeBins(t, "one"), created); a != b {
		t.Errorf("same inputs, different index digests: %s, %s", a, b)
	}
	if b := digest(fakeBins(t, "two"), created); a == b {
		t.Errorf("different binaries, same index digest %s", a)
	}
	if b := digest(fakeBins(t, "one"), created.Add(time.Second)); a == b {
		t.Errorf("different creation time, same index digest %s", a)
	}
}

func TestArchiveRoundTrip(t *testing.T) {
	created := time.Unix(1700000000, 0)
	labels := Labels{Source: "s", Revision: "r", Version: "v0.1.0", Created: created.UTC().Format(time.RFC3339)}
	spec := Specs[0]
	idx, err := Build(spec, fakeBins(t, "x"), labels, created)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, spec.ArchiveName())
	ref := spec.Ref("registry.example/p", "v0.1.0")
	if err := WriteArchive(path, idx, ref, created); err != nil {
		t.Fatal(err)
	}
	back, gotRef, err := ReadArchive(path, filepath.Join(dir, "unpacked"))
	if err != nil {
		t.Fatal(err)
	}
	if gotRef != ref {
		t.Errorf("ref name %q, want %q", gotRef, ref)
	}
	want, _ := idx.Digest()
	got, err := back.Digest()
	if err != nil || got != want {
		t.Fatalf("index digest after round trip %s (%v), want %s", got, err, want)
	}
	im, err := back.IndexManifest()
	if err != nil || len(im.Manifests) != 2 {
		t.Fatalf("index: %v, %d manifests, want 2", err, len(im.Manifests))
	}
	img, err := back.Image(im.Manifests[1].Digest)
	if err != nil {
		t.Fatal(err)
	}
	files, err := Files(img)
	if err != nil {
		t.Fatal(err)
	}
	if f, ok := files["usr/local/bin/repair"]; !ok || string(f.Data) != "xrepairarm64" || f.Header.Mode != 0o755 {
		t.Errorf("usr/local/bin/repair in the arm64 image: %v %q", ok, f.Data)
	}
	if f := files["etc/passwd"]; !strings.Contains(string(f.Data), "nonroot:x:65532:65532:") {
		t.Errorf("etc/passwd = %q, want an entry for 65532", f.Data)
	}
	if f := files["etc/group"]; !strings.Contains(string(f.Data), "nonroot:x:65532:") {
		t.Errorf("etc/group = %q, want an entry for 65532", f.Data)
	}
	a, _ := os.ReadFile(path)
	if err := WriteArchive(path, idx, ref, created); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(a) != string(b) {
		t.Error("writing the same index twice gave different archives")
	}
}
