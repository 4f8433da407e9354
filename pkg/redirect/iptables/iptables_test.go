package iptables_test

import (
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/iptables"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/iptables/iptablestest"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// TestGolden renders every case and applies it to the in-memory table; both
// the restore input and the resulting table must match testdata/<case>.golden.
func TestGolden(t *testing.T) {
	for _, c := range goldenCases {
		t.Run(c.name, func(t *testing.T) {
			sets := iptables.Build(c.config(t))
			if want := map[bool]int{false: 1, true: 2}[c.dual]; len(sets) != want {
				t.Fatalf("%d rule sets, want %d", len(sets), want)
			}
			f := &iptablestest.Fake{}
			if err := iptables.Apply(context.Background(), f, sets); err != nil {
				t.Fatal(err)
			}
			tables := map[redirect.Family]string{}
			for _, fam := range redirect.Families {
				tables[fam] = iptablestest.Normalize([]byte(f.Table(fam)))
			}
			got := renderGolden(c, sets, tables)
			path := filepath.Join("testdata", c.name+".golden")
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./pkg/redirect -run TestGolden -update)", err)
			}
			if got != string(want) {
				t.Errorf("%s differs from the rendering; rerun with -update if the change is intended\n--- got\n%s--- want\n%s", path, got, want)
			}
			if !c.dual && tables[redirect.IPv6] != iptablestest.Normalize([]byte((&iptablestest.Fake{}).Table(redirect.IPv6))) {
				t.Errorf("single stack touched the IPv6 table:\n%s", tables[redirect.IPv6])
			}
		})
	}
}

// The order facts of the SDK, asserted directly on the default config so a
// wrong golden file cannot hide them.
func TestDefaultOrder(t *testing.T) {
	cfg, err := annotations.ParseRedirectTrafficConfig([]byte(tenOfEach(`"ConsulDNSIP":"127.0.0.1","ConsulDNSPort":8600,`)), false)
	if err != nil {
		t.Fatal(err)
	}
	rs := iptables.Build(cfg)[0]
	out := iptables.Specs(rs.ChainRules(redirect.ChainOutput))
	// 10 UIDs (last first), 10 CIDRs (last first), 10 ports (last first),
	// then proxy UID, loopback, redirect.
	if len(out) != 33 {
		t.Fatalf("%d rules in %s", len(out), redirect.ChainOutput)
	}
	want := []string{
		"-m owner --uid-owner 6009 -j RETURN", "-m owner --uid-owner 6000 -j RETURN",
		"-d 10.109.0.0/16 -j RETURN", "-d 10.100.0.0/16 -j RETURN",
		"-p tcp -m tcp --dport 9009 -j RETURN", "-p tcp -m tcp --dport 9000 -j RETURN",
		"-m owner --uid-owner 5995 -j RETURN", "-d 127.0.0.1/32 -j RETURN", "-j CONSUL_PROXY_REDIRECT",
	}
	got := []string{out[0], out[9], out[10], out[19], out[20], out[29], out[30], out[31], out[32]}
	if !iptables.Equal(got, want) {
		t.Fatalf("order\n got %q\nwant %q", got, want)
	}
	in := iptables.Specs(rs.ChainRules(redirect.ChainInbound))
	if in[0] != "-p tcp -m tcp --dport 8009 -j RETURN" || in[10] != "-p tcp -j CONSUL_PROXY_IN_REDIRECT" {
		t.Fatalf("inbound %q", in)
	}
	// DNS jumps come before the TCP jump in OUTPUT.
	o := iptables.Specs(rs.ChainRules("OUTPUT"))
	if len(o) != 3 || !strings.Contains(o[0], "-p udp") || !strings.Contains(o[1], "-p tcp -m tcp --dport 53") || o[2] != "-p tcp -j CONSUL_PROXY_OUTPUT" {
		t.Fatalf("OUTPUT %q", o)
	}
}

func mustSets(t *testing.T, js string, dual bool) []iptables.RuleSet {
	t.Helper()
	cfg, err := annotations.ParseRedirectTrafficConfig([]byte(js), dual)
	if err != nil {
		t.Fatal(err)
	}
	return iptables.Build(cfg)
}

