//go:build privileged

package redirect_test

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
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/redirecttest"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/sdkoracle"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

var backends = []redirect.Backend{redirect.BackendNFT, redirect.BackendLegacy}

func save(t *testing.T, ex redirect.Executor, fam redirect.Family) string {
	t.Helper()
	out, err := ex.Save(context.Background(), fam)
	if err != nil {
		t.Fatal(err)
	}
	return redirecttest.Normalize(out)
}

// runSDK runs the SDK's command sequence in the namespace the way the SDK
// does: one nsenter + iptables exec per rule.
func runSDK(t *testing.T, ns *testnet.Netns, b redirect.Backend, cmds [][]string) {
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
// namespace with each backend, and checks that iptables-save shows exactly
// the golden table and exactly what the SDK's own command sequence gives.
func TestRealTablesMatchGoldenAndSDK(t *testing.T) {
	r := testnet.Reserve(t)
	ctx := context.Background()
	for _, b := range backends {
		for _, c := range goldenCases {
			t.Run(string(b)+"/"+c.name, func(t *testing.T) {
				golden, err := os.ReadFile(filepath.Join("testdata", c.name+".golden"))
				if err != nil {
					t.Fatal(err)
				}
				sets := redirect.Build(c.config(t))
				ours := r.NewNetns(t, "rd")
				ex := &redirect.NetnsExecutor{NetNS: ours.Path, Backend: b}
				if err := redirect.Apply(ctx, ex, sets); err != nil {
					t.Fatal(err)
				}
				var sdkEx *redirect.NetnsExecutor
				if c.sdk {
					sdkNs := r.NewNetns(t, "sdk")
					runSDK(t, sdkNs, b, sdkoracle.One(t, c.json, c.dual).Commands)
					sdkEx = &redirect.NetnsExecutor{NetNS: sdkNs.Path, Backend: b}
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
					if err := redirect.Check(ctx, ex, sets); err != nil {
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
	for _, b := range backends {
		t.Run(string(b), func(t *testing.T) {
			ns := r.NewNetns(t, "rd")
			ex := &redirect.NetnsExecutor{NetNS: ns.Path, Backend: b}
			empty := [2]string{save(t, ex, redirect.IPv4), save(t, ex, redirect.IPv6)}
			sets := mustSets(t, `{"ConsulDNSIP":"::1","ConsulDNSPort":8600,"ProxyUserID":"5995","ProxyInboundPort":20000,"ExcludeInboundPorts":["22"],"ExcludeUIDs":["5996"]}`, true)
			if err := redirect.Apply(ctx, ex, sets); err != nil {
				t.Fatal(err)
			}
			first := [2]string{save(t, ex, redirect.IPv4), save(t, ex, redirect.IPv6)}
			if err := redirect.Apply(ctx, ex, sets); err != nil {
				t.Fatalf("re-ADD: %v", err)
			}
			if again := [2]string{save(t, ex, redirect.IPv4), save(t, ex, redirect.IPv6)}; again != first {
				t.Fatalf("re-ADD changed the tables\n%s\n%s", again, first)
			}
			// Delete a rule by hand: CHECK must say which.
			ns.Run(t, b.Tool(redirect.IPv6), "-t", "nat", "-D", redirect.ChainOutput, "-m", "owner", "--uid-owner", "5996", "-j", "RETURN")
			err := redirect.Check(ctx, ex, sets)
			if err == nil || !strings.Contains(err.Error(), "ipv6") || !strings.Contains(err.Error(), "rule missing: -A CONSUL_PROXY_OUTPUT -m owner --uid-owner 5996 -j RETURN") {
				t.Fatalf("check after deleting a rule: %v", err)
			}
			if err := redirect.Apply(ctx, ex, sets); err != nil {
				t.Fatal(err)
			}
			if err := redirect.Check(ctx, ex, sets); err != nil {
				t.Fatalf("check after repair: %v", err)
			}
			for i := 0; i < 2; i++ {
				if err := redirect.Remove(ctx, ex, redirect.Families); err != nil {
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
type corrupt struct{ redirect.Executor }

func (c corrupt) Restore(ctx context.Context, fam redirect.Family, in []byte) error {
	if fam == redirect.IPv6 && bytes.Contains(in, []byte("-A ")) {
		in = bytes.Replace(in, []byte("COMMIT\n"), []byte("-A OUTPUT -j NO_SUCH_CHAIN\nCOMMIT\n"), 1)
	}
	return c.Executor.Restore(ctx, fam, in)
}

func TestRealFailureLeavesNothing(t *testing.T) {
	r := testnet.Reserve(t)
	ctx := context.Background()
	for _, b := range backends {
		t.Run(string(b), func(t *testing.T) {
			ns := r.NewNetns(t, "rd")
			real := &redirect.NetnsExecutor{NetNS: ns.Path, Backend: b}
			empty := [2]string{save(t, real, redirect.IPv4), save(t, real, redirect.IPv6)}
			sets := mustSets(t, `{"ProxyUserID":"5995","ProxyInboundPort":20000}`, true)
			err := redirect.Apply(ctx, corrupt{real}, sets)
			var te *redirect.ToolError
			if !errors.As(err, &te) || !strings.Contains(err.Error(), "ip6tables") {
				t.Fatalf("want an ip6tables error, got %v", err)
			}
			t.Logf("error as an operator sees it: %v", err)
			if got := [2]string{save(t, real, redirect.IPv4), save(t, real, redirect.IPv6)}; got != empty {
				t.Fatalf("rules left after a failed ADD:\n%s\n%s", got[0], got[1])
			}
			// The same on a re-ADD over existing rules.
			if err := redirect.Apply(ctx, real, sets); err != nil {
				t.Fatal(err)
			}
			if err := redirect.Apply(ctx, corrupt{real}, sets); err == nil {
				t.Fatal("corrupt re-ADD succeeded")
			}
			if got := [2]string{save(t, real, redirect.IPv4), save(t, real, redirect.IPv6)}; got != empty {
				t.Fatalf("rules left after a failed re-ADD:\n%s\n%s", got[0], got[1])
			}
		})
	}
}

func TestRealMissingNetns(t *testing.T) {
	ex := &redirect.NetnsExecutor{NetNS: "/run/netns/ccr-does-not-exist", Backend: redirect.BackendNFT}
	_, err := ex.Save(context.Background(), redirect.IPv4)
	if !errors.Is(err, redirect.ErrNetnsGone) {
		t.Fatalf("got %v", err)
	}
}

func TestDetectOnThisHost(t *testing.T) {
	testnet.RequireRoot(t)
	b, why := redirect.Detector{}.Detect(context.Background())
	if b == redirect.BackendDefault {
		t.Fatalf("no backend detected: %s", why)
	}
	t.Logf("this host uses %s: %s", b, why)
}
