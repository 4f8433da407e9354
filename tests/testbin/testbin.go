// Package testbin finds or builds the executables that tests run: the
// project's own commands and the reference CNI plugins pinned in go.mod.
//
// Binaries are built with the go command into <repo>/.cache/testbin (or
// taken from $CCR_BIN_DIR when set), so any test tier can run on its own
// without a prior make step; the Go build cache keeps rebuilds cheap.
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
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
// tests/lifecycle.Env).
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

var (
	mu    sync.Mutex
	built = map[string]string{}
)

// RepoRoot returns the repository's top directory.
func RepoRoot() string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		panic("testbin: cannot locate source file")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Dir is where built test binaries go.
func Dir() string {
	if d := os.Getenv("CCR_BIN_DIR"); d != "" {
		return d
	}
	return filepath.Join(RepoRoot(), ".cache", "testbin")
}

// Project returns the path of the project's command cmd/<name>, building it
// once per test process unless $CCR_BIN_DIR provides it.
func Project(tb TB, name string) string {
	tb.Helper()
	return build(tb, name, "./cmd/"+name)
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

func build(tb TB, name, pkg string) string {
	tb.Helper()
	mu.Lock()
	defer mu.Unlock()
	if p, ok := built[name]; ok {
		return p
	}
	dir := Dir()
	out := filepath.Join(dir, name)
	if os.Getenv("CCR_BIN_DIR") != "" {
		if _, err := os.Stat(out); err == nil {
			built[name] = out
			return out
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatalf("testbin: %v", err)
	}
	// Build beside the target and rename, so concurrent test processes
	// never see a half-written executable.
	tmp := fmt.Sprintf("%s.%d.tmp", out, os.Getpid())
	cmd := exec.Command("go", "build", "-o", tmp, pkg)
	cmd.Dir = RepoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp)
		tb.Fatalf("testbin: go build %s: %v\n%s", pkg, err, b)
	}
	if err := os.Rename(tmp, out); err != nil {
		tb.Fatalf("testbin: %v", err)
	}
	built[name] = out
	return out
}
