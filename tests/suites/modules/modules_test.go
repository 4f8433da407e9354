package modules

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/mod/modfile"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
)

// newerGo are the modules whose go directive may differ from the main
// module's, and why.
var newerGo = map[string]string{
	"tests/sdkoracle/nftables": "Consul's SDK v0.19.0 requires go 1.26.9",
}

// goModules returns the go.mod files of the repository by module directory
// ("." for the main module), skipping caches and build output.
func goModules(t *testing.T, root string) map[string]*modfile.File {
	t.Helper()
	mods := map[string]*modfile.File{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "bin" || d.Name() == "dist" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.Name() != "go.mod" {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		f, err := modfile.ParseLax(path, data, nil)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, filepath.Dir(path))
		mods[filepath.ToSlash(rel)] = f
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return mods
}

func TestModulesShareOneGoDirective(t *testing.T) {
	mods := goModules(t, testbin.RepoRoot())
	want := mods["."].Go.Version
	for dir, f := range mods {
		if f.Go == nil {
			t.Errorf("%s/go.mod has no go directive", dir)
			continue
		}
		if why, ok := newerGo[dir]; ok {
			if f.Go.Version == want {
				t.Errorf("%s/go.mod says go %s like the main module: drop it from newerGo (%s)", dir, want, why)
			}
			continue
		}
		if f.Go.Version != want {
			t.Errorf("%s/go.mod says go %s, the main module go %s", dir, f.Go.Version, want)
		}
	}
}

func TestArchitectureListsEveryModule(t *testing.T) {
	root := testbin.RepoRoot()
	doc, err := os.ReadFile(filepath.Join(root, "ARCHITECTURE.md"))
	if err != nil {
		t.Fatal(err)
	}
	var table string
	if _, after, ok := strings.Cut(string(doc), "## Modules"); ok {
		table, _, _ = strings.Cut(after, "\n## ")
	}
	if table == "" {
		t.Fatal("ARCHITECTURE.md has no ## Modules section")
	}
	for dir := range goModules(t, root) {
		name := "`" + dir + "/`"
		if dir == "." {
			name = "`.` (`go.mod`)"
		}
		if !strings.Contains(table, name) && !strings.Contains(table, "`"+dir+"`") {
			t.Errorf("module %s is not in ARCHITECTURE.md's modules table", dir)
		}
	}
}

// sharedPins are modules two of ours require and must require at the same
// version, and where.
var sharedPins = map[string][]string{
	// The Helm CLI `make helm` builds (tools) and the chart tests'
	// library (tests/suites/manifests): the chart is tested with the helm
	// it is packaged with.
	"helm.sh/helm/v4": {"tools", "tests/suites/manifests"},
}

func TestSharedPinsAgree(t *testing.T) {
	mods := goModules(t, testbin.RepoRoot())
	for path, dirs := range sharedPins {
		versions := map[string]string{}
		for _, dir := range dirs {
			f, ok := mods[dir]
			if !ok {
				t.Errorf("%s: no module %s", path, dir)
				continue
			}
			for _, r := range f.Require {
				if r.Mod.Path == path {
					versions[dir] = r.Mod.Version
				}
			}
			if versions[dir] == "" {
				t.Errorf("%s/go.mod does not require %s", dir, path)
			}
		}
		for _, dir := range dirs[1:] {
			if versions[dir] != versions[dirs[0]] {
				t.Errorf("%s: %s in %s/go.mod, %s in %s/go.mod", path, versions[dirs[0]], dirs[0], versions[dir], dir)
			}
		}
	}
}
