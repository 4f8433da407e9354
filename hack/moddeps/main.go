// Command moddeps keeps the project's Go modules compiling their shared
// dependencies at one version each.
//
// The repository has several modules (the product, the Kubernetes binaries
// of the tests, the manifests suite with Helm, the image tools, the node
// runtime, the SDK oracle). A package is compiled once per distinct set of
// inputs, its dependencies' versions included: when two modules select
// different versions of golang.org/x/net, say, everything above it
// (client-go, apimachinery, the API types) is compiled once for each, minutes
// of a cold build on two cores. moddeps lists, for every module, the modules
// its packages (all build tags, tests and tools included) compile, and
//
//	moddeps check   fails listing each dependency compiled at more than one version
//	moddeps align   raises each such dependency to the highest version any module selects (go get), then tidies
//
// `make lint` runs check; `make align-deps` runs align.
package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/mod/semver"
)

// modules are the module directories whose compiled dependencies must
// agree. tests/sdkoracle/nftables is left out: it is built by a newer Go
// toolchain, so nothing of it is shared anyway.
var modules = []string{".", "tests/kube", "tests/node", "tests/suites/manifests", "tools", "tests/sdkoracle/iptables"}

const tags = "privileged integration images"

func main() {
	if len(os.Args) != 2 || (os.Args[1] != "check" && os.Args[1] != "align") {
		fmt.Fprintln(os.Stderr, "usage: moddeps check|align (from the repository's root)")
		os.Exit(2)
	}
	if os.Args[1] == "check" {
		m, err := mismatches()
		if err != nil {
			fatal(err)
		}
		if len(m) > 0 {
			fmt.Fprintf(os.Stderr, "moddeps: %d dependencies are compiled at more than one version (each version compiles everything above it again); run make align-deps:\n", len(m))
			for _, l := range m {
				fmt.Fprintln(os.Stderr, "  "+l.String())
			}
			os.Exit(1)
		}
		return
	}
	for round := 1; ; round++ {
		m, err := mismatches()
		if err != nil {
			fatal(err)
		}
		if len(m) == 0 {
			return
		}
		if round > 5 {
			fatal(fmt.Errorf("still %d mismatches after %d rounds: %v", len(m), round-1, m))
		}
		if err := align(m); err != nil {
			fatal(err)
		}
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "moddeps:", err)
	os.Exit(1)
}

// mismatch is one dependency and the version each module compiles.
type mismatch struct {
	path     string
	versions map[string]string // module dir -> version
}

func (m mismatch) String() string {
	var l []string
	for _, d := range modules {
		if v, ok := m.versions[d]; ok {
			l = append(l, d+"="+v)
		}
	}
	return m.path + ": " + strings.Join(l, " ")
}

func (m mismatch) highest() string {
	best := ""
	for _, v := range m.versions {
		if best == "" || semver.Compare(v, best) > 0 {
			best = v
		}
	}
	return best
}

func mismatches() ([]mismatch, error) {
	by := map[string]map[string]string{}
	own := map[string]bool{}
	for _, d := range modules {
		deps, self, err := compiled(d)
		if err != nil {
			return nil, err
		}
		own[self] = true
		for p, v := range deps {
			if by[p] == nil {
				by[p] = map[string]string{}
			}
			by[p][d] = v
		}
	}
	var out []mismatch
	for p, vs := range by {
		if own[p] {
			continue
		}
		seen := map[string]bool{}
		for _, v := range vs {
			seen[v] = true
		}
		if len(seen) > 1 {
			out = append(out, mismatch{path: p, versions: vs})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].path < out[j].path })
	return out, nil
}

// compiled lists the modules (path -> version, replacements applied) that
// the packages of the module in dir compile, and the module's own path.
func compiled(dir string) (map[string]string, string, error) {
	self, err := run(dir, "go", "list", "-m")
	if err != nil {
		return nil, "", err
	}
	pkgs := []string{"./..."}
	if tools, _ := run(dir, "go", "list", "tool"); strings.TrimSpace(tools) != "" {
		pkgs = append(pkgs, "tool")
	}
	args := append([]string{"list", "-e", "-deps", "-test", "-tags", tags, "-f",
		"{{with .Module}}{{.Path}} {{.Version}}{{with .Replace}} {{.Version}}{{end}}{{end}}"}, pkgs...)
	out, err := run(dir, "go", args...)
	if err != nil {
		return nil, "", err
	}
	deps := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || f[1] == "" {
			continue
		}
		v := f[len(f)-1]
		if semver.IsValid(v) {
			deps[f[0]] = v
		}
	}
	return deps, strings.TrimSpace(self), nil
}

// align raises, in each module, every mismatched dependency below the
// highest version to that version, one at a time (a raise may raise others
// past their highest, so one that is already there is left alone: nothing is
// ever lowered), then tidies the modules it changed. The caller repeats it
// until nothing differs.
func align(ms []mismatch) error {
	for _, d := range modules {
		changed := false
		for _, m := range ms {
			top := m.highest()
			if v, ok := m.versions[d]; !ok || v == top {
				continue
			}
			cur, err := run(d, "go", "list", "-m", "-f", "{{with .Replace}}{{.Version}}{{else}}{{.Version}}{{end}}", m.path)
			if err == nil && semver.Compare(strings.TrimSpace(cur), top) >= 0 {
				continue
			}
			fmt.Printf("moddeps: %s: %s %s -> %s\n", d, m.path, m.versions[d], top)
			if _, err := run(d, "go", "get", m.path+"@"+top); err != nil {
				return err
			}
			changed = true
		}
		if changed {
			if _, err := run(d, "go", "mod", "tidy"); err != nil {
				return err
			}
		}
	}
	return nil
}

func run(dir, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = filepath.Clean(dir)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s: %s %s: %v: %s", dir, name, strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}
