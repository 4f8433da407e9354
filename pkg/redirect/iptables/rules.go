// Package iptables is the iptables backend: it turns a validated
// transparent-proxy configuration into the nat-table rules Consul's SDK
// (v0.18.1, the version consul-k8s pins) installs in a pod's network
// namespace, and applies, verifies and removes them atomically with
// iptables-restore, with the variant of the tools (nft or legacy) the node
// itself uses (VariantDetector).
//
// The rules are data: Build returns one RuleSet per address family, every
// rule already in the canonical form iptables-save prints. A RuleSet renders
// as iptables-restore input (RestoreNew, RestoreReplace), as a cleanup
// (Cleanup) and as the expectation CHECK compares against (Check). Running
// the tools is left to an Executor, so the logic is tested against an
// in-memory fake (iptablestest) and the real one only has to run two
// commands. Backend is the package as a redirect.Backend.
package iptables

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
)

// Rule is one rule of the nat table: the chain it is in and its match and
// target arguments in the canonical order and spelling iptables-save uses,
// so a rule read back from the kernel compares equal to the one built here.
type Rule struct {
	Chain string
	Args  []string
}

// Spec is the rule's arguments joined as iptables-save prints them after
// "-A <chain> ".
func (r Rule) Spec() string { return strings.Join(r.Args, " ") }

// String is the rule as an iptables-save line.
func (r Rule) String() string { return "-A " + r.Chain + " " + r.Spec() }

// Target is the chain or target the rule jumps to (-j or -g).
func (r Rule) Target() string { return target(r.Args) }

// RuleSet is the whole set of rules for one family, in their final order:
// the rules of each chain appear in the order the chain holds them after
// the SDK's appends and head inserts. Rules of the built-in chains
// (PREROUTING, OUTPUT) are appended after whatever those chains hold.
type RuleSet struct {
	Family redirect.Family
	Rules  []Rule
}

// ChainRules returns the rules of one chain, in order.
func (rs RuleSet) ChainRules(chain string) []Rule {
	var out []Rule
	for _, r := range rs.Rules {
		if r.Chain == chain {
			out = append(out, r)
		}
	}
	return out
}

// Build returns the rule sets for a validated configuration: the IPv4 set,
// and in dual stack the IPv6 set as well. As in the SDK, single stack gets
// DNS rules in its IPv4 set; dual stack gets none in the IPv4 set and DNS
// rules in the IPv6 set.
//
// Excluded outbound CIDRs go to the set of their own family. (The SDK passes
// every CIDR to both iptables and ip6tables, which fails for a mixed list;
// for every list it can apply, the result is the same.)
func Build(cfg annotations.TrafficConfig) []RuleSet {
	if !cfg.DualStack {
		return []RuleSet{build(cfg, redirect.IPv4, true)}
	}
	return []RuleSet{build(cfg, redirect.IPv4, false), build(cfg, redirect.IPv6, true)}
}

// FamiliesOf returns the families of a list of rule sets.
func FamiliesOf(sets []RuleSet) []redirect.Family {
	out := make([]redirect.Family, 0, len(sets))
	for _, s := range sets {
		out = append(out, s.Family)
	}
	return out
}

// builder keeps the rules per chain so that the SDK's sequence of appends
// (-A) and head inserts (-I) can be written down as it is and still yield
// the final order.
type builder struct {
	order  []string
	chains map[string][]Rule
}

func (b *builder) add(head bool, chain string, args ...string) {
	if _, ok := b.chains[chain]; !ok {
		b.order = append(b.order, chain)
	}
	r := Rule{Chain: chain, Args: args}
	if head {
		b.chains[chain] = append([]Rule{r}, b.chains[chain]...)
	} else {
		b.chains[chain] = append(b.chains[chain], r)
	}
}

func (b *builder) append(chain string, args ...string) { b.add(false, chain, args...) }
func (b *builder) insert(chain string, args ...string) { b.add(true, chain, args...) }

// saveChainOrder is the order iptables-save prints chains in: built-in
// chains first, then user chains by name.
var saveChainOrder = []string{"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING",
	redirect.ChainDNS, redirect.ChainInbound, redirect.ChainInboundRedirect, redirect.ChainOutput, redirect.ChainOutputRedirect}

