package realnode

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
)

// ImageRegistry names the images built here; nothing is ever pulled from it.
const ImageRegistry = "ccr.test"

// Image is an OCI archive and the reference it is imported under.
type Image struct {
	Ref     string
	Archive string
}

var images struct {
	sync.Mutex
	tool     string
	projTool string
	pause    string
	pauseBin string
	built    map[string]Image
}

// imageDir is where the archives go (next to the test binaries).
func imageDir() string { return filepath.Join(testbin.Dir(), "realnode-images") }

// BuildImages builds the pause program and image (tests/cmd/pause) once
// per process; Start needs them. StartForTest calls it.
func BuildImages(tb testbin.TB) {
	tb.Helper()
	img := ProgramImage(tb, "pause")
	bin := testbin.Package(tb, "pause", "./tests/cmd/pause")
	images.Lock()
	images.pause, images.pauseBin = img.Archive, bin
	images.Unlock()
}

// pauseBinary is the pause program, which also holds each node's mount
// namespace.
func pauseBinary() string {
	images.Lock()
	defer images.Unlock()
	return images.pauseBin
}

func pauseArchive() string {
	images.Lock()
	defer images.Unlock()
	return images.pause
}

// ProgramImage builds tests/cmd/<name> (static) into a FROM-scratch image
// <ImageRegistry>/<name>:v1 whose entrypoint it is, once per process.
func ProgramImage(tb testbin.TB, name string) Image {
	tb.Helper()
	bin := testbin.Package(tb, name, "./tests/cmd/"+name)
	images.Lock()
	defer images.Unlock()
	if img, ok := images.built[name]; ok {
		return img
	}
	if images.tool == "" {
		images.tool = buildTool(tb, "testimage")
	}
	img := Image{Ref: fmt.Sprintf("%s/%s:v1", ImageRegistry, name), Archive: filepath.Join(imageDir(), name+".oci.tar")}
	tmp := fmt.Sprintf("%s.%d.tmp", img.Archive, os.Getpid())
	out, err := exec.Command(images.tool, "--bin-dir", filepath.Dir(bin), "--binaries", filepath.Base(bin),
		"--ref", img.Ref, "--out", tmp).CombinedOutput()
	if err != nil {
		tb.Fatalf("realnode: image %s: %v\n%s", img.Ref, err, out)
	}
	if err := os.Rename(tmp, img.Archive); err != nil {
		tb.Fatalf("realnode: %v", err)
	}
	if images.built == nil {
		images.built = map[string]Image{}
	}
	images.built[name] = img
	return img
}

// buildTool builds tools/cmd/<name> (module tools/).
func buildTool(tb testbin.TB, name string) string {
	tb.Helper()
	if err := os.MkdirAll(imageDir(), 0o755); err != nil {
		tb.Fatalf("realnode: %v", err)
	}
	out := filepath.Join(imageDir(), name)
	tmp := fmt.Sprintf("%s.%d.tmp", out, os.Getpid())
	cmd := exec.Command("go", "build", "-o", tmp, "./cmd/"+name)
	cmd.Dir = filepath.Join(testbin.RepoRoot(), "tools")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("realnode: go build tools/cmd/%s: %v\n%s", name, err, b)
	}
	if err := os.Rename(tmp, out); err != nil {
		tb.Fatalf("realnode: %v", err)
	}
	return out
}

// ProjectCommands are the commands the project's images hold.
var ProjectCommands = []string{"repair", "consul-cni-installer", "consul-cni", "consul-cni-verifier", "consul-cni-check"}

// ProjectImages builds the project's images as `make images` does
// (tools/cmd/images) for this machine's platform only, from the commands
// built by testbin, named <registry>/<name>:tag with the manifests'
// registry, so that manifests that name that tag run them on a real node
// (imagePullPolicy IfNotPresent or Never). Once per process and tag.
func ProjectImages(tb testbin.TB, tag string) []Image {
	tb.Helper()
	bins := map[string]string{}
	for _, c := range ProjectCommands {
		bins[c] = testbin.Project(tb, c)
	}
	images.Lock()
	defer images.Unlock()
	key := "project:" + tag
	if img, ok := images.built[key]; ok {
		return projectImages(filepath.Dir(img.Archive), tag)
	}
	if images.projTool == "" {
		images.projTool = buildTool(tb, "images")
	}
	work := filepath.Join(imageDir(), fmt.Sprintf("project-%s.%d", tag, os.Getpid()))
	platDir := filepath.Join(work, "linux_"+runtime.GOARCH)
	if err := os.MkdirAll(platDir, 0o755); err != nil {
		tb.Fatalf("realnode: %v", err)
	}
	defer os.RemoveAll(work)
	for c, b := range bins {
		if err := os.Symlink(b, filepath.Join(platDir, c)); err != nil {
			tb.Fatalf("realnode: %v", err)
		}
	}
	// Written aside, then renamed: another test process may read them.
	b, err := exec.Command(images.projTool, "--bin-dir", work, "--out", filepath.Join(work, "out"), "--version", tag,
		"--revision", "test", "--created", "1", "--platforms", "linux/"+runtime.GOARCH).CombinedOutput()
	if err != nil {
		tb.Fatalf("realnode: project images: %v\n%s", err, b)
	}
	out := filepath.Join(imageDir(), "project-"+tag)
	if err := os.MkdirAll(out, 0o755); err != nil {
		tb.Fatalf("realnode: %v", err)
	}
	imgs := projectImages(out, tag)
	for _, img := range imgs {
		if err := os.Rename(filepath.Join(work, "out", filepath.Base(img.Archive)), img.Archive); err != nil {
			tb.Fatalf("realnode: %v", err)
		}
	}
	if images.built == nil {
		images.built = map[string]Image{}
	}
	images.built[key] = imgs[0]
	return imgs
}

// ManifestRegistry is where the manifests name the project's images
// (tools/ociimage.ManifestRegistry).
const ManifestRegistry = "ghcr.io/consul-cni-repair"

func projectImages(dir, tag string) []Image {
	var out []Image
	for _, name := range []string{"consul-cni-installer", "repair", "consul-cni-check"} {
		out = append(out, Image{Ref: ManifestRegistry + "/" + name + ":" + tag, Archive: filepath.Join(dir, name+".oci.tar")})
	}
	return out
}

// Archives returns the archives of imgs, for Options.Images.
func Archives(imgs ...Image) []string {
	var out []string
	for _, i := range imgs {
		out = append(out, i.Archive)
	}
	return out
}
