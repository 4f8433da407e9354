//go:build images

package imagetest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"sigs.k8s.io/yaml"

	"github.com/consul-cni-repair/consul-cni-repair/tools/ociimage"
)

const repoRoot = "../.."

// imagesDir is where make images wrote the archives ($CCR_IMAGES_DIR).
func imagesDir() string {
	if d := os.Getenv("CCR_IMAGES_DIR"); d != "" {
		return d
	}
	return filepath.Join(repoRoot, "bin", "images")
}

// wantVersion is the version the images must be stamped with
// ($CCR_IMAGE_VERSION, else hack/version.sh of this checkout).
func wantVersion(t *testing.T) string {
	t.Helper()
	if v := os.Getenv("CCR_IMAGE_VERSION"); v != "" {
		return v
	}
	out, err := exec.Command(filepath.Join(repoRoot, "hack", "version.sh")).Output()
	if err != nil {
		t.Fatalf("hack/version.sh: %v", err)
	}
	return strings.TrimSpace(string(out))
}

type archive struct {
	spec  ociimage.Spec
	path  string
	ref   string
	index v1.ImageIndex
}

// readArchive unpacks spec's archive; a missing archive fails the test.
func readArchive(t *testing.T, spec ociimage.Spec) archive {
	t.Helper()
	path := filepath.Join(imagesDir(), spec.ArchiveName())
	idx, ref, err := ociimage.ReadArchive(path, t.TempDir())
	if err != nil {
		t.Fatalf("%v (run make images first)", err)
	}
	return archive{spec: spec, path: path, ref: ref, index: idx}
}

// platformImage returns the archive's image for os/arch.
func (a archive) platformImage(t *testing.T, osName, arch string) v1.Image {
	t.Helper()
	im, err := a.index.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range im.Manifests {
		if m.Platform != nil && m.Platform.OS == osName && m.Platform.Architecture == arch {
			img, err := a.index.Image(m.Digest)
			if err != nil {
				t.Fatal(err)
			}
			return img
		}
	}
	t.Fatalf("%s: no image for %s/%s in the index", a.path, osName, arch)
	return nil
}

// container is the part of a pod template container the tests use.
type container struct {
	Name            string   `json:"name"`
	Image           string   `json:"image"`
	Command         []string `json:"command"`
	Args            []string `json:"args"`
	SecurityContext *struct {
		RunAsUser *int64 `json:"runAsUser"`
	} `json:"securityContext"`
	VolumeMounts []struct {
		Name      string `json:"name"`
		MountPath string `json:"mountPath"`
	} `json:"volumeMounts"`
	ReadinessProbe *struct {
		Exec *struct {
			Command []string `json:"command"`
		} `json:"exec"`
	} `json:"readinessProbe"`
}

type workload struct {
	Spec struct {
		Template struct {
			Spec struct {
				SecurityContext *struct {
					RunAsUser *int64 `json:"runAsUser"`
				} `json:"securityContext"`
				Containers     []container `json:"containers"`
				InitContainers []container `json:"initContainers"`
				Volumes        []struct {
					Name     string `json:"name"`
					HostPath *struct {
						Path string `json:"path"`
					} `json:"hostPath"`
				} `json:"volumes"`
			} `json:"spec"`
		} `json:"template"`
	} `json:"spec"`
}

// manifestContainer finds, in spec.Manifest, the container running spec's
// image and the UID it runs as (its own runAsUser, else the pod's).
func manifestContainer(t *testing.T, spec ociimage.Spec) (workload, container, int64) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot, spec.Manifest))
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range bytes.Split(raw, []byte("\n---")) {
		var w workload
		if err := yaml.Unmarshal(doc, &w); err != nil {
			t.Fatalf("%s: %v", spec.Manifest, err)
		}
		ps := w.Spec.Template.Spec
		for _, c := range append(append([]container{}, ps.Containers...), ps.InitContainers...) {
			if !strings.HasSuffix(strings.SplitN(c.Image, ":", 2)[0], "/"+spec.Name) {
				continue
			}
			switch {
			case c.SecurityContext != nil && c.SecurityContext.RunAsUser != nil:
				return w, c, *c.SecurityContext.RunAsUser
			case ps.SecurityContext != nil && ps.SecurityContext.RunAsUser != nil:
				return w, c, *ps.SecurityContext.RunAsUser
			}
			t.Fatalf("%s: container %s sets no runAsUser", spec.Manifest, c.Name)
		}
	}
	t.Fatalf("%s: no container runs image %s", spec.Manifest, spec.Name)
	return workload{}, container{}, 0
}

// versionLine is what `<command> --version` prints first.
func versionLine(command, version string) string {
	return fmt.Sprintf("%s %s (", command, version)
}
