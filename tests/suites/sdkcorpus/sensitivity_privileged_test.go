//go:build privileged

package sdkcorpus_test

import (
	"context"
	"strings"
	"testing"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/iptables"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/sdkoracle"
)

// The comparisons can fail: a config that differs from the SDK's by one
// excluded port must give DIFFER, naming the rule, on both sides.
func TestCorpusComparisonsSeeOneRule(t *testing.T) {
	r := requireNft(t)
	const a = `{"ProxyUserID":"5995","ProxyInboundPort":20000,"ExcludeInboundPorts":["22"]}`
	const b = `{"ProxyUserID":"5995","ProxyInboundPort":20000,"ExcludeInboundPorts":["23"]}`
	theirs := sdkoracle.Case{Name: "a", JSON: a}
	ours := sdkoracle.Case{Name: "b", JSON: b}

	variant, _ := iptables.VariantDetector{}.Detect(context.Background())
	w := iptWorker{r.NewNetns(t, "sdk"), r.NewNetns(t, "ours"), variant}
	sdk := sdkoracle.One(t, a, false)
	res := w.run(ours, sdk, sdk, sdk)
	if res.outcome != differ || !strings.Contains(res.detail, "-sdk  -A CONSUL_PROXY_INBOUND -p tcp -m tcp --dport 22 -j RETURN") ||
		!strings.Contains(res.detail, "+ours -A CONSUL_PROXY_INBOUND -p tcp -m tcp --dport 23 -j RETURN") {
		t.Errorf("iptables: %s\n%s", res.outcome, res.detail)
	}

	nw := nftWorker{r.NewNetns(t, "nsdk"), r.NewNetns(t, "nours")}
	script := sdkoracle.NFTables(t, []sdkoracle.Input{theirs.Input()})[0]
	res = nw.run(ours, script)
	if res.outcome != differ || !strings.Contains(res.detail, `"right":22`) || !strings.Contains(res.detail, `"right":23`) {
		t.Errorf("nftables: %s\n%s", res.outcome, res.detail)
	}
}