func TestReapplyIsIdempotent(t *testing.T) {
	ctx := context.Background()
	for _, c := range goldenCases {
		t.Run(c.name, func(t *testing.T) {
			sets := iptables.Build(c.config(t))
			f := &iptablestest.Fake{}
			// Something of someone else's in OUTPUT must survive.
			if err := f.Exec(redirect.IPv4, "*nat\n-N OTHER\n-A OUTPUT -p udp -j OTHER\nCOMMIT\n"); err != nil {
				t.Fatal(err)
			}
			if err := iptables.Apply(ctx, f, sets); err != nil {
				t.Fatal(err)
			}
			first := [2]string{f.Table(redirect.IPv4), f.Table(redirect.IPv6)}
			f.Calls = nil
			if err := iptables.Apply(ctx, f, sets); err != nil {
				t.Fatal(err)
			}
			if second := [2]string{f.Table(redirect.IPv4), f.Table(redirect.IPv6)}; second != first {
				t.Fatalf("second ADD changed the table\nfirst:\n%s\nsecond:\n%s", first, second)
			}
			if !strings.Contains(first[0], "-A OUTPUT -p udp -j OTHER") {
				t.Fatal("foreign rule lost")
			}
			if err := iptables.Check(ctx, f, sets); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestFirstAddIsOneRestorePerFamily(t *testing.T) {
	f := &iptablestest.Fake{}
	sets := mustSets(t, upstreamDefault, false)
	if err := iptables.Apply(context.Background(), f, sets); err != nil {
		t.Fatal(err)
	}
	if strings.Join(f.Calls, ",") != "restore ipv4" {
		t.Fatalf("calls %v", f.Calls)
	}
	f.Calls = nil
	if err := iptables.Apply(context.Background(), f, sets); err != nil {
		t.Fatal(err)
	}
	if strings.Join(f.Calls, ",") != "restore ipv4,save ipv4,restore ipv4,save ipv6" {
		t.Fatalf("re-ADD calls %v", f.Calls)
	}
}

func TestReapplyConvergesFromPartialState(t *testing.T) {
	ctx := context.Background()
	sets := mustSets(t, upstreamDefault, false)
	want := func() string {
		f := &iptablestest.Fake{}
		if err := iptables.Apply(ctx, f, sets); err != nil {
			t.Fatal(err)
		}
		return f.Table(redirect.IPv4)
	}()
	// What an interrupted one-command-per-rule run leaves: some chains, a
	// jump, a duplicated jump, a stale exclusion.
	partial := "*nat\n-N CONSUL_PROXY_OUTPUT\n-N CONSUL_PROXY_REDIRECT\n" +
		"-A CONSUL_PROXY_REDIRECT -p tcp -j REDIRECT --to-ports 1\n" +
		"-A OUTPUT -p tcp -j CONSUL_PROXY_OUTPUT\n-A OUTPUT -p tcp -j CONSUL_PROXY_OUTPUT\n" +
		"-A CONSUL_PROXY_OUTPUT -p tcp -m tcp --dport 1 -j RETURN\nCOMMIT\n"
	f := &iptablestest.Fake{}
	if err := f.Exec(redirect.IPv4, partial); err != nil {
		t.Fatal(err)
	}
	if err := iptables.Apply(ctx, f, sets); err != nil {
		t.Fatal(err)
	}
	if got := f.Table(redirect.IPv4); got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
}

func TestDualToSingleRemovesIPv6(t *testing.T) {
	ctx := context.Background()
	f := &iptablestest.Fake{}
	if err := iptables.Apply(ctx, f, mustSets(t, `{"ProxyUserID":"1","ProxyInboundPort":2}`, true)); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(f.Table(redirect.IPv6), redirect.ChainOutput) {
		t.Fatal("no IPv6 rules")
	}
	if err := iptables.Apply(ctx, f, mustSets(t, `{"ProxyUserID":"1","ProxyInboundPort":2}`, false)); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(f.Table(redirect.IPv6), "CONSUL") {
		t.Fatalf("IPv6 rules left:\n%s", f.Table(redirect.IPv6))
	}
}

func TestFailureLeavesNothing(t *testing.T) {
	ctx := context.Background()
	empty := [2]string{(&iptablestest.Fake{}).Table(redirect.IPv4), (&iptablestest.Fake{}).Table(redirect.IPv6)}
	boom := errors.New("boom")
	for _, tc := range []struct {
		name    string
		prepare bool // an earlier ADD is in place
		fail    func(fam redirect.Family, input []byte) error
	}{
		{"ipv6 fails on first add", false, func(fam redirect.Family, in []byte) error {
			if fam == redirect.IPv6 {
				return boom
			}
			return nil
		}},
		{"ipv4 fails on first add", false, func(fam redirect.Family, in []byte) error {
			if fam == redirect.IPv4 {
				return boom
			}
			return nil
		}},
		{"replace fails on re-add", true, func(fam redirect.Family, in []byte) error {
			if strings.Contains(string(in), ":"+redirect.ChainOutput+" - [0:0]") && fam == redirect.IPv6 {
				return boom
			}
			return nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sets := mustSets(t, `{"ConsulDNSIP":"::1","ProxyUserID":"1","ProxyInboundPort":2}`, true)
			f := &iptablestest.Fake{}
			if tc.prepare {
				if err := iptables.Apply(ctx, f, sets); err != nil {
					t.Fatal(err)
				}
			}
			f.FailRestore = func(fam redirect.Family, in []byte) error {
				// Cleanup inputs never fail here.
				if strings.Contains(string(in), "-X ") {
					return nil
				}
				return tc.fail(fam, in)
			}
			err := iptables.Apply(ctx, f, sets)
			if !errors.Is(err, boom) {
				t.Fatalf("error %v, want boom", err)
			}
			if got := [2]string{f.Table(redirect.IPv4), f.Table(redirect.IPv6)}; got != empty {
				t.Fatalf("rules left after failure:\n%s\n%s", got[0], got[1])
			}
		})
	}
}

// deadlineExec is a iptablestest.Fake whose calls fail once their context is done, as
// the real tools killed by exec.CommandContext do.
type deadlineExec struct{ *iptablestest.Fake }

func (e deadlineExec) Save(ctx context.Context, fam redirect.Family) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return e.Fake.Save(ctx, fam)
}

func (e deadlineExec) Restore(ctx context.Context, fam redirect.Family, in []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return e.Fake.Restore(ctx, fam, in)
}

// When the failure is the caller's deadline (the IPv6 restore runs past it
// after IPv4 was applied), the partial rules are still removed: cleanup has
// a context of its own.
func TestFailureAtTheDeadlineStillCleansUp(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := &iptablestest.Fake{}
	f.FailRestore = func(fam redirect.Family, in []byte) error {
		if fam == redirect.IPv6 && !strings.Contains(string(in), "-X ") {
			cancel()
			return context.DeadlineExceeded
		}
		return nil
	}
	err := iptables.Apply(ctx, deadlineExec{f}, mustSets(t, `{"ConsulDNSIP":"::1","ProxyUserID":"1","ProxyInboundPort":2}`, true))
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "no rule of ours was left in place") {
		t.Fatalf("error %v", err)
	}
	if strings.Contains(f.Table(redirect.IPv4), "CONSUL") {
		t.Fatalf("IPv4 rules left after a failure at the deadline:\n%s", f.Table(redirect.IPv4))
	}
}

// A repeated ADD of a single-stack pod on a node whose IPv6 nat table cannot
// be listed (no IPv6) succeeds: cleaning the other family is best effort.
func TestReapplyWithoutIPv6(t *testing.T) {
	ctx := context.Background()
	f := &iptablestest.Fake{FailSave: func(fam redirect.Family) error {
		if fam == redirect.IPv6 {
			return errors.New("ip6tables-save: Table does not exist")
		}
		return nil
	}}
	sets := mustSets(t, upstreamDefault, false)
	for i := 0; i < 2; i++ {
		if err := iptables.Apply(ctx, f, sets); err != nil {
			t.Fatalf("ADD %d: %v", i+1, err)
		}
	}
	if err := iptables.Check(ctx, f, sets); err != nil {
		t.Fatal(err)
	}
}

// A path that exists but is not a network namespace (a leftover file, an
// unmounted bind mount) counts as a namespace that is gone, so DEL can
// succeed; fn never runs.
func TestInNetnsNotANamespace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "netns")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ran := false
	err := redirect.InNetns(path, func() error { ran = true; return nil })
	if !errors.Is(err, redirect.ErrNetnsGone) || ran {
		t.Fatalf("InNetns on a regular file: err %v, fn ran %v", err, ran)
	}
}

