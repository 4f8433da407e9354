package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/plugin"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
)

func read(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testbin.RepoRoot(), rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// firstColumn returns the backquoted first cell of every table row of a
// page, e.g. "BypassedCNI" from "| `BypassedCNI` | Warning |".
func firstColumn(page string) map[string]bool {
	row := regexp.MustCompile("^\\|\\s*`([^`]+)`")
	got := map[string]bool{}
	for _, l := range strings.Split(page, "\n") {
		if m := row.FindStringSubmatch(l); m != nil {
			got[m[1]] = true
		}
	}
	return got
}

// stringConsts returns the string constants of the non-test Go files under
// dir whose name matches name, by value.
func stringConsts(t *testing.T, dir string, name *regexp.Regexp) map[string]string {
	t.Helper()
	got := map[string]string{}
	root := filepath.Join(testbin.RepoRoot(), dir)
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			g, ok := decl.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, spec := range g.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, id := range vs.Names {
					if !name.MatchString(id.Name) || i >= len(vs.Values) {
						continue
					}
					if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						v, _ := strconv.Unquote(lit.Value)
						got[v] = id.Name
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func TestEventsReferenceListsEveryReason(t *testing.T) {
	defined := stringConsts(t, "pkg", regexp.MustCompile(`^Event[A-Z]`))
	if len(defined) == 0 {
		t.Fatal("no Event* constant found under pkg/")
	}
	listed := firstColumn(read(t, "docs/reference/events.md"))
	for reason, id := range defined {
		if !listed[reason] {
			t.Errorf("docs/reference/events.md does not list %s (%s)", reason, id)
		}
	}
	for reason := range listed {
		if _, ok := defined[reason]; !ok {
			t.Errorf("docs/reference/events.md lists %s, which no Event* constant defines", reason)
		}
	}
}

func TestNamesReferenceListsEveryKey(t *testing.T) {
	page := read(t, "docs/reference/names.md")
	keys := stringConsts(t, "pkg/annotations", regexp.MustCompile(`^(Key|Label|Annotation|Taint)`))
	n := 0
	for v, id := range keys {
		if !strings.Contains(v, "/") {
			continue // a value, not a key
		}
		n++
		if !strings.Contains(page, "`"+v) {
			t.Errorf("docs/reference/names.md does not name %s (annotations.%s)", v, id)
		}
	}
	if n < 10 {
		t.Fatalf("only %d keys found in pkg/annotations", n)
	}
}

// jsonKeys returns the JSON keys of a struct type, with those of the
// embedded structs of this project (not the CNI library's network keys,
// which the runtime sets).
func jsonKeys(typ reflect.Type, into map[string]bool) {
	for i := 0; i < typ.NumField(); i++ {
		f := typ.Field(i)
		tag := strings.Split(f.Tag.Get("json"), ",")[0]
		switch {
		case f.Anonymous && tag == "":
			if strings.HasPrefix(f.Type.PkgPath(), "github.com/consul-cni-repair/") {
				jsonKeys(f.Type, into)
			}
		case tag != "" && tag != "-":
			into[tag] = true
		}
	}
}

func TestPluginConfigReferenceListsEveryKey(t *testing.T) {
	keys := map[string]bool{}
	jsonKeys(reflect.TypeOf(plugin.Config{}), keys)
	jsonKeys(reflect.TypeOf(cniconf.Settings{}), keys)
	listed := map[string]bool{}
	for cell := range firstColumn(read(t, "docs/reference/plugin-config.md")) {
		for _, k := range strings.Split(cell, "`, `") {
			listed[k] = true
		}
	}
	// The rows name several keys in one cell: "`name`, `cniVersion`".
	for _, l := range strings.Split(read(t, "docs/reference/plugin-config.md"), "\n") {
		if !strings.HasPrefix(l, "|") {
			continue
		}
		first := strings.Split(l, "|")[1]
		for _, m := range regexp.MustCompile("`([a-zA-Z_]+)`").FindAllStringSubmatch(first, -1) {
			listed[m[1]] = true
		}
	}
	for k := range keys {
		if !listed[k] {
			t.Errorf("docs/reference/plugin-config.md does not list the key %q", k)
		}
	}
}

// leaves returns the dotted paths of a values tree's leaves (a list or an
// empty map is a leaf).
func leaves(prefix string, v any, into *[]string) {
	m, ok := v.(map[string]any)
	if !ok || len(m) == 0 {
		*into = append(*into, prefix)
		return
	}
	for k, sub := range m {
		p := k
		if prefix != "" {
			p = prefix + "." + k
		}
		leaves(p, sub, into)
	}
}

func TestHelmValuesReferenceNamesEveryValue(t *testing.T) {
	var values map[string]any
	if err := yaml.Unmarshal([]byte(read(t, "charts/consul-cni-repair/values.yaml")), &values); err != nil {
		t.Fatal(err)
	}
	var paths []string
	leaves("", values, &paths)
	sort.Strings(paths)
	// The chart's README is generated from values.yaml (helm-docs); its
	// table names each value, or its parent map, in the first column.
	page := read(t, "charts/consul-cni-repair/README.md")
	page = regexp.MustCompile(`(?m)^\| ([^ |]+) \|`).ReplaceAllString(page, "| `$1` |")
	for _, p := range paths {
		if documented(page, p) {
			continue
		}
		t.Errorf("charts/consul-cni-repair/README.md does not name the value %s (make chart-docs)", p)
	}
}

// documented tells whether the page names a value path or one of its
// parents (`controller.resources` covers its keys), either whole
// (`controller.action`) or in a row of siblings
// (`controller.image.repository`, `.tag`).
func documented(page, path string) bool {
	parts := strings.Split(path, ".")
	lines := strings.Split(page, "\n")
	for i := len(parts); i > 0; i-- {
		if strings.Contains(page, "`"+strings.Join(parts[:i], ".")+"`") {
			return true
		}
		if i < 2 {
			continue
		}
		parent, last := strings.Join(parts[:i-1], "."), parts[i-1]
		for _, l := range lines {
			if strings.Contains(l, "`"+parent+".") && strings.Contains(l, "`."+last+"`") {
				return true
			}
		}
	}
	return false
}

var (
	mdLink  = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	heading = regexp.MustCompile("^#{1,6} (.*)$")
	fence   = regexp.MustCompile("^\\s*```")
)

// slug is GitHub's anchor of a heading.
func slug(h string) string {
	h = strings.ToLower(strings.TrimSpace(h))
	var b strings.Builder
	for _, r := range h {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

// anchors returns the anchors of a markdown page's headings.
func anchors(page string) map[string]bool {
	got := map[string]bool{}
	in := false
	for _, l := range strings.Split(page, "\n") {
		if fence.MatchString(l) {
			in = !in
			continue
		}
		if m := heading.FindStringSubmatch(l); m != nil && !in {
			got[slug(m[1])] = true
		}
	}
	return got
}

// pages returns README.md, ARCHITECTURE.md, CHANGELOG.md and every
// markdown file under docs/ and tests/, relative to the repository.
func pages(t *testing.T) []string {
	root := testbin.RepoRoot()
	out := []string{"README.md", "ARCHITECTURE.md", "CHANGELOG.md"}
	for _, dir := range []string{"docs", "tests"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() && strings.HasSuffix(path, ".md") {
				rel, _ := filepath.Rel(root, path)
				out = append(out, rel)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func TestLinksAndAnchorsResolve(t *testing.T) {
	root := testbin.RepoRoot()
	for _, page := range pages(t) {
		text := read(t, page)
		for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			path := page
			if file != "" {
				path = filepath.Join(filepath.Dir(page), file)
			}
			st, err := os.Stat(filepath.Join(root, path))
			if err != nil {
				t.Errorf("%s: link %s: %v", page, target, err)
				continue
			}
			if anchor == "" {
				continue
			}
			if st.IsDir() || !strings.HasSuffix(path, ".md") {
				t.Errorf("%s: link %s: an anchor into something that is not a markdown page", page, target)
				continue
			}
			if !anchors(read(t, path))[anchor] {
				t.Errorf("%s: link %s: %s has no heading #%s", page, target, path, anchor)
			}
		}
	}
}

func TestFrontPagesStayShort(t *testing.T) {
	for _, p := range []struct {
		page     string
		maxLines int
	}{{"README.md", 300}, {"ARCHITECTURE.md", 300}} {
		if n := strings.Count(read(t, p.page), "\n"); n > p.maxLines {
			t.Errorf("%s has %d lines; keep it under %d and move details into docs/", p.page, n, p.maxLines)
		}
	}
	readme := read(t, "README.md")
	for _, want := range []string{"make demo", "make test", "docs/README.md", "consul-k8s/issues/3060"} {
		if !strings.Contains(readme, want) {
			t.Errorf("README.md does not mention %q", want)
		}
	}
}

func TestSlug(t *testing.T) {
	for h, want := range map[string]string{
		"Coming from consul-k8s's CNI":                          "coming-from-consul-k8ss-cni",
		"Which pods are outside the mesh now: `repair audit`":   "which-pods-are-outside-the-mesh-now-repair-audit",
		"Moving a cluster from iptables to nftables (and back)": "moving-a-cluster-from-iptables-to-nftables-and-back",
	} {
		if got := slug(h); got != want {
			t.Errorf("slug(%q) = %q, want %q", h, got, want)
		}
	}
}
