package nftables_test

import (
	"testing"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
)

// tcase is a redirect configuration as the webhook writes it.
type tcase struct {
	name string
	json string
	dual bool
}

func (c tcase) config(t testing.TB) annotations.TrafficConfig {
	t.Helper()
	cfg, err := annotations.ParseRedirectTrafficConfig([]byte(c.json), c.dual)
	if err != nil {
		t.Fatalf("%s: %v", c.name, err)
	}
	return cfg
}

// upstreamDefault is what the consul-k8s webhook writes for a default pod.
const upstreamDefault = `{"ConsulDNSIP":"127.0.0.1","ConsulDNSPort":8600,"ProxyUserID":"5995","ProxyInboundPort":20000,` +
	`"ProxyOutboundPort":15001,"ExcludeInboundPorts":["20200","21000"],"ExcludeOutboundPorts":null,` +
	`"ExcludeOutboundCIDRs":null,"ExcludeUIDs":["5996"],"NetNS":"","IptablesProvider":null}`

var cases = []tcase{
	{name: "default", json: upstreamDefault},
	{name: "minimal", json: `{"ProxyUserID":"5995","ProxyInboundPort":20000}`},
	{name: "dns-ip-only", json: `{"ConsulDNSIP":"198.18.200.53","ProxyUserID":"5995","ProxyInboundPort":20000}`},
	{name: "dns-port-only", json: `{"ConsulDNSPort":8600,"ProxyUserID":"5995","ProxyInboundPort":20000,"ProxyOutboundPort":15002}`},
	{name: "dual-stack", dual: true, json: `{"ConsulDNSIP":"::1","ConsulDNSPort":8600,"ProxyUserID":"5995","ProxyInboundPort":20000,` +
		`"ExcludeInboundPorts":["20200","21000"],"ExcludeOutboundPorts":["5432"],"ExcludeUIDs":["5996"]}`},
	{name: "dual-stack-dns-ip-only", dual: true, json: `{"ConsulDNSIP":"fd63:6372:ffff::53","ProxyUserID":"5995","ProxyInboundPort":20000}`},
	{name: "dual-stack-dns-port-only", dual: true, json: `{"ConsulDNSPort":8600,"ProxyUserID":"5995","ProxyInboundPort":20000}`},
	{name: "port-ranges", json: `{"ProxyUserID":"5995","ProxyInboundPort":20000,` +
		`"ExcludeInboundPorts":["20200:20300","21000"],"ExcludeOutboundPorts":["8000:8100","9090","1:65535"]}`},
	{name: "dual-stack-mixed-cidrs", dual: true, json: `{"ProxyUserID":"5995","ProxyInboundPort":20000,` +
		`"ExcludeOutboundCIDRs":["10.0.0.0/8","fd00::/8","192.168.1.7","2001:db8::1","10.16.0.0/12","0.0.0.0/0","fd00::/65","::/0"]}`},
	{name: "cidrs-uids", json: `{"ProxyUserID":"65534000","ProxyInboundPort":1,"ProxyOutboundPort":65535,` +
		`"ExcludeOutboundCIDRs":["10.0.0.0/31","192.168.0.0/1"],"ExcludeUIDs":["70000","2147483647"]}`},
}
