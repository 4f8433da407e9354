package sdkoracle_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/sdkoracle"
)

// The annotation is the SDK's Config serialized: every field but the
// provider must have the same name and type in annotations.RedirectTrafficConfig.
func TestAnnotationHasTheSDKConfigFields(t *testing.T) {
	ours := map[string]string{}
	rt := reflect.TypeOf(annotations.RedirectTrafficConfig{})
	for i := 0; i < rt.NumField(); i++ {
		ours[rt.Field(i).Name] = rt.Field(i).Type.String()
	}
	for name, bin := range map[string]string{
		"iptables": sdkoracle.IPTablesBinary(t),
		"nftables": sdkoracle.NFTablesBinary(t),
	} {
		sdk := sdkoracle.Fields(t, bin)
		for f, typ := range sdk {
			if strings.HasSuffix(f, "Provider") {
				delete(sdk, f)
				continue
			}
			if ours[f] != typ {
				t.Errorf("%s SDK field %s is %s, annotations.RedirectTrafficConfig has %q", name, f, typ, ours[f])
			}
		}
		if len(sdk) != len(ours) {
			t.Errorf("%s SDK Config has fields %v (without its provider), annotations.RedirectTrafficConfig has %v", name, sdk, ours)
		}
	}
}

func TestOraclesAnswerEveryLine(t *testing.T) {
	in := []sdkoracle.Input{
		{Config: []byte(`{"ProxyUserID":"5995","ProxyInboundPort":20000,"ConsulDNSPort":8600}`), DualStack: true},
		{Config: []byte(`{"ProxyInboundPort":20000}`)},
		{Config: []byte(`{"ProxyUserID":5995}`)},
	}
	ipt := sdkoracle.IPTables(t, in)
	if ipt[0].Error != "" || len(ipt[0].Family("ip6tables")) == 0 || len(ipt[0].Family("iptables")) == 0 {
		t.Errorf("dual stack: %+v", ipt[0])
	}
	if !strings.Contains(ipt[1].Error, "ProxyUserID is required") || !strings.Contains(ipt[2].Error, "decode") {
		t.Errorf("invalid configs: %+v", ipt[1:])
	}
	nft := sdkoracle.NFTables(t, in)
	if nft[0].Error != "" || !strings.Contains(nft[0].Script, "add table inet consul_tproxy\n") ||
		!strings.Contains(nft[0].Script, "ip6 daddr ::1 udp dport 53 dnat to [::1]:8600") {
		t.Errorf("dual stack: %+v", nft[0])
	}
	if nft[1].Error == "" || nft[2].Error == "" {
		t.Errorf("invalid configs: %+v", nft[1:])
	}
}

func TestCorpusIsDeterministicAndCoversEveryField(t *testing.T) {
	a, b := sdkoracle.Corpus(sdkoracle.DefaultSeed, 2000), sdkoracle.Corpus(sdkoracle.DefaultSeed, 2000)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("two corpora of one seed differ")
	}
	seen := map[string]int{}
	dual, valid := 0, 0
	for _, c := range a {
		for _, f := range []string{"ConsulDNSIP", "ConsulDNSPort", "ProxyOutboundPort", "ExcludeInboundPorts", "ExcludeOutboundPorts",
			"ExcludeOutboundCIDRs", "ExcludeUIDs", "NetNS", "IptablesProvider", `[]`, `null`, `::`, `/`, "proxyuserid"} {
			if strings.Contains(c.JSON, f) {
				seen[f]++
			}
		}
		if c.DualStack {
			dual++
		}
		if c.Mutation == "" {
			valid++
		}
		seen["mutation "+c.Mutation]++
	}
	for k, n := range seen {
		if n == 0 {
			t.Errorf("nothing with %s", k)
		}
	}
	for _, m := range sdkoracle.Mutations {
		if seen["mutation "+m] == 0 {
			t.Errorf("no case with mutation %s", m)
		}
	}
	if dual < 500 || valid < 1200 {
		t.Errorf("%d dual stack, %d unmutated of %d", dual, valid, len(a))
	}
	t.Logf("%d cases, %d dual stack, %d unmutated; %v", len(a), dual, valid, seen)
}