func TestCheckReportsDrift(t *testing.T) {
	ctx := context.Background()
	sets := mustSets(t, upstreamDefault, false)
	for _, tc := range []struct {
		name, tamper string
		want         []string
	}{
		{"rule deleted", "-D CONSUL_PROXY_OUTPUT -m owner --uid-owner 5996 -j RETURN",
			[]string{"rule missing: -A CONSUL_PROXY_OUTPUT -m owner --uid-owner 5996 -j RETURN"}},
		{"rule added", "-I CONSUL_PROXY_INBOUND -p tcp -m tcp --dport 22 -j RETURN",
			[]string{"unexpected rule: -A CONSUL_PROXY_INBOUND -p tcp -m tcp --dport 22 -j RETURN"}},
		{"jump deleted", "-D PREROUTING -p tcp -j CONSUL_PROXY_INBOUND",
			[]string{"rule missing: -A PREROUTING -p tcp -j CONSUL_PROXY_INBOUND"}},
		{"jump duplicated", "-A OUTPUT -p tcp -j CONSUL_PROXY_OUTPUT",
			[]string{"unexpected rule: -A OUTPUT -p tcp -j CONSUL_PROXY_OUTPUT"}},
		{"jump from elsewhere", "-A POSTROUTING -j CONSUL_DNS_REDIRECT",
			[]string{"unexpected rule: -A POSTROUTING -j CONSUL_DNS_REDIRECT"}},
		{"reordered", "-D CONSUL_PROXY_OUTPUT -d 127.0.0.1/32 -j RETURN\n-I CONSUL_PROXY_OUTPUT -d 127.0.0.1/32 -j RETURN",
			[]string{"rules of CONSUL_PROXY_OUTPUT are out of order"}},
		{"chain gone", "-D OUTPUT -p udp -m udp --dport 53 -d 127.0.0.1/32 -j CONSUL_DNS_REDIRECT", nil}, // replaced below
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &iptablestest.Fake{}
			if err := iptables.Apply(ctx, f, sets); err != nil {
				t.Fatal(err)
			}
			if err := iptables.Check(ctx, f, sets); err != nil {
				t.Fatalf("check before tampering: %v", err)
			}
			tamper, want := tc.tamper, tc.want
			if tc.name == "chain gone" {
				tamper = "-D OUTPUT -d 127.0.0.1/32 -p udp -m udp --dport 53 -j CONSUL_DNS_REDIRECT\n" +
					"-D OUTPUT -d 127.0.0.1/32 -p tcp -m tcp --dport 53 -j CONSUL_DNS_REDIRECT\n-F CONSUL_DNS_REDIRECT\n-X CONSUL_DNS_REDIRECT"
				want = []string{"chain CONSUL_DNS_REDIRECT is missing", "rule missing: -A OUTPUT -d 127.0.0.1/32 -p udp -m udp --dport 53 -j CONSUL_DNS_REDIRECT"}
			}
			if err := f.Exec(redirect.IPv4, "*nat\n"+tamper+"\nCOMMIT\n"); err != nil {
				t.Fatal(err)
			}
			err := iptables.Check(ctx, f, sets)
			var ce *iptables.CheckError
			if !errors.As(err, &ce) {
				t.Fatalf("want drift, got %v", err)
			}
			for _, w := range want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("drift %q does not mention %q", err, w)
				}
			}
			// ADD again repairs it.
			if err := iptables.Apply(ctx, f, sets); err != nil {
				t.Fatal(err)
			}
			if err := iptables.Check(ctx, f, sets); err != nil {
				t.Fatalf("after re-ADD: %v", err)
			}
		})
	}
}

