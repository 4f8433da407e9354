//go:build privileged

package nftables_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/iptables"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/nftables"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

func nftList(t *testing.T, ns *testnet.Netns) string {
	t.Helper()
	return ns.Run(t, "nft", "--guid", "list", "table", "inet", nftables.TableName)
}

// TestRealTables applies every case in a fresh namespace and checks that the
// kernel lists exactly the table's text, that nft compiling that text gives
// the same expressions (Check against the namespace nft filled), and that a
// second Apply converges to the same table.
func TestRealTables(t *testing.T) {
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("nft not installed (make deps)")
	}
	r := testnet.Reserve(t)
	ctx := context.Background()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tbl := nftables.Build(c.config(t))
			ours := r.NewNetns(t, "nf")
			if err := nftables.Apply(ctx, ours.Path, tbl); err != nil {
				t.Fatal(err)
			}
			if got, want := nftList(t, ours), tbl.String(); got != want {
				t.Fatalf("nft lists\n%s\nwant\n%s", got, want)
			}
			if err := nftables.Check(ctx, ours.Path, tbl); err != nil {
				t.Fatal(err)
			}
			if err := nftables.Apply(ctx, ours.Path, tbl); err != nil {
				t.Fatal(err)
			}
			if err := nftables.Check(ctx, ours.Path, tbl); err != nil {
				t.Fatalf("after a second Apply: %v", err)
			}
			byNft := r.NewNetns(t, "nfs")
			cmd := byNft.Command(-1, "nft", "-f", "-")
			cmd.Stdin = strings.NewReader(tbl.Script())
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("nft -f: %v: %s\n%s", err, out, tbl.Script())
			}
			if err := nftables.Check(ctx, byNft.Path, tbl); err != nil {
				t.Fatalf("nft compiles the rules differently: %v", err)
			}
		})
	}
}

// TestCheckReportsEveryDifference changes the table behind our back and
// expects each change among the problems.
func TestCheckReportsEveryDifference(t *testing.T) {
	r := testnet.Reserve(t)
	ctx := context.Background()
	tbl := nftables.Build(cases[0].config(t))
	ns := r.NewNetns(t, "nf")
	if err := nftables.Apply(ctx, ns.Path, tbl); err != nil {
		t.Fatal(err)
	}
	ns.Run(t, "nft", "add", "rule", "inet", nftables.TableName, "CONSUL_PROXY_OUTPUT", "tcp", "dport", "1234", "return")
	ns.Run(t, "nft", "flush", "chain", "inet", nftables.TableName, "CONSUL_PROXY_IN_REDIRECT")
	ns.Run(t, "nft", "add", "chain", "inet", nftables.TableName, "EXTRA")
	err := nftables.Check(ctx, ns.Path, tbl)
	var d *nftables.Drift
	if !errors.As(err, &d) {
		t.Fatalf("Check = %v, want a *Drift", err)
	}
	for _, want := range []string{"unexpected rule in CONSUL_PROXY_OUTPUT", "rule missing in CONSUL_PROXY_IN_REDIRECT: meta l4proto tcp redirect to :20000", "unexpected chain EXTRA"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("drift %q lacks %q", err, want)
		}
	}
	if len(d.Problems) != 3 {
		t.Errorf("%d problems, want 3: %q", len(d.Problems), d.Problems)
	}
	// Rules in another order.
	if err := nftables.Apply(ctx, ns.Path, tbl); err != nil {
		t.Fatal(err)
	}
	ns.Run(t, "nft", "delete", "table", "inet", nftables.TableName)
	if err := nftables.Check(ctx, ns.Path, tbl); err == nil || !strings.Contains(err.Error(), "table inet consul_tproxy is missing") {
		t.Fatalf("Check without a table = %v", err)
	}
}

