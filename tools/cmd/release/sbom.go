package main

import (
	"bytes"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/json"
	"fmt"
	"net/url"
	"sort"
	"strings"
)

// binary is one executable of an image, for one platform.
type binary struct {
	Name, Platform string
	Data           []byte
}

// cdx* are the parts of a CycloneDX 1.5 JSON BOM this tool writes.
type cdxBOM struct {
	BOMFormat    string          `json:"bomFormat"`
	SpecVersion  string          `json:"specVersion"`
	SerialNumber string          `json:"serialNumber"`
	Version      int             `json:"version"`
	Metadata     cdxMetadata     `json:"metadata"`
	Components   []cdxComponent  `json:"components"`
	Dependencies []cdxDependency `json:"dependencies"`
}

type cdxMetadata struct {
	Timestamp string       `json:"timestamp"`
	Component cdxComponent `json:"component"`
}

type cdxComponent struct {
	Type       string        `json:"type"`
	BOMRef     string        `json:"bom-ref"`
	Name       string        `json:"name"`
	Version    string        `json:"version,omitempty"`
	PURL       string        `json:"purl,omitempty"`
	Properties []cdxProperty `json:"properties,omitempty"`
}

type cdxProperty struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

type cdxDependency struct {
	Ref       string   `json:"ref"`
	DependsOn []string `json:"dependsOn"`
}

// image identifies the container the BOM describes.
type image struct {
	Repository, Tag, Digest, Version, Created string
}

// sbom is the CycloneDX BOM of an image: one application component per
// binary and platform (with its build settings), one library component per
// Go module any of them embeds (as `go version -m` lists them), the Go
// standard library, and which binary depends on which module.
func sbom(img image, bins []binary) ([]byte, error) {
	mods := map[string]cdxComponent{}
	bom := cdxBOM{
		BOMFormat: "CycloneDX", SpecVersion: "1.5", Version: 1,
		SerialNumber: serial(img.Digest),
		Metadata: cdxMetadata{Timestamp: img.Created, Component: cdxComponent{
			Type: "container", BOMRef: img.Repository + "@" + img.Digest, Name: img.Repository, Version: img.Tag,
			PURL: fmt.Sprintf("pkg:oci/%s@%s?repository_url=%s&tag=%s", lastElem(img.Repository),
				url.PathEscape(img.Digest), url.QueryEscape(img.Repository), url.QueryEscape(img.Tag)),
		}},
	}
	top := cdxDependency{Ref: bom.Metadata.Component.BOMRef}
	for _, b := range bins {
		bi, err := buildinfo.Read(bytes.NewReader(b.Data))
		if err != nil {
			return nil, fmt.Errorf("%s (%s): build info: %w", b.Name, b.Platform, err)
		}
		app, deps := binaryComponent(b, bi, img.Version, mods)
		bom.Components = append(bom.Components, app)
		bom.Dependencies = append(bom.Dependencies, deps)
		top.DependsOn = append(top.DependsOn, app.BOMRef)
	}
	refs := make([]string, 0, len(mods))
	for r := range mods {
		refs = append(refs, r)
	}
	sort.Strings(refs)
	for _, r := range refs {
		bom.Components = append(bom.Components, mods[r])
	}
	bom.Dependencies = append([]cdxDependency{top}, bom.Dependencies...)
	return json.MarshalIndent(bom, "", "  ")
}

// binaryComponent describes one binary and records the modules it embeds
// in mods.
func binaryComponent(b binary, bi *buildinfo.BuildInfo, version string, mods map[string]cdxComponent) (cdxComponent, cdxDependency) {
	app := cdxComponent{
		Type: "application", BOMRef: b.Name + "@" + b.Platform, Name: b.Name, Version: version,
		PURL: fmt.Sprintf("pkg:golang/%s@%s", bi.Main.Path, version),
		Properties: []cdxProperty{
			{Name: "platform", Value: b.Platform},
			{Name: "go:path", Value: bi.Path},
			{Name: "go:toolchain", Value: bi.GoVersion},
		},
	}
	for _, s := range bi.Settings {
		app.Properties = append(app.Properties, cdxProperty{Name: "go:build:" + s.Key, Value: s.Value})
	}
	std := "pkg:golang/stdlib@" + bi.GoVersion
	mods[std] = cdxComponent{Type: "library", BOMRef: std, Name: "stdlib", Version: bi.GoVersion, PURL: std}
	dep := cdxDependency{Ref: app.BOMRef, DependsOn: []string{std}}
	for _, m := range bi.Deps {
		if m.Replace != nil {
			m = m.Replace
		}
		purl := fmt.Sprintf("pkg:golang/%s@%s", m.Path, m.Version)
		mods[purl] = cdxComponent{Type: "library", BOMRef: purl, Name: m.Path, Version: m.Version, PURL: purl}
		dep.DependsOn = append(dep.DependsOn, purl)
	}
	return app, dep
}

// serial is a stable urn:uuid for the BOM of the image with this digest.
func serial(digest string) string {
	h := sha256.Sum256([]byte("sbom:" + digest))
	h[6] = h[6]&0x0f | 0x50 // name-based
	h[8] = h[8]&0x3f | 0x80 // RFC 4122 variant
	return fmt.Sprintf("urn:uuid:%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
}

func lastElem(repo string) string {
	return repo[strings.LastIndex(repo, "/")+1:]
}