func TestRemoveIsIdempotentAndKeepsOthers(t *testing.T) {
	ctx := context.Background()
	f := &iptablestest.Fake{}
	if err := f.Exec(redirect.IPv4, "*nat\n-N OTHER\n-A OUTPUT -p udp -j OTHER\n-A OTHER -j RETURN\nCOMMIT\n"); err != nil {
		t.Fatal(err)
	}
	before := f.Table(redirect.IPv4)
	if err := iptables.Apply(ctx, f, mustSets(t, upstreamDefault, false)); err != nil {
		t.Fatal(err)
	}
	// A foreign chain that jumps into ours (with a comment) is unhooked too.
	if err := f.Exec(redirect.IPv4, "*nat\n-A OTHER -m comment --comment \"to consul \\\"dns\\\"\" -j CONSUL_DNS_REDIRECT\nCOMMIT\n"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := iptables.Remove(ctx, f, redirect.Families); err != nil {
			t.Fatalf("remove #%d: %v", i+1, err)
		}
	}
	if got := f.Table(redirect.IPv4); got != before {
		t.Fatalf("after remove\n%s\nwant\n%s", got, before)
	}
}

// safeToken is every token a rendered rule may contain: chain and target
// names, option names, numbers, addresses, prefixes.
var safeToken = regexp.MustCompile(`^(-{1,2}[a-z][a-z-]*|[A-Z_]+|[a-z]+|[0-9]+|[0-9a-fA-F.:\[\]]+(/[0-9]+)?)$`)

