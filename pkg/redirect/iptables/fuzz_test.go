package iptables_test

import (
	"context"
	"testing"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/iptables"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/iptables/iptablestest"
)

// FuzzBuild: whatever the annotation holds, either it is rejected or every
// rendered token is a plain number, name, option or address, the restore
// input has one line per rule, and applying it twice gives one table that
// CHECK accepts. Seeds: testdata/fuzz/FuzzBuild.
func FuzzBuild(f *testing.F) {
	f.Add([]byte(upstreamDefault), false)
	f.Add([]byte(`{"ConsulDNSIP":"::1","ProxyUserID":"1","ProxyInboundPort":2,"ExcludeOutboundCIDRs":["fd00::/8","10.0.0.1"]}`), true)
	f.Fuzz(func(t *testing.T, data []byte, dual bool) {
		cfg, err := annotations.ParseRedirectTrafficConfig(data, dual)
		if err != nil {
			return
		}
		sets := iptables.Build(cfg)
		assertSafe(t, sets)
		ctx := context.Background()
		fk := &iptablestest.Fake{}
		if err := iptables.Apply(ctx, fk, sets); err != nil {
			t.Fatalf("apply: %v", err)
		}
		first := fk.Table(redirect.IPv4) + fk.Table(redirect.IPv6)
		if err := iptables.Apply(ctx, fk, sets); err != nil {
			t.Fatalf("re-apply: %v", err)
		}
		if again := fk.Table(redirect.IPv4) + fk.Table(redirect.IPv6); again != first {
			t.Fatalf("re-apply changed the table")
		}
		if err := iptables.Check(ctx, fk, sets); err != nil {
			t.Fatalf("check: %v", err)
		}
	})
}
