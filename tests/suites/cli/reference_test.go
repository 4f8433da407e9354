package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
)

// flagsReference is the generated page of every command's flags.
const flagsReference = "docs/reference/flags.md"

// updateEnv, set to 1, makes TestFlagsReference write the page instead of
// comparing it (`make docs`).
const updateEnv = "CCR_UPDATE_DOCS"

// referenceCommands are the command lines whose --help the page shows, in
// its order; the anchor of each section is its heading's slug.
var referenceCommands = []struct {
	heading string
	cmd     string
	args    []string
}{
	{"repair", "repair", nil},
	{"repair audit", "repair", []string{"audit"}},
	{"consul-cni-installer", "consul-cni-installer", nil},
	{"consul-cni-check", "consul-cni-check", nil},
	{"consul-cni-verifier", "consul-cni-verifier", nil},
	{"consul-cni", "consul-cni", nil},
}

// helpFlag is one flag as pflag prints it in --help.
type helpFlag struct {
	short, name, typ, def, usage string
}

// helpLine matches a pflag usage line: "  -n, --namespace string   usage".
var helpLine = regexp.MustCompile(`^\s+(?:-([a-zA-Z]), )?--([a-z0-9][a-z0-9-]*)(\[=true\|false\])?(?: ([^ ]+))?\s{2,}(.*)$`)

// parseHelp returns the flags of a --help text, sorted by name.
func parseHelp(help string) []helpFlag {
	var flags []helpFlag
	for _, l := range strings.Split(help, "\n") {
		m := helpLine.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		f := helpFlag{short: m[1], name: m[2], typ: m[4], usage: strings.TrimSpace(m[5])}
		if m[3] != "" {
			f.typ = "bool"
		}
		if i := strings.LastIndex(f.usage, " (default "); i >= 0 && strings.HasSuffix(f.usage, ")") {
			f.def = f.usage[i+len(" (default ") : len(f.usage)-1]
			f.usage = f.usage[:i]
		}
		flags = append(flags, f)
	}
	sort.Slice(flags, func(i, j int) bool { return flags[i].name < flags[j].name })
	return flags
}

func cell(s string) string {
	return strings.ReplaceAll(s, "|", `\|`)
}

// renderFlags renders the page from the commands' --help texts.
func renderFlags(helps []string) string {
	var b strings.Builder
	b.WriteString("# Command-line flags\n\n")
	b.WriteString("Generated from each command's `--help` by `make docs`; `tests/suites/cli` fails when this page differs from\n")
	b.WriteString("what the commands print. What the flags are for: [operate.md](../operate.md), [installer.md](../installer.md),\n")
	b.WriteString("[init-check.md](../init-check.md), [plugin.md](../plugin.md).\n")
	for i, c := range referenceCommands {
		fmt.Fprintf(&b, "\n## %s\n\n", c.heading)
		b.WriteString("| flag | type | default | meaning |\n|---|---|---|---|\n")
		for _, f := range parseHelp(helps[i]) {
			name := "`--" + f.name + "`"
			if f.short != "" {
				name = "`-" + f.short + "`, " + name
			}
			def := ""
			if f.def != "" {
				def = "`" + cell(f.def) + "`"
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", name, f.typ, def, cell(f.usage))
		}
	}
	return b.String()
}

func TestFlagsReference(t *testing.T) {
	var helps []string
	for _, c := range referenceCommands {
		r := runCmd(t, c.cmd, nil, "", append(c.args, "--help")...)
		if r.code != 0 {
			t.Fatalf("%s %v --help: exit %d\n%s", c.cmd, c.args, r.code, r.stderr)
		}
		help := r.stdout + r.stderr
		if len(parseHelp(help)) == 0 {
			t.Fatalf("%s %v --help lists no flag:\n%s", c.cmd, c.args, help)
		}
		helps = append(helps, help)
	}
	want := renderFlags(helps)
	path := filepath.Join(testbin.RepoRoot(), flagsReference)
	if os.Getenv(updateEnv) == "1" {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("%s differs from the commands' --help: run `make docs`", flagsReference)
	}
}

// handTables are pages with flag tables written by hand, and the command
// whose flags they may name.
var handTables = map[string]string{
	"docs/installer.md":  "consul-cni-installer",
	"docs/init-check.md": "consul-cni-check",
}

var tableFlag = regexp.MustCompile("^\\|\\s*`--([a-z0-9-]+)`")

// TestHandWrittenFlagTablesNameRealFlags: a flag named in a hand-written
// table exists (a renamed flag cannot linger in the prose).
func TestHandWrittenFlagTablesNameRealFlags(t *testing.T) {
	for page, cmd := range handTables {
		r := runCmd(t, cmd, nil, "", "--help")
		known := map[string]bool{}
		for _, f := range parseHelp(r.stdout + r.stderr) {
			known[f.name] = true
		}
		b, err := os.ReadFile(filepath.Join(testbin.RepoRoot(), page))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, l := range strings.Split(string(b), "\n") {
			if m := tableFlag.FindStringSubmatch(l); m != nil {
				n++
				if !known[m[1]] {
					t.Errorf("%s names --%s, which %s does not have", page, m[1], cmd)
				}
			}
		}
		if n == 0 {
			t.Errorf("%s has no flag table", page)
		}
	}
}

func TestParseHelp(t *testing.T) {
	got := parseHelp(`Flags:
  -n, --namespace string               Audit one namespace. (default "x")
      --dry-run[=true|false]           Audit mode.
      --init-container-name strings    Names (NAME-<service>) (default [a,b])
  -v, --v Level                        verbosity
not a flag line
`)
	want := []helpFlag{
		{name: "dry-run", typ: "bool", usage: "Audit mode."},
		{name: "init-container-name", typ: "strings", def: "[a,b]", usage: "Names (NAME-<service>)"},
		{short: "n", name: "namespace", typ: "string", def: `"x"`, usage: "Audit one namespace."},
		{short: "v", name: "v", typ: "Level", usage: "verbosity"},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("parseHelp:\n got %v\nwant %v", got, want)
	}
}