func assertSafe(t testing.TB, sets []iptables.RuleSet) {
	t.Helper()
	for _, rs := range sets {
		in := string(rs.RestoreNew())
		lines := strings.Split(strings.TrimSuffix(in, "\n"), "\n")
		if len(lines) != len(rs.Rules)+len(redirect.Chains)+2 {
			t.Fatalf("restore input has %d lines for %d rules:\n%s", len(lines), len(rs.Rules), in)
		}
		for _, r := range rs.Rules {
			for _, tok := range r.Args {
				if !safeToken.MatchString(tok) {
					t.Fatalf("unsafe token %q in %s", tok, r)
				}
			}
		}
	}
}

func TestRenderedTokensAreSafe(t *testing.T) {
	for _, c := range goldenCases {
		assertSafe(t, iptables.Build(c.config(t)))
	}
}

func TestParseSave(t *testing.T) {
	cur, err := iptables.ParseSave([]byte("# c\n*filter\n:INPUT ACCEPT [1:2]\n-A INPUT -j ACCEPT\nCOMMIT\n*nat\n:OUTPUT ACCEPT [3:4]\n:X - [0:0]\n-A OUTPUT -j X\nCOMMIT\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(cur.Chains) != 2 || cur.Rules["OUTPUT"][0] != "-j X" || cur.HasChain("INPUT") {
		t.Fatalf("%+v", cur)
	}
	for _, bad := range []string{"*nat\n-A NOPE -j X\nCOMMIT\n", "*nat\nwhat\n", "*nat\nCOMMIT\n*nat\nCOMMIT\n"} {
		if _, err := iptables.ParseSave([]byte(bad)); err == nil {
			t.Errorf("no error for %q", bad)
		}
	}
	if cur, err := iptables.ParseSave(nil); err != nil || cur.Ours() {
		t.Fatal("empty output")
	}
}

func TestNormalize(t *testing.T) {
	got := iptablestest.Normalize([]byte("# Generated\n*nat\n:OUTPUT ACCEPT [12:345]\n:X - [0:0]\n-A OUTPUT -j X  \nCOMMIT\n# Completed\n"))
	if got != "*nat\n:OUTPUT ACCEPT [0:0]\n:X - [0:0]\n-A OUTPUT -j X\nCOMMIT\n" {
		t.Fatalf("%q", got)
	}
}

func TestTokensRoundTrip(t *testing.T) {
	for _, spec := range []string{`-p tcp -j RETURN`, `-m comment --comment "a b" -j X`, `-m comment --comment "q \"x\" \\ y" -j X`} {
		if got := iptables.QuoteSpec(iptables.Tokens(spec)); got != spec {
			t.Errorf("%q -> %q", spec, got)
		}
	}
}

func TestVariantCommands(t *testing.T) {
	for _, tc := range []struct {
		b    iptables.Variant
		f    redirect.Family
		verb string
		want string
	}{
		{iptables.VariantNFT, redirect.IPv4, "restore", "iptables-nft-restore"},
		{iptables.VariantLegacy, redirect.IPv6, "save", "ip6tables-legacy-save"},
		{iptables.VariantDefault, redirect.IPv6, "restore", "ip6tables-restore"},
	} {
		if got := tc.b.Command(tc.f, tc.verb); got != tc.want {
			t.Errorf("%v %v %s: %s", tc.b, tc.f, tc.verb, got)
		}
	}
	for in, want := range map[string]iptables.Variant{"nft": iptables.VariantNFT, "LEGACY": iptables.VariantLegacy, "auto": iptables.VariantDefault, "": iptables.VariantDefault} {
		if b, _, err := iptables.ParseVariant(in); err != nil || b != want {
			t.Errorf("ParseVariant(%q) = %v, %v", in, b, err)
		}
	}
	if _, _, err := iptables.ParseVariant("nftables"); err == nil || !strings.Contains(err.Error(), `"nftables"`) {
		t.Errorf("ParseVariant(nftables) error %v", err)
	}
}

func TestDetectVariant(t *testing.T) {
	hint := "*mangle\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n"
	rules := func(n int) string { return strings.Repeat("-A X -j ACCEPT\n", n) }
	for _, tc := range []struct {
		name      string
		installed []iptables.Variant
		outputs   map[string]string // "<tool> <args>" -> stdout
		want      iptables.Variant
	}{
		{"nothing installed", nil, nil, iptables.VariantDefault},
		{"only nft", []iptables.Variant{iptables.VariantNFT}, nil, iptables.VariantNFT},
		{"only legacy", []iptables.Variant{iptables.VariantLegacy}, nil, iptables.VariantLegacy},
		{"empty node", []iptables.Variant{iptables.VariantNFT, iptables.VariantLegacy}, nil, iptables.VariantNFT},
		{"nft hint", []iptables.Variant{iptables.VariantNFT, iptables.VariantLegacy}, map[string]string{"ip6tables-nft-save -t mangle": hint, "iptables-legacy-save": rules(50)}, iptables.VariantNFT},
		{"legacy hint", []iptables.Variant{iptables.VariantNFT, iptables.VariantLegacy}, map[string]string{"iptables-legacy-save": hint, "iptables-nft-save": rules(50)}, iptables.VariantLegacy},
		{"legacy has more rules", []iptables.Variant{iptables.VariantNFT, iptables.VariantLegacy}, map[string]string{"iptables-legacy-save": rules(30), "iptables-nft-save": rules(3), "ip6tables-nft-save": rules(3)}, iptables.VariantLegacy},
		{"nft has more rules", []iptables.Variant{iptables.VariantNFT, iptables.VariantLegacy}, map[string]string{"iptables-legacy-save": rules(3), "ip6tables-nft-save": rules(4)}, iptables.VariantNFT},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := iptables.VariantDetector{
				Look: func(name string) (string, error) {
					for _, b := range tc.installed {
						if strings.Contains(name, "-"+string(b)+"-") {
							return "/x/" + name, nil
						}
					}
					return "", errors.New("not found")
				},
				Run: func(_ context.Context, name string, args ...string) ([]byte, error) {
					return []byte(tc.outputs[strings.TrimSpace(name+" "+strings.Join(args, " "))]), nil
				},
			}
			if got, why := d.Detect(context.Background()); got != tc.want {
				t.Fatalf("got %v (%s), want %v", got, why, tc.want)
			}
		})
	}
}

