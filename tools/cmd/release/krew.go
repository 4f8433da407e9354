package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// The kubectl plugin as krew installs it. For every platform of the repair
// image, plugin/kubectl-consul_cni-<tag>-<os>-<arch>.tar.gz holds the
// repair binary under the plugin's name (repair runs the audit when called
// by that name), and plugin/consul-cni.yaml is the krew manifest naming
// each archive's download address on the tag's release and its sha256:
// `kubectl krew install --manifest=consul-cni.yaml` (or --manifest-url).
const (
	pluginImage  = "repair"
	pluginBinary = "kubectl-consul_cni"
	krewName     = "consul-cni"
	// releaseDownload is where the release workflow attaches dist/'s files.
	releaseDownload = "https://github.com/consul-cni-repair/consul-cni-repair/releases/download"
)

// krewPlugin is the part of krew's Plugin (krew.googlecontainertools.github.com/v1alpha2)
// this tool writes.
type krewPlugin struct {
	APIVersion string       `json:"apiVersion"`
	Kind       string       `json:"kind"`
	Metadata   krewMetadata `json:"metadata"`
	Spec       krewSpec     `json:"spec"`
}

type krewMetadata struct {
	Name string `json:"name"`
}

type krewSpec struct {
	Version          string         `json:"version"`
	Homepage         string         `json:"homepage"`
	ShortDescription string         `json:"shortDescription"`
	Description      string         `json:"description"`
	Platforms        []krewPlatform `json:"platforms"`
}

type krewPlatform struct {
	Selector krewSelector `json:"selector"`
	URI      string       `json:"uri"`
	SHA256   string       `json:"sha256"`
	Bin      string       `json:"bin"`
}

type krewSelector struct {
	MatchLabels map[string]string `json:"matchLabels"`
}

// writePlugin writes the plugin's archives and krew manifest under
// out/plugin from the repair binaries of every platform.
func writePlugin(out, tag string, bins []binary) error {
	dir := filepath.Join(out, "plugin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	p := krewPlugin{
		APIVersion: "krew.googlecontainertools.github.com/v1alpha2",
		Kind:       "Plugin",
		Metadata:   krewMetadata{Name: krewName},
		Spec: krewSpec{
			Version:          tag,
			Homepage:         "https://github.com/consul-cni-repair/consul-cni-repair",
			ShortDescription: "Find Consul mesh pods running outside the mesh",
			Description: "Lists the Consul transparent-proxy pods that run outside the mesh because their sandbox was made\n" +
				"before the consul-cni plugin was in the node's CNI chain (consul-k8s #3060), judged as the\n" +
				"consul-cni-repair controller judges them: kubectl consul-cni audit. Exit code 3 when some do.\n",
		},
	}
	for _, b := range bins {
		if b.Name != pluginImage {
			continue
		}
		osName, arch, ok := strings.Cut(b.Platform, "/")
		if !ok {
			return fmt.Errorf("platform %q is not os/arch", b.Platform)
		}
		archive, err := pluginArchive(b.Data)
		if err != nil {
			return err
		}
		name := fmt.Sprintf("%s-%s-%s-%s.tar.gz", pluginBinary, tag, osName, arch)
		if err := os.WriteFile(filepath.Join(dir, name), archive, 0o644); err != nil {
			return err
		}
		sum := sha256.Sum256(archive)
		p.Spec.Platforms = append(p.Spec.Platforms, krewPlatform{
			Selector: krewSelector{MatchLabels: map[string]string{"os": osName, "arch": arch}},
			URI:      releaseDownload + "/" + tag + "/" + name,
			SHA256:   hex.EncodeToString(sum[:]),
			Bin:      pluginBinary,
		})
	}
	if len(p.Spec.Platforms) == 0 {
		return fmt.Errorf("no %s binary: no plugin to package", pluginImage)
	}
	y, err := yaml.Marshal(p)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, krewName+".yaml"), y, 0o644)
}

// pluginArchive is a gzipped tar holding data as the executable
// pluginBinary, with fixed times so that a rebuild gives the same bytes.
func pluginArchive(data []byte) ([]byte, error) {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	hdr := &tar.Header{Name: pluginBinary, Mode: 0o755, Size: int64(len(data)), ModTime: time.Unix(0, 0), Typeflag: tar.TypeReg}
	if err := tw.WriteHeader(hdr); err != nil {
		return nil, err
	}
	if _, err := tw.Write(data); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := gz.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
