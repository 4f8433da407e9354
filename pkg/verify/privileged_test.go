//go:build privileged

package verify_test

import (
	"context"
	"strings"
	"testing"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/iptables"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/nftables"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/verify"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

const cfgJSON = `{"ProxyUserID":"5995","ProxyInboundPort":20000,"ProxyOutboundPort":15001,"ExcludeInboundPorts":["21000"],"ExcludeUIDs":["5996"]}`

func config(t *testing.T, dual bool) annotations.TrafficConfig {
	t.Helper()
	cfg, err := annotations.ParseRedirectTrafficConfig([]byte(cfgJSON), dual)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func fingerprint(t *testing.T, ns string) verify.Fingerprint {
	t.Helper()
	fp, err := verify.ReadFingerprint(ns)
	if err != nil {
		t.Fatal(err)
	}
	return fp
}

func expect(t *testing.T, got verify.Result, v verify.Verdict, reason, backend string) {
	t.Helper()
	if got.Verdict != v || got.Reason != reason || got.Backend != backend {
		t.Fatalf("inspect = %+v, want %s/%s/%q", got, v, reason, backend)
	}
}

// TestTheKernelInspectorFindsEachBackendsRulesAndEveryRuleRemovedByHand
// applies the rules the way the plugin does with each backend and variant,
// then removes one rule by hand with the tool a user would use: the
// fingerprint moves and the look says drifted; a namespace with nothing of
// ours says missing.
func TestTheKernelInspectorFindsEachBackendsRulesAndEveryRuleRemovedByHand(t *testing.T) {
	testnet.RequireRoot(t)
	r := testnet.Reserve(t)
	ctx := context.Background()
	k := verify.Kernel{}
	for _, dual := range []bool{false, true} {
		cfg := config(t, dual)
		for _, b := range []iptables.Variant{iptables.VariantNFT, iptables.VariantLegacy} {
			name := "iptables-" + string(b)
			t.Run(name+map[bool]string{false: "", true: "/dual"}[dual], func(t *testing.T) {
				ns := r.NewNetns(t, "vf")
				expect(t, k.Inspect(ctx, ns.Path, cfg), verify.Unredirected, annotations.ReasonRulesMissing, "")
				before := fingerprint(t, ns.Path)
				if err := iptables.Apply(ctx, &iptables.NetnsExecutor{NetNS: ns.Path, Variant: b}, iptables.Build(cfg)); err != nil {
					t.Fatal(err)
				}
				applied := fingerprint(t, ns.Path)
				if applied == before {
					t.Fatalf("fingerprint %+v did not move when the rules were applied", applied)
				}
				expect(t, k.Inspect(ctx, ns.Path, cfg), verify.Redirected, annotations.ReasonRulesInPlace, name)
				if again := fingerprint(t, ns.Path); again != applied {
					t.Fatalf("fingerprint moved from %+v to %+v by a look alone", applied, again)
				}
				ns.Run(t, b.Tool(redirect.IPv4), "-t", "nat", "-D", redirect.ChainOutput, "1")
				if fingerprint(t, ns.Path) == applied {
					t.Fatal("fingerprint did not move when a rule was removed by hand")
				}
				got := k.Inspect(ctx, ns.Path, cfg)
				expect(t, got, verify.Unredirected, annotations.ReasonRulesDrifted, "")
				if !strings.Contains(got.Detail, redirect.ChainOutput) {
					t.Fatalf("detail %q does not name the chain that changed", got.Detail)
				}
			})
		}
		t.Run("nftables"+map[bool]string{false: "", true: "/dual"}[dual], func(t *testing.T) {
			ns := r.NewNetns(t, "vf")
			before := fingerprint(t, ns.Path)
			if err := nftables.Apply(ctx, ns.Path, nftables.Build(cfg)); err != nil {
				t.Fatal(err)
			}
			applied := fingerprint(t, ns.Path)
			if applied == before {
				t.Fatal("fingerprint did not move when the table was created")
			}
			expect(t, k.Inspect(ctx, ns.Path, cfg), verify.Redirected, annotations.ReasonRulesInPlace, "nftables")
			ns.Run(t, "nft", "flush", "chain", "inet", nftables.TableName, redirect.ChainOutput)
			if fingerprint(t, ns.Path) == applied {
				t.Fatal("fingerprint did not move when a chain was flushed by hand")
			}
			expect(t, k.Inspect(ctx, ns.Path, cfg), verify.Unredirected, annotations.ReasonRulesDrifted, "")
			ns.Run(t, "nft", "delete", "table", "inet", nftables.TableName)
			expect(t, k.Inspect(ctx, ns.Path, cfg), verify.Unredirected, annotations.ReasonRulesMissing, "")
		})
	}
}

func TestRulesOfAnotherConfigurationAreNotTheRulesOfThisOne(t *testing.T) {
	testnet.RequireRoot(t)
	r := testnet.Reserve(t)
	ctx := context.Background()
	ns := r.NewNetns(t, "vf")
	other, err := annotations.ParseRedirectTrafficConfig([]byte(`{"ProxyUserID":"5995","ProxyInboundPort":20000,"ProxyOutboundPort":15002}`), false)
	if err != nil {
		t.Fatal(err)
	}
	if err := iptables.Apply(ctx, &iptables.NetnsExecutor{NetNS: ns.Path, Variant: iptables.VariantNFT}, iptables.Build(other)); err != nil {
		t.Fatal(err)
	}
	expect(t, verify.Kernel{}.Inspect(ctx, ns.Path, config(t, false)), verify.Unredirected, annotations.ReasonRulesDrifted, "")
}

func TestANamespaceThatIsGoneIsUnknownNotUnredirected(t *testing.T) {
	testnet.RequireRoot(t)
	got := verify.Kernel{}.Inspect(context.Background(), "/run/netns/ccr-no-such-namespace", config(t, false))
	if got.Verdict == verify.Unredirected {
		t.Fatalf("a missing namespace was judged unredirected: %+v", got)
	}
	if _, err := verify.ReadFingerprint("/run/netns/ccr-no-such-namespace"); err == nil {
		t.Fatal("fingerprint of a missing namespace read without error")
	}
}
