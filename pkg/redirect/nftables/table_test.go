package nftables_test

import (
	"strings"
	"testing"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/nftables"
)

// The table SDK v0.19.0 installs for the webhook's default annotation, as
// nft lists it.
const wantDefault = `table inet consul_tproxy {
	chain CONSUL_PROXY_INBOUND {
		tcp dport 21000 return
		tcp dport 20200 return
		meta l4proto tcp jump CONSUL_PROXY_IN_REDIRECT
	}

	chain CONSUL_PROXY_IN_REDIRECT {
		meta l4proto tcp redirect to :20000
	}

	chain CONSUL_PROXY_OUTPUT {
		meta skuid 5996 return
		meta skuid 5995 return
		ip daddr 127.0.0.1 return
		ip6 daddr ::1 return
		jump CONSUL_PROXY_REDIRECT
	}

	chain CONSUL_PROXY_REDIRECT {
		meta l4proto tcp redirect to :15001
	}

	chain CONSUL_DNS_REDIRECT {
		ip daddr 127.0.0.1 udp dport 53 dnat ip to 127.0.0.1:8600
		ip daddr 127.0.0.1 tcp dport 53 dnat ip to 127.0.0.1:8600
	}

	chain CONSUL_NAT_OUTPUT {
		type nat hook output priority -100; policy accept;
		meta nfproto ipv6 return
		ip daddr 127.0.0.1 udp dport 53 jump CONSUL_DNS_REDIRECT
		ip daddr 127.0.0.1 tcp dport 53 jump CONSUL_DNS_REDIRECT
		meta l4proto tcp jump CONSUL_PROXY_OUTPUT
	}

	chain CONSUL_NAT_PREROUTING {
		type nat hook prerouting priority dstnat; policy accept;
		meta nfproto ipv6 return
		meta l4proto tcp jump CONSUL_PROXY_INBOUND
	}
}
`

func TestBuildDefault(t *testing.T) {
	if got := nftables.Build(cases[0].config(t)).String(); got != wantDefault {
		t.Fatalf("got\n%s\nwant\n%s", got, wantDefault)
	}
}

// TestBuildRules checks the rules of chosen chains per configuration: DNS in
// dual stack (both loopbacks with a port and no address, only the address
// otherwise), ranges, mixed CIDR families, exclusion order.
func TestBuildRules(t *testing.T) {
	for _, tc := range []struct {
		name, chain string
		want        []string
	}{
		{"minimal", nftables.ChainNATOutput, []string{"meta nfproto ipv6 return", "meta l4proto tcp jump CONSUL_PROXY_OUTPUT"}},
		{"minimal", "CONSUL_DNS_REDIRECT", nil},
		{"dns-ip-only", "CONSUL_DNS_REDIRECT", []string{"udp dport 53 dnat ip to 198.18.200.53", "tcp dport 53 dnat ip to 198.18.200.53"}},
		{"dns-ip-only", nftables.ChainNATOutput, []string{"meta nfproto ipv6 return", "udp dport 53 jump CONSUL_DNS_REDIRECT",
			"tcp dport 53 jump CONSUL_DNS_REDIRECT", "meta l4proto tcp jump CONSUL_PROXY_OUTPUT"}},
		{"dns-port-only", "CONSUL_PROXY_REDIRECT", []string{"meta l4proto tcp redirect to :15002"}},
		{"dns-port-only", "CONSUL_DNS_REDIRECT", []string{"ip daddr 127.0.0.1 udp dport 53 dnat ip to 127.0.0.1:8600",
			"ip daddr 127.0.0.1 tcp dport 53 dnat ip to 127.0.0.1:8600"}},
		{"dual-stack", nftables.ChainNATPrerouting, []string{"meta l4proto tcp jump CONSUL_PROXY_INBOUND"}},
		{"dual-stack", "CONSUL_DNS_REDIRECT", []string{"ip6 daddr ::1 udp dport 53 dnat ip6 to [::1]:8600",
			"ip6 daddr ::1 tcp dport 53 dnat ip6 to [::1]:8600"}},
		{"dual-stack", "CONSUL_PROXY_OUTPUT", []string{"meta skuid 5996 return", "tcp dport 5432 return", "meta skuid 5995 return",
			"ip daddr 127.0.0.1 return", "ip6 daddr ::1 return", "jump CONSUL_PROXY_REDIRECT"}},
		{"dual-stack-dns-ip-only", "CONSUL_DNS_REDIRECT", []string{"udp dport 53 dnat ip6 to fd63:6372:ffff::53", "tcp dport 53 dnat ip6 to fd63:6372:ffff::53"}},
		{"dual-stack-dns-port-only", nftables.ChainNATOutput, []string{
			"ip daddr 127.0.0.1 udp dport 53 jump CONSUL_DNS_REDIRECT", "ip daddr 127.0.0.1 tcp dport 53 jump CONSUL_DNS_REDIRECT",
			"ip6 daddr ::1 udp dport 53 jump CONSUL_DNS_REDIRECT", "ip6 daddr ::1 tcp dport 53 jump CONSUL_DNS_REDIRECT",
			"meta l4proto tcp jump CONSUL_PROXY_OUTPUT"}},
		{"port-ranges", "CONSUL_PROXY_INBOUND", []string{"tcp dport 21000 return", "tcp dport 20200-20300 return", "meta l4proto tcp jump CONSUL_PROXY_IN_REDIRECT"}},
		{"port-ranges", "CONSUL_PROXY_OUTPUT", []string{"tcp dport 1-65535 return", "tcp dport 9090 return", "tcp dport 8000-8100 return",
			"meta skuid 5995 return", "ip daddr 127.0.0.1 return", "ip6 daddr ::1 return", "jump CONSUL_PROXY_REDIRECT"}},
		{"dual-stack-mixed-cidrs", "CONSUL_PROXY_OUTPUT", []string{"ip6 daddr ::/0 return", "ip6 daddr fd00::/65 return", "ip daddr 0.0.0.0/0 return",
			"ip daddr 10.16.0.0/12 return", "ip6 daddr 2001:db8::1 return", "ip daddr 192.168.1.7 return", "ip6 daddr fd00::/8 return",
			"ip daddr 10.0.0.0/8 return", "meta skuid 5995 return", "ip daddr 127.0.0.1 return", "ip6 daddr ::1 return", "jump CONSUL_PROXY_REDIRECT"}},
		{"cidrs-uids", "CONSUL_PROXY_OUTPUT", []string{"meta skuid 2147483647 return", "meta skuid 70000 return", "ip daddr 128.0.0.0/1 return",
			"ip daddr 10.0.0.0/31 return", "meta skuid 65534000 return", "ip daddr 127.0.0.1 return", "ip6 daddr ::1 return", "jump CONSUL_PROXY_REDIRECT"}},
		{"cidrs-uids", "CONSUL_PROXY_IN_REDIRECT", []string{"meta l4proto tcp redirect to :1"}},
	} {
		t.Run(tc.name+"/"+tc.chain, func(t *testing.T) {
			var c tcase
			for _, x := range cases {
				if x.name == tc.name {
					c = x
				}
			}
			var got []string
			for _, r := range nftables.Build(c.config(t)).ChainRules(tc.chain) {
				got = append(got, r.Text)
			}
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}
