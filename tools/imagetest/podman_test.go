//go:build images

package imagetest

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/consul-cni-repair/consul-cni-repair/tools/ociimage"
)

// podman runs podman (rootful, with runc: crun 1.8 refuses hybrid cgroup
// hierarchies) on a store of the test's own under its temp dir, so nothing
// of the machine's podman is read or left behind.
type podman struct {
	t          *testing.T
	base       []string
	restricted []string
}

func newPodman(t *testing.T) *podman {
	t.Helper()
	if _, err := exec.LookPath("podman"); err != nil {
		t.Fatalf("podman not found (make test-images installs it with hack/install-podman.sh): %v", err)
	}
	dir := t.TempDir()
	p := &podman{t: t, base: []string{
		"--root", filepath.Join(dir, "root"), "--runroot", filepath.Join(dir, "run"), "--tmpdir", filepath.Join(dir, "tmp"),
		"--storage-driver", "vfs", "--cgroup-manager", "cgroupfs", "--events-backend", "none", "--runtime", "runc",
	}}
	p.restricted = append(append([]string{}, restricted...), ulimits(t)...)
	cacheExisted := exists(blobInfoCache)
	t.Cleanup(func() {
		// Registered after t.TempDir, so it runs before the store is removed.
		p.run("rm", "--all", "--force", "--time", "0")
		p.run("rmi", "--all", "--force")
		if !cacheExisted {
			removeCreated(blobInfoCache)
		}
	})
	return p
}

// ulimits are the containers' open-files and process limits, at most this
// process's hard limits: podman's defaults (1048576 files, the hard process
// limit) fail with EPERM where the runtime lacks CAP_SYS_RESOURCE.
func ulimits(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, l := range []struct {
		name     string
		resource int
		max      uint64
	}{{"nofile", syscall.RLIMIT_NOFILE, 1048576}, {"nproc", 6 /* RLIMIT_NPROC */, 32768}} {
		var r syscall.Rlimit
		if err := syscall.Getrlimit(l.resource, &r); err != nil {
			t.Fatal(err)
		}
		n := min(r.Max, l.max)
		out = append(out, "--ulimit", fmt.Sprintf("%s=%d:%d", l.name, n, n))
	}
	return out
}

// blobInfoCache is the one file podman 4.3 writes outside --root: the
// rootful blob info cache of `podman load`. The test removes it (and the
// directories, when empty) when it was not there before.
const blobInfoCache = "/var/lib/containers/cache/blob-info-cache-v1.boltdb"

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

func removeCreated(path string) {
	_ = os.Remove(path)
	for dir := filepath.Dir(path); dir != "/var/lib"; dir = filepath.Dir(dir) {
		if os.Remove(dir) != nil {
			return
		}
	}
}

// run returns podman's stdout, stderr and its error (an *exec.ExitError for
// a non-zero exit).
func (p *podman) run(args ...string) (string, string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.Command("podman", append(append([]string{}, p.base...), args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// must runs podman and fails the test when it exits non-zero.
func (p *podman) must(args ...string) string {
	p.t.Helper()
	out, errOut, err := p.run(args...)
	if err != nil {
		p.t.Fatalf("podman %s: %v\n%s%s", strings.Join(args, " "), err, out, errOut)
	}
	return out
}

// load loads the archive and checks that the image got the archive's name.
func (p *podman) load(a archive) {
	p.t.Helper()
	p.must("load", "--input", a.path)
	if _, _, err := p.run("image", "exists", a.ref); err != nil {
		out, _, _ := p.run("images", "--all")
		p.t.Fatalf("after podman load of %s, no image %s:\n%s", a.path, a.ref, out)
	}
}

// restricted are the run flags matching the manifests' securityContext.
var restricted = []string{"--network", "none", "--read-only", "--cap-drop", "all", "--security-opt", "no-new-privileges"}

func (p *podman) runImage(ref string, flags []string, args ...string) (string, string, error) {
	all := append(append(append([]string{"run", "--rm"}, p.restricted...), flags...), ref)
	return p.run(append(all, args...)...)
}

// TestImagesRun loads every image of this machine's platform, runs each of
// its binaries with --version and an id probe with the image's own user
// setting, which must be the UID its manifest runs.
func TestImagesRun(t *testing.T) {
	version := wantVersion(t)
	p := newPodman(t)
	probe := buildProbe(t)
	for _, spec := range ociimage.Specs {
		t.Run(spec.Name, func(t *testing.T) {
			a := readArchive(t, spec)
			p.t = t
			p.load(a)
			for i, b := range spec.Binaries {
				var flags []string
				if i > 0 {
					flags = []string{"--entrypoint", b}
				}
				out, errOut, err := p.runImage(a.ref, flags, "--version")
				if err != nil || !strings.HasPrefix(out, versionLine(b, version)) {
					t.Errorf("%s --version in %s: %v, stdout %q, stderr %q; want a line starting %q", b, a.ref, err, out, errOut, versionLine(b, version))
				}
			}
			out, errOut, err := p.runImage(a.ref, []string{"--volume", probe + ":/probe/idprobe:ro", "--entrypoint", "/probe/idprobe"})
			if err != nil {
				t.Fatalf("id probe in %s: %v\n%s", a.ref, err, errOut)
			}
			_, _, uid := manifestContainer(t, spec)
			want := fmt.Sprintf("uid=%d gid=%d user=%s group=%s", uid, spec.GID, spec.User, spec.User)
			if strings.TrimSpace(out) != want {
				t.Errorf("%s runs as %q, want %q (runAsUser in %s)", a.ref, strings.TrimSpace(out), want, spec.Manifest)
			}
		})
	}
}

// buildProbe builds the static id probe for this machine.
func buildProbe(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "idprobe")
	cmd := exec.Command("go", "build", "-o", out, "./idprobe")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building idprobe: %v\n%s", err, b)
	}
	return out
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}
