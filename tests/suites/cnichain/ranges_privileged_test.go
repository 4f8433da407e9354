//go:build privileged

package cnichain_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cnichain"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

// TestTrafficPortRanges applies exclude-list port ranges ("a:b", as
// consul-k8s's plugin accepts them) through libcni, and proves with real
// TCP connections that a port inside a range bypasses the proxy while the
// ports just outside it are redirected, outbound and inbound, for every
// backend (iptables with either variant, nftables); the table is the one the SDK's own commands give.
func TestTrafficPortRanges(t *testing.T) {
	r := testnet.Reserve(t)
	ext := r.NewExternal(t)
	for _, port := range []int{8999, 9000, 9050, 9100, 9101} {
		listen(t, ext, "tcp", hostPort(ext.V4, port), fmt.Sprint("external-", port))
	}
	cfg := `{"ProxyUserID":"5995","ProxyInboundPort":20000,"ProxyOutboundPort":15001,` +
		`"ExcludeInboundPorts":["20200:20300"],"ExcludeOutboundPorts":["9000:9100"],"ExcludeUIDs":["5996"]}`

	for _, backend := range []string{"auto", "legacy", backendNftables} {
		t.Run(backend, func(t *testing.T) {
			ctx := context.Background()
			s4, _ := podSubnets(r)
			chain := cnichain.New(t, cnichain.Options{Subnet4: s4, Consul: entryFor(t, backend)})
			pod := r.NewNetns(t, "pod")
			rt := cnichain.Runtime("ctr-ranges-"+backend, pod.Path, [2]string{"CONSUL_IPTABLES_CONFIG", cfg})
			res, err := chain.Add(ctx, rt)
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			t.Cleanup(func() { chain.Del(context.Background(), rt) })
			ip := podIP(t, res, false)

			listen(t, pod, "tcp", ":15001", "outbound-listener")
			listen(t, pod, "tcp", ":20000", "inbound-listener")
			for _, port := range []int{20199, 20200, 20250, 20300, 20301} {
				listen(t, pod, "tcp", fmt.Sprint(":", port), fmt.Sprint("app-", port))
			}
			runExpectations(t, pod, ext.Netns, []expect{
				{1000, "tcp", hostPort(ext.V4, 8999), "outbound-listener"},
				{1000, "tcp", hostPort(ext.V4, 9000), "external-9000"},
				{1000, "tcp", hostPort(ext.V4, 9050), "external-9050"},
				{1000, "tcp", hostPort(ext.V4, 9100), "external-9100"},
				{1000, "tcp", hostPort(ext.V4, 9101), "outbound-listener"},
				{-1, "tcp", hostPort(ip, 20199), "inbound-listener"},
				{-1, "tcp", hostPort(ip, 20200), "app-20200"},
				{-1, "tcp", hostPort(ip, 20250), "app-20250"},
				{-1, "tcp", hostPort(ip, 20300), "app-20300"},
				{-1, "tcp", hostPort(ip, 20301), "inbound-listener"},
			})

			if err := chain.Check(ctx, rt); err != nil {
				t.Errorf("CHECK: %v", err)
			}
			if backend == backendNftables {
				assertNftables(t, pod, cfg, false)
				return
			}
			b := backendFor(t, backend)
			want := sdkTable(t, r, b, cfg, false)
			got := [2]string{saveNat(t, pod, b, redirect.IPv4), saveNat(t, pod, b, redirect.IPv6)}
			if got != want {
				t.Errorf("pod nat tables differ from what the SDK gives\n--- pod\n%s%s--- sdk\n%s%s", got[0], got[1], want[0], want[1])
			}
		})
	}
}
