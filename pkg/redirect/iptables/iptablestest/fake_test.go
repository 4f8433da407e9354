package iptablestest

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/iptables"
)

func TestSplitArgs(t *testing.T) {
	for line, want := range map[string][]string{
		`-A OUTPUT -j RETURN`:                       {"-A", "OUTPUT", "-j", "RETURN"},
		"-A  OUTPUT\t-j RETURN ":                    {"-A", "OUTPUT", "-j", "RETURN"},
		`-A X -m comment --comment "a b" -j RETURN`: {"-A", "X", "-m", "comment", "--comment", "a b", "-j", "RETURN"},
		`--comment "say \"hi\" \\ now"`:             {"--comment", `say "hi" \ now`},
		`--comment ""`:                              {"--comment", ""},
		`--comment "x"y`:                            {"--comment", "x", "y"},
		``:                                          nil,
	} {
		if got := splitArgs(line); !reflect.DeepEqual(got, want) {
			t.Errorf("splitArgs(%q) = %q, want %q", line, got, want)
		}
	}
}

func TestJoinArgsRoundTrip(t *testing.T) {
	for _, args := range [][]string{
		{"-p", "tcp", "-j", "REDIRECT", "--to-ports", "15001"},
		{"--comment", "a b", "-j", "X"},
		{"--comment", `q"uote`, "--comment", `back\slash`, "--comment", ""},
		{"--comment", "tab\there"},
	} {
		line := joinArgs(args)
		if got := splitArgs(line); !reflect.DeepEqual(got, args) {
			t.Errorf("splitArgs(joinArgs(%q)) = %q (line %q)", args, got, line)
		}
	}
}

func TestRestoreCommandsAndSave(t *testing.T) {
	f := &Fake{}
	in := "*nat\n:X - [0:0]\n-A OUTPUT -p tcp -j X\n-A X -j RETURN\n-I X -m comment --comment \"a b\" -j RETURN\nCOMMIT\n"
	if err := f.Restore(context.Background(), redirect.IPv4, []byte(in)); err != nil {
		t.Fatal(err)
	}
	want := "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:X - [0:0]\n" +
		"-A OUTPUT -p tcp -j X\n-A X -m comment --comment \"a b\" -j RETURN\n-A X -j RETURN\nCOMMIT\n"
	if got := Normalize([]byte(f.Table(redirect.IPv4))); got != want {
		t.Fatalf("table:\n%s\nwant:\n%s", got, want)
	}
	if got := Normalize([]byte(f.Table(redirect.IPv6))); strings.Contains(got, ":X") {
		t.Fatalf("ipv4 restore changed ipv6:\n%s", got)
	}
	if strings.Join(f.Calls, ",") != "restore ipv4" {
		t.Fatalf("calls %q", f.Calls)
	}
}

// A failing line leaves the table as it was and names the line.
func TestRestoreIsAtomic(t *testing.T) {
	f := &Fake{}
	before := f.Table(redirect.IPv4)
	for in, msg := range map[string]string{
		"*nat\n:X - [0:0]\n-A X -j NOWHERE\nCOMMIT\n":             "line 3 failed: Couldn't load target `NOWHERE'",
		"*nat\n-D OUTPUT -j RETURN\nCOMMIT\n":                     "line 2 failed: Couldn't delete rule",
		"*nat\n-X OUTPUT\nCOMMIT\n":                               "line 2 failed: Chain 'OUTPUT' does not exist",
		"*nat\n:X - [0:0]\n-A X -j RETURN\n-X X\nCOMMIT\n":        "line 4 failed: Directory not empty",
		"*nat\n:X - [0:0]\n:Y - [0:0]\n-A Y -j X\n-X X\nCOMMIT\n": "line 5 failed: Too many links",
		"*nat\n-N OUTPUT\nCOMMIT\n":                               "line 2 failed: Chain already exists.",
		"*nat\n-Z OUTPUT\nCOMMIT\n":                               `line 2 failed: unknown command "-Z"`,
		"-A OUTPUT -j RETURN\n":                                   "line 1 failed: outside of a table",
		"*nat\n:X - [0:0]\n":                                      "line 2 failed: no COMMIT",
	} {
		err := f.Exec(redirect.IPv4, in)
		var te *iptables.ToolError
		if !errors.As(err, &te) || !strings.Contains(err.Error(), msg) {
			t.Errorf("%q: err %v, want a ToolError with %q", in, err, msg)
		}
		if got := f.Table(redirect.IPv4); got != before {
			t.Errorf("%q changed the table:\n%s", in, got)
		}
	}
}

func TestFailHooks(t *testing.T) {
	boom := errors.New("boom")
	f := &Fake{
		FailRestore: func(fam redirect.Family, _ []byte) error {
			if fam == redirect.IPv6 {
				return boom
			}
			return nil
		},
		FailSave: func(redirect.Family) error { return boom },
	}
	ctx := context.Background()
	if err := f.Restore(ctx, redirect.IPv6, []byte("*nat\n:X - [0:0]\nCOMMIT\n")); !errors.Is(err, boom) {
		t.Fatalf("restore: %v", err)
	}
	if strings.Contains(f.Table(redirect.IPv6), ":X") {
		t.Fatal("a failed restore changed the table")
	}
	if _, err := f.Save(ctx, redirect.IPv4); !errors.Is(err, boom) {
		t.Fatalf("save: %v", err)
	}
}
