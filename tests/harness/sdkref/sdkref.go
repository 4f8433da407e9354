// Package sdkref reproduces, for tests and the benchmark, the sequence of
// iptables commands Consul's SDK v0.18.1 (iptables.Setup, the version
// consul-k8s pins) runs for a redirect configuration: one command per rule,
// chains created first, appends (-A) and head inserts (-I) in the SDK's
// order, an IPv4 pass and, in dual stack, an IPv6 pass.
//
// Running these commands in a fresh namespace gives the table our
// pkg/redirect must reproduce exactly; timing them gives the baseline our
// atomic restore is compared with.
package sdkref

import (
	"net"
	"strconv"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
)

const (
	proxyInbound         = "CONSUL_PROXY_INBOUND"
	proxyInboundRedirect = "CONSUL_PROXY_IN_REDIRECT"
	proxyOutput          = "CONSUL_PROXY_OUTPUT"
	proxyOutputRedirect  = "CONSUL_PROXY_REDIRECT"
	dnsChain             = "CONSUL_DNS_REDIRECT"
)

// Commands returns the argument vectors ("iptables" or "ip6tables" first)
// the SDK executes for the configuration, values passed through as the
// annotation holds them. The configuration must be valid (see
// annotations.RedirectTrafficConfig.Validate).
func Commands(c annotations.RedirectTrafficConfig, dualStack bool) [][]string {
	if c.ProxyOutboundPort == 0 {
		c.ProxyOutboundPort = annotations.DefaultProxyOutboundPort
	}
	out := pass(c, "iptables", "127.0.0.1", "127.0.0.1/32", !dualStack)
	if dualStack {
		out = append(out, pass(c, "ip6tables", "::1", "::1/128", true)...)
	}
	return out
}

func pass(c annotations.RedirectTrafficConfig, tool, dnsDefault, loopback string, dns bool) [][]string {
	var out [][]string
	add := func(args ...string) { out = append(out, append([]string{tool, "-t", "nat"}, args...)) }
	for _, ch := range []string{proxyInbound, proxyInboundRedirect, proxyOutput, proxyOutputRedirect, dnsChain} {
		add("-N", ch)
	}
	add("-A", proxyOutputRedirect, "-p", "tcp", "-j", "REDIRECT", "--to-port", strconv.Itoa(c.ProxyOutboundPort))
	if dns {
		if c.ConsulDNSIP != "" && c.ConsulDNSPort == 0 {
			add("-A", dnsChain, "-p", "udp", "--dport", "53", "-j", "DNAT", "--to-destination", c.ConsulDNSIP)
			add("-A", dnsChain, "-p", "tcp", "--dport", "53", "-j", "DNAT", "--to-destination", c.ConsulDNSIP)
			add("-A", "OUTPUT", "-p", "udp", "--dport", "53", "-j", dnsChain)
			add("-A", "OUTPUT", "-p", "tcp", "--dport", "53", "-j", dnsChain)
		} else if c.ConsulDNSPort != 0 {
			ip := dnsDefault
			if c.ConsulDNSIP != "" {
				ip = c.ConsulDNSIP
			}
			hp := net.JoinHostPort(ip, strconv.Itoa(c.ConsulDNSPort))
			add("-A", dnsChain, "-p", "udp", "-d", ip, "--dport", "53", "-j", "DNAT", "--to-destination", hp)
			add("-A", dnsChain, "-p", "tcp", "-d", ip, "--dport", "53", "-j", "DNAT", "--to-destination", hp)
			add("-A", "OUTPUT", "-p", "udp", "-d", ip, "--dport", "53", "-j", dnsChain)
			add("-A", "OUTPUT", "-p", "tcp", "-d", ip, "--dport", "53", "-j", dnsChain)
		}
	}
	add("-A", "OUTPUT", "-p", "tcp", "-j", proxyOutput)
	add("-A", proxyOutput, "-m", "owner", "--uid-owner", c.ProxyUserID, "-j", "RETURN")
	add("-A", proxyOutput, "-d", loopback, "-j", "RETURN")
	add("-A", proxyOutput, "-j", proxyOutputRedirect)
	for _, p := range c.ExcludeOutboundPorts {
		add("-I", proxyOutput, "-p", "tcp", "--dport", p, "-j", "RETURN")
	}
	for _, cidr := range c.ExcludeOutboundCIDRs {
		add("-I", proxyOutput, "-d", cidr, "-j", "RETURN")
	}
	for _, u := range c.ExcludeUIDs {
		add("-I", proxyOutput, "-m", "owner", "--uid-owner", u, "-j", "RETURN")
	}
	add("-A", proxyInboundRedirect, "-p", "tcp", "-j", "REDIRECT", "--to-port", strconv.Itoa(c.ProxyInboundPort))
	add("-A", "PREROUTING", "-p", "tcp", "-j", proxyInbound)
	add("-A", proxyInbound, "-p", "tcp", "-j", proxyInboundRedirect)
	for _, p := range c.ExcludeInboundPorts {
		add("-I", proxyInbound, "-p", "tcp", "--dport", p, "-j", "RETURN")
	}
	return out
}
