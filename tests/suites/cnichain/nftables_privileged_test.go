//go:build privileged

package cnichain_test

import (
	"context"
	"strings"
	"testing"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/iptables"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/nftables"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cnichain"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

// backendNftables names the nftables backend in the traffic tests' tables
// of backends, beside the iptables variants "auto" and "legacy".
const backendNftables = cniconf.BackendNftables

// entryFor is the consul-cni entry for a backend of the traffic tests:
// "auto" or "legacy" (the iptables backend with that variant of the tools)
// or "nftables".
func entryFor(t *testing.T, backend string) map[string]any {
	if backend == backendNftables {
		return consulEntry(t, "auto", map[string]any{cniconf.KeyBackend: cniconf.BackendNftables})
	}
	return consulEntry(t, backend, nil)
}

// assertNftables checks the pod's table inet consul_tproxy: the kernel
// lists exactly what nftables.Build gives for the config, and no iptables
// rule of ours is in the namespace.
func assertNftables(t *testing.T, pod *testnet.Netns, js string, dual bool) {
	t.Helper()
	cfg, err := annotations.ParseRedirectTrafficConfig([]byte(js), dual)
	if err != nil {
		t.Fatal(err)
	}
	want := nftables.Build(cfg)
	if got := pod.Run(t, "nft", "--guid", "list", "table", "inet", nftables.TableName); got != want.String() {
		t.Errorf("pod table\n%s\nwant\n%s", got, want.String())
	}
	if err := nftables.Check(context.Background(), pod.Path, want); err != nil {
		t.Error(err)
	}
	// (An x_tables nat table, emptied, may remain after a switch from
	// legacy; saveNat shows it holds nothing of ours.)
	if found, err := nftables.FindIptablesRules(context.Background(), pod.Path); err != nil || found.IptablesNFT {
		t.Errorf("iptables-nft rules beside the nftables table: %+v, %v", found, err)
	}
}

// TestBesideIptablesNft: a pod namespace where another component (the
// primary CNI, the application, a sidecar of another mesh) already has
// iptables-nft rules in the nat table: a DNAT of outbound port 7070 to the
// pod's own app, and a REDIRECT of inbound port 9999 to it.
//
// The priority interplay, as the kernel does it: the iptables backend
// appends its jumps to the nat chains OUTPUT and PREROUTING, after the other
// rules, so those match first. The nftables backend's base chains hook NAT
// at priority -100, the priority of iptables-nft's nat chains; at equal
// priority the kernel runs the chain registered last first, and the first
// NAT binding of a connection is the one that counts. Our table, created at
// ADD after the primary CNI's rules, therefore sees every connection first:
// what it redirects goes to the proxy, what it lets through (the proxy's
// UID, exclusions) still gets the other rules' NAT. Either way ADD, CHECK
// and DEL never touch the other rules, and CHECK does not take them for
// leftovers of the iptables backend.
func TestBesideIptablesNft(t *testing.T) {
	r := testnet.Reserve(t)
	ext := r.NewExternal(t)
	listen(t, ext, "tcp", hostPort(ext.V4, 8080), "external")
	listen(t, ext, "tcp", hostPort(ext.V4, 7070), "external-7070")
	cfg := `{"ProxyUserID":"5995","ProxyInboundPort":20000,"ProxyOutboundPort":15001,"ExcludeUIDs":["5996"]}`
	for _, tc := range []struct {
		backend, first  string // first: who NATs a connection both would
		out7070, in9999 string
	}{
		{"auto", "theirs", "app-8080", "app-8080"},
		{backendNftables, "ours", "outbound-listener", "inbound-listener"},
	} {
		t.Run(tc.backend, func(t *testing.T) {
			t.Logf("a connection both NAT goes to %s", tc.first)
			besideIptablesNft(t, r, ext, tc.backend, cfg, tc.out7070, tc.in9999)
		})
	}
}

func besideIptablesNft(t *testing.T, r *testnet.Range, ext *testnet.External, backend, cfg, out7070, in9999 string) {
	ctx := context.Background()
	s4, _ := podSubnets(r)
	chain := cnichain.New(t, cnichain.Options{Subnet4: s4, Consul: entryFor(t, backend)})
	pod := r.NewNetns(t, "pod")
	// The other component's rules, in place before our ADD (a primary CNI
	// runs first).
	pod.Run(t, "iptables-nft", "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "--dport", "7070", "-j", "DNAT", "--to-destination", "127.0.0.1:8080")
	pod.Run(t, "iptables-nft", "-t", "nat", "-A", "PREROUTING", "-p", "tcp", "--dport", "9999", "-j", "REDIRECT", "--to-ports", "8080")
	theirs := saveNat(t, pod, iptables.VariantNFT, redirect.IPv4)

	rt := cnichain.Runtime("ctr-beside-"+backend, pod.Path, [2]string{"CONSUL_IPTABLES_CONFIG", cfg})
	res, err := chain.Add(ctx, rt)
	if err != nil {
		t.Fatalf("ADD: %v", err)
	}
	t.Cleanup(func() { chain.Del(context.Background(), rt) })
	ip := podIP(t, res, false)

	listen(t, pod, "tcp", ":15001", "outbound-listener")
	listen(t, pod, "tcp", ":20000", "inbound-listener")
	listen(t, pod, "tcp", ":8080", "app-8080")
	runExpectations(t, pod, ext.Netns, []expect{
		{1000, "tcp", hostPort(ext.V4, 8080), "outbound-listener"}, // only ours
		{1000, "tcp", hostPort(ext.V4, 7070), out7070},             // both: the first wins
		{5995, "tcp", hostPort(ext.V4, 7070), "app-8080"},          // ours lets the proxy through: theirs
		{5995, "tcp", hostPort(ext.V4, 8080), "external"},          // neither
		{-1, "tcp", hostPort(ip, 9999), in9999},                    // both: the first wins
		{-1, "tcp", hostPort(ip, 8080), "inbound-listener"},        // only ours
	})
	if err := chain.Check(ctx, rt); err != nil {
		t.Errorf("CHECK beside the other rules: %v", err)
	}
	if backend == backendNftables {
		assertNftables(t, pod, cfg, false)
		if got := saveNat(t, pod, iptables.VariantNFT, redirect.IPv4); got != theirs {
			t.Errorf("ADD changed the other rules\n%s\nwant\n%s", got, theirs)
		}
	}
	if err := chain.Del(ctx, rt); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if got := saveNat(t, pod, iptables.VariantNFT, redirect.IPv4); got != theirs {
		t.Fatalf("DEL left a different nat table\n%s\nwant (the other rules only)\n%s", got, theirs)
	}
	if ok, err := nftables.Present(ctx, pod.Path); err != nil || ok {
		t.Fatalf("table after DEL: %v, %v", ok, err)
	}
}

// TestSwitchBackends: a re-ADD of the same sandbox with the other backend
// (what the runtime does after the node's entry changed and the pod's
// sandbox is recreated in place) leaves nothing of the old backend, for
// each iptables variant, in both directions.
func TestSwitchBackends(t *testing.T) {
	r := testnet.Reserve(t)
	ctx := context.Background()
	cfg := `{"ConsulDNSIP":"127.0.0.1","ConsulDNSPort":8600,"ProxyUserID":"5995","ProxyInboundPort":20000,"ExcludeUIDs":["5996"]}`
	for _, variant := range []string{"auto", "legacy"} {
		t.Run(variant, func(t *testing.T) {
			s4, _ := podSubnets(r)
			ipt := cnichain.New(t, cnichain.Options{Subnet4: s4, Consul: entryFor(t, variant)})
			nft := cnichain.New(t, cnichain.Options{Subnet4: s4, Consul: entryFor(t, backendNftables)})
			pod := r.NewNetns(t, "pod")
			rt := cnichain.Runtime("ctr-switch-"+variant, pod.Path, [2]string{"CONSUL_IPTABLES_CONFIG", cfg})
			res, err := ipt.Add(ctx, rt)
			if err != nil {
				t.Fatalf("ADD iptables: %v", err)
			}
			t.Cleanup(func() { ipt.Del(context.Background(), rt) })
			b := backendFor(t, variant)
			if !strings.Contains(saveNat(t, pod, b, redirect.IPv4), "CONSUL_PROXY_OUTPUT") {
				t.Fatal("no iptables rules after the iptables ADD")
			}
			if _, _, err := nft.ExecConsul(ctx, "ADD", rt, res); err != nil {
				t.Fatalf("re-ADD nftables: %v", err)
			}
			if got := saveNat(t, pod, b, redirect.IPv4); strings.Contains(got, "CONSUL") {
				t.Fatalf("iptables rules left after switching to nftables:\n%s", got)
			}
			assertNftables(t, pod, cfg, false)
			if _, stderr, err := nft.ExecConsul(ctx, "CHECK", rt, res); err != nil {
				t.Fatalf("CHECK nftables: %v\n%s", err, stderr)
			}
			if _, _, err := ipt.ExecConsul(ctx, "ADD", rt, res); err != nil {
				t.Fatalf("re-ADD iptables: %v", err)
			}
			if ok, err := nftables.Present(ctx, pod.Path); err != nil || ok {
				t.Fatalf("nftables table left after switching back: %v, %v", ok, err)
			}
			if _, stderr, err := ipt.ExecConsul(ctx, "CHECK", rt, res); err != nil {
				t.Fatalf("CHECK iptables: %v\n%s", err, stderr)
			}
		})
	}
}
