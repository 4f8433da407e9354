//go:build privileged

package iptables_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/iptables"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/iptables/iptablestest"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/sdkoracle"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

var variants = []iptables.Variant{iptables.VariantNFT, iptables.VariantLegacy}

func save(t *testing.T, ex iptables.Executor, fam redirect.Family) string {
	t.Helper()
	out, err := ex.Save(context.Background(), fam)
	if err != nil {
		t.Fatal(err)
	}
	return iptablestest.Normalize(out)
}

// runSDK runs the SDK's command sequence in the namespace the way the SDK
// does: one nsenter + iptables exec per rule.
func runSDK(t *testing.T, ns *testnet.Netns, b iptables.Variant, cmds [][]string) {
	t.Helper()
	for _, c := range cmds {
		tool := b.Tool(redirect.IPv4)
		if c[0] == "ip6tables" {
			tool = b.Tool(redirect.IPv6)
		}
		out, err := exec.Command("nsenter", append([]string{"--net=" + ns.Path, "--", tool}, c[1:]...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v: %s", tool, strings.Join(c[1:], " "), err, out)
		}
	}
}

// TestRealTablesMatchGoldenAndSDK applies every golden case in a fresh
// namespace with each variant, and checks that iptables-save shows exactly
// the golden table and exactly what the SDK's own command sequence gives.
func TestRealTablesMatchGoldenAndSDK(t *testing.T) {
	r := testnet.Reserve(t)
	ctx := context.Background()
	for _, b := range variants {
		for _, c := range goldenCases {
			t.Run(string(b)+"/"+c.name, func(t *testing.T) {
				golden, err := os.ReadFile(filepath.Join("testdata", c.name+".golden"))
				if err != nil {
					t.Fatal(err)
				}
				sets := iptables.Build(c.config(t))
				ours := r.NewNetns(t, "rd")
				ex := &iptables.NetnsExecutor{NetNS: ours.Path, Variant: b}
				if err := iptables.Apply(ctx, ex, sets); err != nil {
					t.Fatal(err)
				}
				var sdkEx *iptables.NetnsExecutor
				if c.sdk {
					sdkNs := r.NewNetns(t, "sdk")
					runSDK(t, sdkNs, b, sdkoracle.One(t, c.json, c.dual).Commands)
					sdkEx = &iptables.NetnsExecutor{NetNS: sdkNs.Path, Variant: b}
				}
				for _, rs := range sets {
					got := save(t, ex, rs.Family)
					want, ok := goldenSection(string(golden), rs.Family, secTable)
					if !ok {
						t.Fatalf("golden has no %s table", rs.Family)
					}
					if got != want {
						t.Errorf("%s table differs from the golden file\n--- iptables-save\n%s--- golden\n%s", rs.Family, got, want)
					}
					if sdkEx != nil {
						if sdk := save(t, sdkEx, rs.Family); got != sdk {
							t.Errorf("%s table differs from the SDK's\n--- ours\n%s--- sdk\n%s", rs.Family, got, sdk)
						}
					}
					if err := iptables.Check(ctx, ex, sets); err != nil {
						t.Errorf("check: %v", err)
					}
				}
				if !c.dual && strings.Contains(save(t, ex, redirect.IPv6), "CONSUL") {
					t.Error("single stack wrote IPv6 rules")
				}
			})
		}
	}
}

func TestRealReapplyDriftRemove(t *testing.T) {
	r := testnet.Reserve(t)
	ctx := context.Background()
	for _, b := range variants {
		t.Run(string(b), func(t *testing.T) {
			ns := r.NewNetns(t, "rd")
			ex := &iptables.NetnsExecutor{NetNS: ns.Path, Variant: b}
			empty := [2]string{save(t, ex, redirect.IPv4), save(t, ex, redirect.IPv6)}
			sets := mustSets(t, `{"ConsulDNSIP":"::1","ConsulDNSPort":8600,"ProxyUserID":"5995","ProxyInboundPort":20000,"ExcludeInboundPorts":["22"],"ExcludeUIDs":["5996"]}`, true)
			if err := iptables.Apply(ctx, ex, sets); err != nil {
				t.Fatal(err)
			}
			first := [2]string{save(t, ex, redirect.IPv4), save(t, ex, redirect.IPv6)}
			if err := iptables.Apply(ctx, ex, sets); err != nil {
				t.Fatalf("re-ADD: %v", err)
			}
			if again := [2]string{save(t, ex, redirect.IPv4), save(t, ex, redirect.IPv6)}; again != first {
				t.Fatalf("re-ADD changed the tables\n%s\n%s", again, first)
			}
			// Delete a rule by hand: CHECK must say which.
			ns.Run(t, b.Tool(redirect.IPv6), "-t", "nat", "-D", redirect.ChainOutput, "-m", "owner", "--uid-owner", "5996", "-j", "RETURN")
			err := iptables.Check(ctx, ex, sets)
			if err == nil || !strings.Contains(err.Error(), "ipv6") || !strings.Contains(err.Error(), "rule missing: -A CONSUL_PROXY_OUTPUT -m owner --uid-owner 5996 -j RETURN") {
				t.Fatalf("check after deleting a rule: %v", err)
			}
			if err := iptables.Apply(ctx, ex, sets); err != nil {
				t.Fatal(err)
			}
			if err := iptables.Check(ctx, ex, sets); err != nil {
				t.Fatalf("check after repair: %v", err)
			}
			for i := 0; i < 2; i++ {
				if err := iptables.Remove(ctx, ex, redirect.Families); err != nil {
					t.Fatalf("remove #%d: %v", i+1, err)
				}
			}
			if got := [2]string{save(t, ex, redirect.IPv4), save(t, ex, redirect.IPv6)}; got != empty {
				t.Fatalf("after remove:\n%s\n%s", got[0], got[1])
			}
		})
	}
}

// corrupt makes the real IPv6 restore fail on its last rule line.
type corrupt struct{ iptables.Executor }

func (c corrupt) Restore(ctx context.Context, fam redirect.Family, in []byte) error {
	if fam == redirect.IPv6 && bytes.Contains(in, []byte("-A ")) {
		in = bytes.Replace(in, []byte("COMMIT\n"), []byte("-A OUTPUT -j NO_SUCH_CHAIN\nCOMMIT\n"), 1)
	}
	return c.Executor.Restore(ctx, fam, in)
}

func TestRealFailureLeavesNothing(t *testing.T) {
	r := testnet.Reserve(t)
	ctx := context.Background()
	for _, b := range variants {
		t.Run(string(b), func(t *testing.T) {
			ns := r.NewNetns(t, "rd")
			real := &iptables.NetnsExecutor{NetNS: ns.Path, Variant: b}
			empty := [2]string{save(t, real, redirect.IPv4), save(t, real, redirect.IPv6)}
			sets := mustSets(t, `{"ProxyUserID":"5995","ProxyInboundPort":20000}`, true)
			err := iptables.Apply(ctx, corrupt{real}, sets)
			var te *iptables.ToolError
			if !errors.As(err, &te) || !strings.Contains(err.Error(), "ip6tables") {
				t.Fatalf("want an ip6tables error, got %v", err)
			}
			t.Logf("error as an operator sees it: %v", err)
			if got := [2]string{save(t, real, redirect.IPv4), save(t, real, redirect.IPv6)}; got != empty {
				t.Fatalf("rules left after a failed ADD:\n%s\n%s", got[0], got[1])
			}
			// The same on a re-ADD over existing rules.
			if err := iptables.Apply(ctx, real, sets); err != nil {
				t.Fatal(err)
			}
			if err := iptables.Apply(ctx, corrupt{real}, sets); err == nil {
				t.Fatal("corrupt re-ADD succeeded")
			}
			if got := [2]string{save(t, real, redirect.IPv4), save(t, real, redirect.IPv6)}; got != empty {
				t.Fatalf("rules left after a failed re-ADD:\n%s\n%s", got[0], got[1])
			}
		})
	}
}

func TestRealMissingNetns(t *testing.T) {
	ex := &iptables.NetnsExecutor{NetNS: "/run/netns/ccr-does-not-exist", Variant: iptables.VariantNFT}
	_, err := ex.Save(context.Background(), redirect.IPv4)
	if !errors.Is(err, redirect.ErrNetnsGone) {
		t.Fatalf("got %v", err)
	}
}

func TestDetectOnThisHost(t *testing.T) {
	testnet.RequireRoot(t)
	b, why := iptables.VariantDetector{}.Detect(context.Background())
	if b == iptables.VariantDefault {
		t.Fatalf("no variant detected: %s", why)
	}
	t.Logf("this host uses %s: %s", b, why)
}