// TestRemove deletes the table, is idempotent, and never fails for a
// missing namespace; Apply into a missing namespace fails naming it.
func TestRemove(t *testing.T) {
	r := testnet.Reserve(t)
	ctx := context.Background()
	ns := r.NewNetns(t, "nf")
	tbl := nftables.Build(cases[0].config(t))
	if err := nftables.Apply(ctx, ns.Path, tbl); err != nil {
		t.Fatal(err)
	}
	ns.Run(t, "nft", "add", "table", "inet", "other")
	for i := 0; i < 2; i++ {
		if err := nftables.Remove(ctx, ns.Path); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := nftables.Present(ctx, ns.Path); err != nil || ok {
		t.Fatalf("Present after Remove = %v, %v", ok, err)
	}
	if out := ns.Run(t, "nft", "list", "tables"); !strings.Contains(out, "table inet other") {
		t.Fatalf("Remove touched another table: %q", out)
	}
	if err := nftables.Remove(ctx, "/run/netns/ccr-does-not-exist"); err != nil {
		t.Fatalf("Remove in a missing netns: %v", err)
	}
	err := nftables.Apply(ctx, "/run/netns/ccr-does-not-exist", tbl)
	if !errors.Is(err, redirect.ErrNetnsGone) || !strings.Contains(err.Error(), "ccr-does-not-exist") {
		t.Fatalf("Apply in a missing netns = %v", err)
	}
	// A path that is no longer a namespace (an unmounted bind mount leaves
	// an empty file): gone as well, as for the iptables backend.
	leftover := filepath.Join(t.TempDir(), "netns")
	if err := os.WriteFile(leftover, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := nftables.Remove(ctx, leftover); err != nil {
		t.Fatalf("Remove in a leftover netns file: %v", err)
	}
	if ok, err := nftables.Present(ctx, leftover); err != nil || ok {
		t.Fatalf("Present in a leftover netns file = %v, %v", ok, err)
	}
	if _, err := nftables.FindIptablesRules(ctx, leftover); err != nil {
		t.Fatalf("FindIptablesRules in a leftover netns file: %v", err)
	}
	if err := nftables.Apply(ctx, leftover, tbl); !errors.Is(err, redirect.ErrNetnsGone) {
		t.Fatalf("Apply in a leftover netns file = %v, want ErrNetnsGone", err)
	}
}

// TestApplyFailsClosed makes the kernel reject the batch (a rule jumping to a
// chain that does not exist) over an existing table: Apply fails, and no
// table of ours is left.
func TestApplyFailsClosed(t *testing.T) {
	r := testnet.Reserve(t)
	ctx := context.Background()
	ns := r.NewNetns(t, "nf")
	good := nftables.Build(cases[0].config(t))
	if err := nftables.Apply(ctx, ns.Path, good); err != nil {
		t.Fatal(err)
	}
	bad := nftables.Build(cases[0].config(t))
	jump := nftables.JumpRule(nftables.ChainNATOutput, "NO_SUCH_CHAIN")
	bad.Rules = append(bad.Rules, jump)
	if err := nftables.Apply(ctx, ns.Path, bad); err == nil || !strings.Contains(err.Error(), jump.Text) {
		t.Fatalf("Apply of a bad table over an existing one: %v, want an error naming the rule %q", err, jump.Text)
	}
	if ok, err := nftables.Present(ctx, ns.Path); err != nil || ok {
		t.Fatalf("table left after a failed Apply: present=%v err=%v", ok, err)
	}
}

// TestReplaceWithAnotherTable: a repeated ADD with another configuration
// leaves exactly the new table (no rule of the old one).
func TestReplaceWithAnotherTable(t *testing.T) {
	r := testnet.Reserve(t)
	ctx := context.Background()
	ns := r.NewNetns(t, "nf")
	for _, c := range []tcase{cases[0], cases[1], cases[0]} {
		tbl := nftables.Build(c.config(t))
		if err := nftables.Apply(ctx, ns.Path, tbl); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if err := nftables.Check(ctx, ns.Path, tbl); err != nil {
			t.Fatalf("after applying %s over another table: %v", c.name, err)
		}
	}
}

// TestCreateFailsClosed makes the kernel reject the first ADD's exclusive
// create in a fresh namespace, with the bad rule last (the message that
// asks for the acknowledgement) and first (an error before it): Apply fails
// naming the kernel's error, leaves no table, and a good Apply then works.
func TestCreateFailsClosed(t *testing.T) {
	r := testnet.Reserve(t)
	ctx := context.Background()
	jump := nftables.JumpRule(nftables.ChainNATOutput, "NO_SUCH_CHAIN")
	for _, place := range []string{"last", "first"} {
		t.Run(place, func(t *testing.T) {
			ns := r.NewNetns(t, "nf")
			bad := nftables.Build(cases[0].config(t))
			if place == "last" {
				bad.Rules = append(bad.Rules, jump)
			} else {
				bad.Rules = append([]nftables.Rule{jump}, bad.Rules...)
			}
			err := nftables.Apply(ctx, ns.Path, bad)
			if err == nil || !strings.Contains(err.Error(), "no such file or directory") || !strings.Contains(err.Error(), jump.Text) {
				t.Fatalf("Apply of a bad table: %v, want the kernel's ENOENT naming the rule %q", err, jump.Text)
			}
			if ok, err := nftables.Present(ctx, ns.Path); err != nil || ok {
				t.Fatalf("table left after a failed Apply: present=%v err=%v", ok, err)
			}
			good := nftables.Build(cases[0].config(t))
			if found, err := nftables.ApplyUnlessIptables(ctx, ns.Path, good); err != nil || found.Any() {
				t.Fatalf("ApplyUnlessIptables after the failure: %v %v", found, err)
			}
			if err := nftables.Check(ctx, ns.Path, good); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestFindIptablesRules sees the iptables rules of either variant, and
// nothing in a fresh namespace or beside our own table.
func TestFindIptablesRules(t *testing.T) {
	r := testnet.Reserve(t)
	ctx := context.Background()
	cfg := cases[0].config(t)
	fresh := r.NewNetns(t, "nf")
	if got, err := nftables.ApplyUnlessIptables(ctx, fresh.Path, nftables.Build(cfg)); err != nil || got.Any() {
		t.Fatalf("ApplyUnlessIptables in a fresh namespace: %+v, %v", got, err)
	}
	if err := nftables.Check(ctx, fresh.Path, nftables.Build(cfg)); err != nil {
		t.Fatal(err)
	}
	if got, err := nftables.FindIptablesRules(ctx, fresh.Path); err != nil || got.Any() {
		t.Fatalf("fresh namespace: %+v, %v", got, err)
	}
	for _, b := range []iptables.Variant{iptables.VariantNFT, iptables.VariantLegacy} {
		ns := r.NewNetns(t, "ipt")
		ex := &iptables.NetnsExecutor{NetNS: ns.Path, Variant: b}
		if err := iptables.Apply(ctx, ex, iptables.Build(cfg)); err != nil {
			t.Fatal(err)
		}
		got, err := nftables.FindIptablesRules(ctx, ns.Path)
		if err != nil {
			t.Fatal(err)
		}
		if want := (redirect.Leftovers{IptablesNFT: b == iptables.VariantNFT, IptablesLegacy: b == iptables.VariantLegacy}); got != want {
			t.Errorf("%s: found %+v, want %+v", b, got, want)
		}
		// ApplyUnlessIptables reports them and applies nothing.
		if got, err := nftables.ApplyUnlessIptables(ctx, ns.Path, nftables.Build(cfg)); err != nil || got == (redirect.Leftovers{}) {
			t.Errorf("%s: ApplyUnlessIptables = %+v, %v", b, got, err)
		}
		if ok, err := nftables.Present(ctx, ns.Path); err != nil || ok {
			t.Errorf("%s: table applied beside iptables rules: %v, %v", b, ok, err)
		}
	}
	if got, err := nftables.FindIptablesRules(ctx, "/run/netns/ccr-does-not-exist"); err != nil || got.Any() {
		t.Fatalf("missing namespace: %+v, %v", got, err)
	}
}
