// Package ociimage builds the project's container images with
// go-containerregistry: FROM scratch, static binaries under /usr/local/bin,
// /etc/passwd and /etc/group for the user each image runs as, one image per
// platform and a multi-arch OCI index per image, written as an OCI archive
// (an OCI image layout in a tar file). Every byte is derived from the inputs
// (binaries, version, revision, creation time), so a rebuild of the same
// commit yields the same digests.
package ociimage

import (
	"fmt"
	"regexp"
	"strings"
)

// ManifestRegistry is the registry and path the manifests name the images
// under; the images are built with these names unless told otherwise.
const ManifestRegistry = "ghcr.io/consul-cni-repair"

// BinDir is where the binaries live inside every image; it is the image's
// PATH, so the manifests' `command: [consul-cni-installer]` resolves.
const BinDir = "/usr/local/bin"

// Spec describes one image.
type Spec struct {
	// Name is the repository's last path element and the archive's name.
	Name string
	// Binaries are copied into BinDir; the first is the entrypoint.
	Binaries []string
	// UID and GID the image runs as (the config's User), with a
	// /etc/passwd and /etc/group entry named User.
	UID, GID int
	User     string
	// Manifest is the repository file (relative to its root) whose
	// runAsUser this image's UID must match.
	Manifest string
}

// Specs are the project's images. The UIDs are the ones the manifests run:
// the installer is root (it owns the host's CNI directories), the
// controller 65532, the init-container check 5997 (any UID but the proxy's
// 5995 and consul-k8s's excluded 5996).
var Specs = []Spec{
	{Name: "repair", Binaries: []string{"repair"}, UID: 65532, GID: 65532, User: "nonroot",
		Manifest: "manifests/base/controller/deployment.yaml"},
	{Name: "consul-cni-installer", Binaries: []string{"consul-cni-installer", "consul-cni", "consul-cni-verifier"}, UID: 0, GID: 0, User: "root",
		Manifest: "manifests/base/cni/daemonset.yaml"},
	{Name: "consul-cni-check", Binaries: []string{"consul-cni-check"}, UID: 5997, GID: 5997, User: "consul-cni-check",
		Manifest: "docs/examples/init-check/app.yaml"},
}

// Entrypoint is the image's entrypoint: its first binary.
func (s Spec) Entrypoint() []string {
	return []string{BinDir + "/" + s.Binaries[0]}
}

// UserString is the image config's User: numeric, so that a runtime can
// verify runAsNonRoot without reading /etc/passwd.
func (s Spec) UserString() string {
	return fmt.Sprintf("%d:%d", s.UID, s.GID)
}

// ArchiveName is the file name of the image's OCI archive.
func (s Spec) ArchiveName() string {
	return s.Name + ".oci.tar"
}

// Repository is registry/name.
func (s Spec) Repository(registry string) string {
	return strings.TrimSuffix(registry, "/") + "/" + s.Name
}

// Ref is the image's reference: registry/name:tag.
func (s Spec) Ref(registry, tag string) string {
	return s.Repository(registry) + ":" + tag
}

var (
	tagInvalid = regexp.MustCompile(`[^A-Za-z0-9_.-]`)
	tagValid   = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)
)

// Tag turns a version string into an image tag: characters a tag may not
// hold (the "+" of v0.0.0-dev+gabc) become "-". It fails when nothing
// usable is left.
func Tag(version string) (string, error) {
	t := tagInvalid.ReplaceAllString(version, "-")
	if !tagValid.MatchString(t) {
		return "", fmt.Errorf("version %q gives no valid image tag (%q)", version, t)
	}
	return t, nil
}

// Labels are the OCI annotations every image and index carries.
type Labels struct {
	Source, Revision, Version, Created string
}

// Map returns the labels under their org.opencontainers.image keys.
func (l Labels) Map() map[string]string {
	return map[string]string{
		"org.opencontainers.image.source":   l.Source,
		"org.opencontainers.image.revision": l.Revision,
		"org.opencontainers.image.version":  l.Version,
		"org.opencontainers.image.created":  l.Created,
	}
}
