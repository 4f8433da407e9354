//go:build privileged

package nftables_test

import (
	"context"
	"os/exec"
	"testing"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/nftables"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

// BenchmarkApplyUnlessIptables times the nftables backend's part of a first
// ADD in-process (a fresh namespace per iteration, not timed): the leftover
// look and the transaction that creates the table of the default config.
// With -cpuprofile it shows where the in-process time goes.
func BenchmarkApplyUnlessIptables(b *testing.B) {
	r := testnet.Reserve(b)
	tbl := nftables.Build(cases[0].config(b))
	ctx := context.Background()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		ns := r.NewNetns(b, "nfb")
		b.StartTimer()
		found, err := nftables.ApplyUnlessIptables(ctx, ns.Path, tbl)
		if err != nil || found.Any() {
			b.Fatal(found, err)
		}
		b.StopTimer()
		_ = exec.Command("ip", "netns", "del", ns.Name).Run()
		b.StartTimer()
	}
}
