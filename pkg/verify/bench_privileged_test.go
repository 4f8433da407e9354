//go:build privileged

package verify_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/cri"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/cri/critest"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/iptables"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/nftables"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/verify"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

type discard struct{ last verify.Summary }

func (d *discard) Pod(verify.PodResult)  {}
func (d *discard) Gone(cri.Sandbox)      {}
func (d *discard) Node(s verify.Summary) { d.last = s }

// cpu returns the user+system CPU time of this process and of its waited
// children (the iptables-save runs).
func cpu() time.Duration {
	var self, kids syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &self)
	_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &kids)
	tv := func(t syscall.Timeval) time.Duration { return time.Duration(t.Nano()) }
	return tv(self.Utime) + tv(self.Stime) + tv(kids.Utime) + tv(kids.Stime)
}

func statusKiB(field string) float64 {
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, field+":") {
			f := strings.Fields(l)
			n, _ := strconv.ParseFloat(f[1], 64)
			return n
		}
	}
	return 0
}

// BenchmarkVerify110Pods is `make bench-verify`: a node with 110 injected
// pods (the kubelet's default maximum), each a real network namespace with
// the plugin's rules (100 iptables through the node's iptables-nft, 10 the
// nftables table), listed by a CRI server over a unix socket. It reports the
// CPU (this process and the iptables-save it runs) of the first pass, which
// inspects every sandbox, of a steady pass (nothing changed: list and
// fingerprints only) and of a pass after one pod's rules were removed by
// hand, and the memory the verifier holds.
func BenchmarkVerify110Pods(b *testing.B) {
	testnet.RequireRoot(b)
	r := testnet.Reserve(b)
	ctx := context.Background()
	srv := critest.Start(b)
	cfg, err := annotations.ParseRedirectTrafficConfig([]byte(cfgJSON), false)
	if err != nil {
		b.Fatal(err)
	}
	var first *testnet.Netns
	for i := range 110 {
		ns := r.NewNetns(b, fmt.Sprintf("vb%d", i))
		if i < 100 {
			err = iptables.Apply(ctx, &iptables.NetnsExecutor{NetNS: ns.Path, Variant: iptables.VariantNFT}, iptables.Build(cfg))
		} else {
			err = nftables.Apply(ctx, ns.Path, nftables.Build(cfg))
		}
		if err != nil {
			b.Fatal(err)
		}
		if i == 0 {
			first = ns
		}
		uid := fmt.Sprintf("00000000-0000-0000-0000-%012d", i)
		srv.Add(cri.Sandbox{ID: fmt.Sprintf("%064d", i), PodUID: uid, PodName: fmt.Sprintf("app-%d", i), PodNamespace: "bench",
			Created: time.Now(), Labels: map[string]string{annotations.KeyInjectStatus: annotations.InjectStatusInjected},
			Annotations: map[string]string{annotations.KeyInjectStatus: annotations.InjectStatusInjected,
				annotations.KeyTransparentProxyStatus: annotations.TProxyStatusComplete, annotations.KeyRedirectTrafficConfig: cfgJSON}}, ns.Path)
	}
	for b.Loop() {
		measure(b, srv.Socket, first)
	}
}

func measure(b *testing.B, socket string, first *testnet.Netns) {
	ctx := context.Background()
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	client, err := cri.Dial(ctx, socket)
	if err != nil {
		b.Fatal(err)
	}
	defer client.Close()
	rep := &discard{}
	v, err := verify.New(verify.Config{Runtime: client, Inspector: verify.Kernel{}, Reporter: rep,
		Interval: 2 * time.Second, Resync: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	pass := func() time.Duration {
		c0 := cpu()
		if err := v.Pass(ctx); err != nil {
			b.Fatal(err)
		}
		return cpu() - c0
	}
	firstPass := pass()
	if rep.last.Redirected != 110 {
		b.Fatalf("first pass: %+v, want 110 redirected", rep.last)
	}
	var steady time.Duration
	const steadyPasses = 20
	for range steadyPasses {
		steady += pass()
	}
	if v.Inspections != 110 {
		b.Fatalf("%d inspections after steady passes, want 110", v.Inspections)
	}
	first.Run(b, "iptables-nft", "-t", "nat", "-D", redirect.ChainOutput, "1")
	changed := pass() + pass()
	if rep.last.Unredirected != 1 {
		b.Fatalf("after removing a rule: %+v, want 1 unredirected", rep.last)
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(firstPass.Microseconds())/1000, "cpu-ms/first-pass")
	b.ReportMetric(float64(steady.Microseconds())/1000/steadyPasses, "cpu-ms/steady-pass")
	b.ReportMetric(float64(changed.Microseconds())/1000, "cpu-ms/change-found")
	b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/1024, "held-heap-KiB")
	b.ReportMetric(statusKiB("VmHWM")/1024, "peak-rss-MiB")
	runtime.KeepAlive(v)
	// Put the rule back for the next round.
	if err := iptables.Apply(ctx, &iptables.NetnsExecutor{NetNS: first.Path, Variant: iptables.VariantNFT}, iptables.Build(mustConfig(b))); err != nil {
		b.Fatal(err)
	}
}

func mustConfig(tb testing.TB) annotations.TrafficConfig {
	cfg, err := annotations.ParseRedirectTrafficConfig([]byte(cfgJSON), false)
	if err != nil {
		tb.Fatal(err)
	}
	return cfg
}
