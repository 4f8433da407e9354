package realnode

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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
	tool  string
	pause string
	built map[string]Image
}

// imageDir is where the archives go (next to the test binaries).
func imageDir() string { return filepath.Join(testbin.Dir(), "realnode-images") }

// BuildImages builds the pause image (tests/cmd/pause) once per process;
// Start needs it. StartForTest calls it.
func BuildImages(tb testbin.TB) {
	tb.Helper()
	img := ProgramImage(tb, "pause")
	images.Lock()
	images.pause = img.Archive
	images.Unlock()
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
		images.tool = buildImageTool(tb)
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

// buildImageTool builds tools/cmd/testimage (module tools/).
func buildImageTool(tb testbin.TB) string {
	tb.Helper()
	if err := os.MkdirAll(imageDir(), 0o755); err != nil {
		tb.Fatalf("realnode: %v", err)
	}
	out := filepath.Join(imageDir(), "testimage")
	tmp := fmt.Sprintf("%s.%d.tmp", out, os.Getpid())
	cmd := exec.Command("go", "build", "-o", tmp, "./cmd/testimage")
	cmd.Dir = filepath.Join(testbin.RepoRoot(), "tools")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("realnode: go build tools/cmd/testimage: %v\n%s", err, b)
	}
	if err := os.Rename(tmp, out); err != nil {
		tb.Fatalf("realnode: %v", err)
	}
	return out
}
