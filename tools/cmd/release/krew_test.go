package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/yaml"
)

// The krew manifest names one archive per platform of the repair image, at
// the tag's release, with the archive's sha256; each archive holds the
// repair binary of its platform as the executable kubectl-consul_cni; the
// installer's binaries are not packaged; a rebuild gives the same bytes.
func TestWritePluginKrewManifest(t *testing.T) {
	out := t.TempDir()
	bins := []binary{
		{Name: "repair", Platform: "linux/amd64", Data: []byte("repair for amd64")},
		{Name: "consul-cni", Platform: "linux/amd64", Data: []byte("not the plugin")},
		{Name: "repair", Platform: "linux/arm64", Data: []byte("repair for arm64")},
	}
	if err := writePlugin(out, "v1.2.3", bins); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(out, "plugin", "consul-cni.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var p krewPlugin
	if err := yaml.UnmarshalStrict(b, &p); err != nil {
		t.Fatal(err)
	}
	if p.APIVersion != "krew.googlecontainertools.github.com/v1alpha2" || p.Kind != "Plugin" || p.Metadata.Name != "consul-cni" || p.Spec.Version != "v1.2.3" || len(p.Spec.Platforms) != 2 {
		t.Fatalf("manifest:\n%s", b)
	}
	for i, arch := range []string{"amd64", "arm64"} {
		pl := p.Spec.Platforms[i]
		name := "kubectl-consul_cni-v1.2.3-linux-" + arch + ".tar.gz"
		if pl.Selector.MatchLabels["os"] != "linux" || pl.Selector.MatchLabels["arch"] != arch || pl.Bin != "kubectl-consul_cni" ||
			pl.URI != "https://github.com/consul-cni-repair/consul-cni-repair/releases/download/v1.2.3/"+name {
			t.Errorf("platform %d: %+v", i, pl)
		}
		archive, err := os.ReadFile(filepath.Join(out, "plugin", name))
		if err != nil {
			t.Fatal(err)
		}
		if sum := sha256.Sum256(archive); hex.EncodeToString(sum[:]) != pl.SHA256 {
			t.Errorf("%s: sha256 %x, manifest %s", name, sum, pl.SHA256)
		}
		hdr, data := onlyFile(t, archive)
		if hdr.Name != "kubectl-consul_cni" || hdr.Mode != 0o755 || string(data) != "repair for "+arch {
			t.Errorf("%s: %s mode %o holds %q", name, hdr.Name, hdr.Mode, data)
		}
		again, err := pluginArchive([]byte("repair for " + arch))
		if err != nil || !bytes.Equal(again, archive) {
			t.Errorf("%s: a rebuild differs (%v)", name, err)
		}
	}
	if err := writePlugin(t.TempDir(), "v1.2.3", bins[1:2]); err == nil {
		t.Error("no repair binary: want an error, not an empty manifest")
	}
}

// onlyFile returns the header and content of the one file of a .tar.gz.
func onlyFile(t *testing.T, archive []byte) (*tar.Header, []byte) {
	t.Helper()
	gz, err := gzip.NewReader(bytes.NewReader(archive))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	hdr, err := tr.Next()
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(tr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Next(); err != io.EOF {
		t.Fatalf("more than one file (%v)", err)
	}
	return hdr, data
}
