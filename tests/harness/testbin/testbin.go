// Package testbin finds or builds the executables that tests run: the
// project's own commands and the reference CNI plugins pinned in go.mod.
//
// Binaries are built with the go command into <repo>/.cache/testbin (or
// taken from $CCR_BIN_DIR when set), so any test tier can run on its own
// without a prior make step; the Go build cache keeps rebuilds cheap.
//
// Tests run some of these binaries as other users (containers with
// runAsUser, the init check as an unprivileged UID). When the repository
// lies below a directory those users may not enter (a checkout in a 0700
// directory), the binaries go to <tmp>/ccr-testbin-<hash of the repository
// path> instead, a 0755 directory owned by the test's user; `make clean`
// removes it.
package testbin

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/mod/modfile"
)

// ReferencePlugins are the containernetworking/plugins executables tests
// chain with consul-cni, by binary name and package path.
var ReferencePlugins = map[string]string{
	"ptp":        "github.com/containernetworking/plugins/plugins/main/ptp",
	"bridge":     "github.com/containernetworking/plugins/plugins/main/bridge",
	"loopback":   "github.com/containernetworking/plugins/plugins/main/loopback",
	"host-local": "github.com/containernetworking/plugins/plugins/ipam/host-local",
}

// TB is the part of testing.TB the helpers use (*testing.T, *testing.B,
// tests/harness/lifecycle.Env).
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

var (
	mu    sync.Mutex
	built = map[string]string{}
)

// modulePath is the main module's path, as its go.mod declares it.
const modulePath = "github.com/consul-cni-repair/consul-cni-repair"

// RepoRoot returns the repository's top directory: the nearest directory at
// or above the working directory whose go.mod declares the main module. The
// go command runs a test in its package's directory, in this module or in
// one of the repository's other modules, and the programs under tests/cmd
// run from the top. (Not runtime.Caller: with -trimpath, which the Makefile
// sets for every build, source paths are module paths.) The directory is
// found at the first call and kept.
func RepoRoot() string {
	rootOnce.Do(func() { root, rootErr = findRepoRoot() })
	if rootErr != nil {
		panic("testbin: " + rootErr.Error())
	}
	return root
}

var (
	rootOnce sync.Once
	root     string
	rootErr  error
)

func findRepoRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && modfile.ModulePath(b) == modulePath {
			return dir, nil
		}
		if filepath.Dir(dir) == dir {
			return "", fmt.Errorf("no go.mod of module %s at or above %s", modulePath, wd)
		}
	}
}

// Dir is where built test binaries go.
func Dir() string {
	if d := os.Getenv("CCR_BIN_DIR"); d != "" {
		return d
	}
	if d := filepath.Join(RepoRoot(), ".cache"); enterableByAll(d) {
		return filepath.Join(d, "testbin")
	}
	return FallbackDir()
}

// FallbackDir is the directory Dir uses when the repository's own cache is
// not reachable by every user.
func FallbackDir() string {
	sum := sha256.Sum256([]byte(RepoRoot()))
	return filepath.Join(os.TempDir(), "ccr-testbin-"+hex.EncodeToString(sum[:])[:12])
}

// enterableByAll reports whether every existing directory from / down to
// dir may be searched by any user (a directory yet to be created inherits
// the answer of its parent, as it is made 0755).
func enterableByAll(dir string) bool {
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err == nil && st.Mode().Perm()&0o001 == 0 {
			return false
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return false
		}
		if d == filepath.Dir(d) {
			return true
		}
	}
}

// checkOwnDir refuses a directory that someone else could have planted or
// may write into: its binaries are run as root.
func checkOwnDir(dir string) error {
	st, err := os.Stat(dir)
	if err != nil {
		return err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok || int(sys.Uid) != os.Geteuid() || st.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%s is not a directory of uid %d writable only by it (mode %v)", dir, os.Geteuid(), st.Mode())
	}
	return nil
}

// Project returns the path of the project's command cmd/<name>, building it
// once per test process unless $CCR_BIN_DIR provides it.
func Project(tb TB, name string) string {
	tb.Helper()
	return build(tb, name, "./cmd/"+name)
}

// ProjectVersion returns cmd/<name> built with version.Version stamped as
// v (as the Makefile's LDFLAGS do), as <Dir()>/<v>/<name>; tests of two
// versions side by side use it. The file keeps the command's own name, as
// in an image: what finds the command's processes by name (the installer's
// readiness probe) finds these too.
func ProjectVersion(tb TB, name, v string) string {
	tb.Helper()
	return build(tb, filepath.Join(v, name), "./cmd/"+name, "-X", "github.com/consul-cni-repair/consul-cni-repair/pkg/version.Version="+v)
}

// Package builds any main package of the module (a path relative to the
// repository root such as "./tests/cmd/podprog", or a tool dependency's
// import path) as <Dir()>/<name>.
func Package(tb TB, name, pkg string) string {
	tb.Helper()
	return build(tb, name, pkg)
}

// CNIPluginDir returns a directory holding every reference plugin in
// ReferencePlugins, built from the versions go.mod pins.
func CNIPluginDir(tb TB) string {
	tb.Helper()
	var dir string
	for name, pkg := range ReferencePlugins {
		dir = filepath.Dir(build(tb, name, pkg))
	}
	return dir
}

// Module builds the main package at the top of a separate module of the
// repository (dir, relative to the root, holds its own go.mod: a program
// that needs dependencies the main module must not have) as
// <Dir()>/<name>. env is added to the go command's environment, e.g.
// GOTOOLCHAIN for a module that needs a newer Go than the main module.
func Module(tb TB, name, dir string, env ...string) string {
	tb.Helper()
	return buildIn(tb, name, dir, ".", env)
}

func build(tb TB, name, pkg string, ldflags ...string) string {
	tb.Helper()
	return buildIn(tb, name, ".", pkg, nil, ldflags...)
}

func buildIn(tb TB, name, dir, pkg string, env []string, ldflags ...string) string {
	tb.Helper()
	mu.Lock()
	defer mu.Unlock()
	if p, ok := built[name]; ok {
		return p
	}
	binDir := Dir()
	out := filepath.Join(binDir, name)
	if os.Getenv("CCR_BIN_DIR") != "" {
		if _, err := os.Stat(out); err == nil {
			built[name] = out
			return out
		}
	}
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		tb.Fatalf("testbin: %v", err)
	}
	if binDir == FallbackDir() {
		if err := checkOwnDir(binDir); err != nil {
			tb.Fatalf("testbin: %v", err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		tb.Fatalf("testbin: %v", err)
	}
	// Build beside the target and rename, so concurrent test processes
	// never see a half-written executable.
	tmp := fmt.Sprintf("%s.%d.tmp", out, os.Getpid())
	args := []string{"build", "-o", tmp}
	if len(ldflags) > 0 {
		args = append(args, "-ldflags", strings.Join(ldflags, " "))
	}
	cmd := exec.Command("go", append(args, pkg)...)
	cmd.Dir = filepath.Join(RepoRoot(), dir)
	cmd.Env = append(append(os.Environ(), "CGO_ENABLED=0"), env...)
	if b, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp)
		tb.Fatalf("testbin: go build %s: %v\n%s", pkg, err, b)
	}
	// Executable by the other users tests run binaries as, whatever the umask.
	if err := os.Chmod(tmp, 0o755); err != nil {
		os.Remove(tmp)
		tb.Fatalf("testbin: %v", err)
	}
	if err := os.Rename(tmp, out); err != nil {
		tb.Fatalf("testbin: %v", err)
	}
	built[name] = out
	return out
}