func build(cfg annotations.TrafficConfig, fam redirect.Family, dns bool) RuleSet {
	b := &builder{chains: map[string][]Rule{}}
	loopback := "127.0.0.1/32"
	dnsDefault := netip.MustParseAddr("127.0.0.1")
	if fam == redirect.IPv6 {
		loopback = "::1/128"
		dnsDefault = netip.MustParseAddr("::1")
	}
	// A port range renders as --dport a:b, the SDK's argument as
	// iptables-save prints it back.
	tcpPort := func(p annotations.PortRange) []string {
		return []string{"-p", "tcp", "-m", "tcp", "--dport", p.String()}
	}

	// Outbound: the redirect to the proxy's outbound listener.
	b.append(redirect.ChainOutputRedirect, "-p", "tcp", "-j", "REDIRECT", "--to-ports", u16(cfg.ProxyOutboundPort))

	// DNS, before the rule that sends all TCP to the proxy.
	if dns {
		switch {
		case cfg.ConsulDNSIP.IsValid() && cfg.ConsulDNSPort == 0:
			ip := cfg.ConsulDNSIP.String()
			for _, proto := range []string{"udp", "tcp"} {
				b.append(redirect.ChainDNS, "-p", proto, "-m", proto, "--dport", "53", "-j", "DNAT", "--to-destination", ip)
			}
			for _, proto := range []string{"udp", "tcp"} {
				b.append("OUTPUT", "-p", proto, "-m", proto, "--dport", "53", "-j", redirect.ChainDNS)
			}
		case cfg.ConsulDNSPort != 0:
			ip := dnsDefault
			if cfg.ConsulDNSIP.IsValid() {
				ip = cfg.ConsulDNSIP
			}
			dst := hostPrefix(ip)
			to := netip.AddrPortFrom(ip, cfg.ConsulDNSPort).String()
			for _, proto := range []string{"udp", "tcp"} {
				b.append(redirect.ChainDNS, "-d", dst, "-p", proto, "-m", proto, "--dport", "53", "-j", "DNAT", "--to-destination", to)
			}
			for _, proto := range []string{"udp", "tcp"} {
				b.append("OUTPUT", "-d", dst, "-p", proto, "-m", proto, "--dport", "53", "-j", redirect.ChainDNS)
			}
		}
	}

	b.append("OUTPUT", "-p", "tcp", "-j", redirect.ChainOutput)
	b.append(redirect.ChainOutput, "-m", "owner", "--uid-owner", u32(cfg.ProxyUserID), "-j", "RETURN")
	b.append(redirect.ChainOutput, "-d", loopback, "-j", "RETURN")
	b.append(redirect.ChainOutput, "-j", redirect.ChainOutputRedirect)
	// Exclusions are inserted at the head, so the last listed ends up first.
	for _, p := range cfg.ExcludeOutboundPorts {
		b.insert(redirect.ChainOutput, append(tcpPort(p), "-j", "RETURN")...)
	}
	for _, c := range cfg.ExcludeOutboundCIDRs {
		if (fam == redirect.IPv4) != c.Addr().Is4() {
			continue
		}
		b.insert(redirect.ChainOutput, "-d", c.Masked().String(), "-j", "RETURN")
	}
	for _, u := range cfg.ExcludeUIDs {
		b.insert(redirect.ChainOutput, "-m", "owner", "--uid-owner", u32(u), "-j", "RETURN")
	}

	// Inbound.
	b.append(redirect.ChainInboundRedirect, "-p", "tcp", "-j", "REDIRECT", "--to-ports", u16(cfg.ProxyInboundPort))
	b.append("PREROUTING", "-p", "tcp", "-j", redirect.ChainInbound)
	b.append(redirect.ChainInbound, "-p", "tcp", "-j", redirect.ChainInboundRedirect)
	for _, p := range cfg.ExcludeInboundPorts {
		b.insert(redirect.ChainInbound, append(tcpPort(p), "-j", "RETURN")...)
	}

	rs := RuleSet{Family: fam}
	for _, c := range saveChainOrder {
		rs.Rules = append(rs.Rules, b.chains[c]...)
		delete(b.chains, c)
	}
	if len(b.chains) != 0 {
		panic(fmt.Sprintf("redirect: chain order misses %v", b.chains))
	}
	return rs
}

func hostPrefix(a netip.Addr) string { return netip.PrefixFrom(a, a.BitLen()).String() }

func u16(v uint16) string { return strconv.FormatUint(uint64(v), 10) }
func u32(v uint32) string { return strconv.FormatUint(uint64(v), 10) }