func TestCachedVariant(t *testing.T) {
	dir := t.TempDir()
	calls := 0
	d := iptables.VariantDetector{
		Look: func(name string) (string, error) { return name, nil },
		Run: func(_ context.Context, name string, args ...string) ([]byte, error) {
			calls++
			if name == "iptables-legacy-save" {
				return []byte("-A X\n-A Y\n"), nil
			}
			return nil, nil
		},
	}
	b1, _ := d.Cached(context.Background(), dir, time2h)
	n := calls
	b2, why := d.Cached(context.Background(), dir, time2h)
	if b1 != iptables.VariantLegacy || b2 != iptables.VariantLegacy || calls != n || !strings.Contains(why, "cached") {
		t.Fatalf("b1=%v b2=%v calls %d->%d why=%s", b1, b2, n, calls, why)
	}
	// Expired: detects again.
	if _, why := d.Cached(context.Background(), dir, 0); strings.Contains(why, "cached") {
		t.Fatal("expired cache used")
	}
}

const time2h = 2 * 60 * 60 * 1e9

// A port range is one rule: CHECK names it when the range in the table
// differs from the annotation's.
func TestCheckSeesChangedPortRange(t *testing.T) {
	ctx := context.Background()
	sets := mustSets(t, `{"ProxyUserID":"5995","ProxyInboundPort":20000,"ExcludeOutboundPorts":["8000:8100"]}`, false)
	f := &iptablestest.Fake{}
	if err := iptables.Apply(ctx, f, sets); err != nil {
		t.Fatal(err)
	}
	if err := iptables.Check(ctx, f, sets); err != nil {
		t.Fatal(err)
	}
	if err := f.Exec(redirect.IPv4, "*nat\n-D CONSUL_PROXY_OUTPUT -p tcp -m tcp --dport 8000:8100 -j RETURN\n"+
		"-I CONSUL_PROXY_OUTPUT -p tcp -m tcp --dport 8000:8099 -j RETURN\nCOMMIT\n"); err != nil {
		t.Fatal(err)
	}
	err := iptables.Check(ctx, f, sets)
	if err == nil || !strings.Contains(err.Error(), "rule missing: -A CONSUL_PROXY_OUTPUT -p tcp -m tcp --dport 8000:8100 -j RETURN") ||
		!strings.Contains(err.Error(), "unexpected rule: -A CONSUL_PROXY_OUTPUT -p tcp -m tcp --dport 8000:8099 -j RETURN") {
		t.Fatalf("check after narrowing the range: %v", err)
	}
}
