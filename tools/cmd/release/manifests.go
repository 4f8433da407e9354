package main

import (
	"fmt"
	"os"
	"path/filepath"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/consul-cni-repair/consul-cni-repair/tools/ociimage"
)

// overlays are the released variants: output name -> kustomization
// directory under manifests/.
var overlays = map[string]string{
	"default": "base",
	"audit":   "overlays/audit",
	"delete":  "overlays/delete",
	"label":   "overlays/label",
}

// renderOverlay builds manifests/<dir> with every image set to
// <registry>/<name>:<tag>, as `kustomize edit set image` in a
// kustomization on top of it would, and returns the YAML stream.
func renderOverlay(manifests, dir, registry, tag string) ([]byte, error) {
	abs, err := filepath.Abs(filepath.Join(manifests, dir))
	if err != nil {
		return nil, err
	}
	type imageEntry struct {
		Name    string `json:"name"`
		NewName string `json:"newName"`
		NewTag  string `json:"newTag"`
	}
	k := struct {
		APIVersion string       `json:"apiVersion"`
		Kind       string       `json:"kind"`
		Resources  []string     `json:"resources"`
		Images     []imageEntry `json:"images"`
	}{APIVersion: "kustomize.config.k8s.io/v1beta1", Kind: "Kustomization"}
	for _, s := range ociimage.Specs {
		k.Images = append(k.Images, imageEntry{Name: s.Repository(ociimage.ManifestRegistry), NewName: s.Repository(registry), NewTag: tag})
	}
	top, err := os.MkdirTemp("", "release-kustomize-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(top)
	// kustomize takes a directory resource by relative path only.
	rel, err := filepath.Rel(top, abs)
	if err != nil {
		return nil, err
	}
	k.Resources = []string{rel}
	raw, err := yaml.Marshal(k)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(top, "kustomization.yaml"), raw, 0o644); err != nil {
		return nil, err
	}
	rm, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), top)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	return rm.AsYaml()
}
