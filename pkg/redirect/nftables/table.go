// Package nftables is the native nftables backend of the redirect rules: the
// table `inet consul_tproxy` that Consul's SDK v0.19.0 (`nftables` package)
// installs in a pod's network namespace, built as data from the same
// annotations.TrafficConfig as the rules of its sibling, package iptables,
// and applied, verified and removed in-process over netlink (no nft binary).
// Backend is the package as a redirect.Backend.
//
// The API, in the order a CNI plugin uses it:
//
//	t := nftables.Build(cfg)                 // the table as data (Table)
//	err := nftables.Apply(ctx, netnsPath, t) // ADD: replace the table, one atomic batch
//	err = nftables.Check(ctx, netnsPath, t)  // CHECK: nil, or a *Drift with every difference
//	err = nftables.Remove(ctx, netnsPath)    // DEL: delete the table; nil when ns or table is gone
//
// netnsPath is a network namespace file (CNI_NETNS, /var/run/netns/<name>,
// /proc/<pid>/ns/net). Apply is one netlink transaction: in a namespace
// without the table it creates the table exclusively with every chain and
// rule; when the table exists (a repeated ADD) it sends the SDK's "add
// table; delete table; add table" followed by every chain and rule, so the
// table is replaced atomically. A failed transaction changes nothing, and
// Apply then deletes the table (fail closed, nothing of ours left). One inet table
// serves both families: in single stack the two base chains begin with
// `meta nfproto ipv6 return`, as in the SDK.
//
// Each Rule carries its expressions (what the kernel stores) and its text as
// `nft --guid list table inet consul_tproxy` prints it, so a test
// can compare the kernel's listing with Table.String. (nft prints a UID that
// has a name in the host's passwd file by name, e.g. "root" for 0, and a UID
// of 2^31 or more as a negative number; the text keeps the number.) Check
// compares the kernel's expressions, not text. Table.Script renders the same
// table as `nft -f` input.
//
// Two details of the SDK are kept: chains are created in the SDK's order
// (the order nft lists them), and excluded CIDRs of both families go into
// the one table. A PortRange whose ends are equal is a single port (the
// annotation parser does not keep the SDK's distinction between "80" and
// "80:80").
package nftables

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/google/nftables/expr"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
)

// TableName is the table of family inet that holds every rule of ours.
const TableName = "consul_tproxy"

// The base chains; the regular chains have the iptables names
// (redirect.ChainInbound etc.).
const (
	ChainNATOutput     = "CONSUL_NAT_OUTPUT"
	ChainNATPrerouting = "CONSUL_NAT_PREROUTING"
)

// natPriority is the priority of both base chains (dstnat).
const natPriority = -100

// Hook makes a chain a base chain.
type Hook struct {
	// Type is the chain type ("nat").
	Type string
	// Hook is "output" or "prerouting".
	Hook string
	// Priority is natPriority.
	Priority int32
}

// Chain is a chain of the table; Hook is nil for a regular chain.
type Chain struct {
	Name string
	Hook *Hook
}

// Rule is one rule: its chain, its expressions and its text.
type Rule struct {
	Chain string
	// Text is the rule as nft --guid lists it.
	Text  string
	Exprs []expr.Any
}

// Table is the whole table: the chains in creation order and the rules
// grouped by chain in that order, each chain's rules in their final order.
type Table struct {
	Chains []Chain
	Rules  []Rule
}

// ChainRules returns the rules of one chain, in order.
func (t Table) ChainRules(chain string) []Rule {
	var out []Rule
	for _, r := range t.Rules {
		if r.Chain == chain {
			out = append(out, r)
		}
	}
	return out
}

// String renders the table the way `nft --guid list table inet
// consul_tproxy` prints it (tabs, a blank line between chains).
func (t Table) String() string {
	var b strings.Builder
	b.WriteString("table inet " + TableName + " {\n")
	for i, c := range t.Chains {
		if i > 0 {
			b.WriteString("\n")
		}
		b.WriteString("\tchain " + c.Name + " {\n")
		if c.Hook != nil {
			prio := strconv.Itoa(int(c.Hook.Priority))
			if c.Hook.Hook == "prerouting" && c.Hook.Priority == natPriority {
				prio = "dstnat"
			}
			fmt.Fprintf(&b, "\t\ttype %s hook %s priority %s; policy accept;\n", c.Hook.Type, c.Hook.Hook, prio)
		}
		for _, r := range t.ChainRules(c.Name) {
			b.WriteString("\t\t" + r.Text + "\n")
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	return b.String()
}

// chainOrder is the order the SDK creates the chains in.
var chainOrder = []Chain{
	{Name: redirect.ChainInbound},
	{Name: redirect.ChainInboundRedirect},
	{Name: redirect.ChainOutput},
	{Name: redirect.ChainOutputRedirect},
	{Name: redirect.ChainDNS},
	{Name: ChainNATOutput, Hook: &Hook{Type: "nat", Hook: "output", Priority: natPriority}},
	{Name: ChainNATPrerouting, Hook: &Hook{Type: "nat", Hook: "prerouting", Priority: natPriority}},
}

// builder keeps rules per chain so the SDK's appends and head inserts can be
// written down in its order and still give the final order.
type builder struct{ chains map[string][]Rule }

func (b *builder) add(head bool, chain string, terms ...term) {
	r := Rule{Chain: chain}
	texts := make([]string, 0, len(terms))
	for _, t := range terms {
		texts = append(texts, t.text)
		r.Exprs = append(r.Exprs, t.exprs...)
	}
	r.Text = strings.Join(texts, " ")
	if head {
		b.chains[chain] = append([]Rule{r}, b.chains[chain]...)
	} else {
		b.chains[chain] = append(b.chains[chain], r)
	}
}

func (b *builder) append(chain string, terms ...term) { b.add(false, chain, terms...) }
func (b *builder) insert(chain string, terms ...term) { b.add(true, chain, terms...) }

// Build returns the table for a validated configuration, rule for rule what
// SDK v0.19.0's Setup installs for it.
func Build(cfg annotations.TrafficConfig) Table {
	b := &builder{chains: map[string][]Rule{}}
	if !cfg.DualStack {
		for _, c := range []string{ChainNATOutput, ChainNATPrerouting} {
			b.append(c, nfprotoIs(redirect.IPv6), verdictReturn())
		}
	}
	buildOutbound(b, cfg)
	buildInbound(b, cfg)
	t := Table{Chains: append([]Chain(nil), chainOrder...)}
	for _, c := range t.Chains {
		t.Rules = append(t.Rules, b.chains[c.Name]...)
	}
	return t
}

func buildOutbound(b *builder, cfg annotations.TrafficConfig) {
	b.append(redirect.ChainOutputRedirect, l4proto(protoTCP), redirectTo(cfg.ProxyOutboundPort))
	buildDNS(b, cfg)
	b.append(ChainNATOutput, l4proto(protoTCP), jump(redirect.ChainOutput))
	b.append(redirect.ChainOutput, skuid(cfg.ProxyUserID), verdictReturn())
	b.append(redirect.ChainOutput, daddr(netip.MustParsePrefix("127.0.0.1/32")), verdictReturn())
	b.append(redirect.ChainOutput, daddr(netip.MustParsePrefix("::1/128")), verdictReturn())
	b.append(redirect.ChainOutput, jump(redirect.ChainOutputRedirect))
	// Exclusions are inserted at the head: the last listed ends up first.
	for _, p := range cfg.ExcludeOutboundPorts {
		b.insert(redirect.ChainOutput, dport(protoTCP, p), verdictReturn())
	}
	for _, c := range cfg.ExcludeOutboundCIDRs {
		b.insert(redirect.ChainOutput, daddr(c.Masked()), verdictReturn())
	}
	for _, u := range cfg.ExcludeUIDs {
		b.insert(redirect.ChainOutput, skuid(u), verdictReturn())
	}
}

// buildDNS adds the DNS rules. Unlike the iptables rules, the inet table
// gets them in dual stack too; with a port and no address, dual stack
// redirects both loopback addresses.
func buildDNS(b *builder, cfg annotations.TrafficConfig) {
	port53 := annotations.PortRange{First: 53, Last: 53}
	switch {
	case cfg.ConsulDNSIP.IsValid() && cfg.ConsulDNSPort == 0:
		for _, p := range []proto{protoUDP, protoTCP} {
			b.append(redirect.ChainDNS, dport(p, port53), dnat(cfg.ConsulDNSIP, 0))
		}
		for _, p := range []proto{protoUDP, protoTCP} {
			b.append(ChainNATOutput, dport(p, port53), jump(redirect.ChainDNS))
		}
	case cfg.ConsulDNSPort != 0:
		ips := []netip.Addr{netip.MustParseAddr("127.0.0.1")}
		switch {
		case cfg.ConsulDNSIP.IsValid():
			ips = []netip.Addr{cfg.ConsulDNSIP}
		case cfg.DualStack:
			ips = append(ips, netip.MustParseAddr("::1"))
		}
		for _, ip := range ips {
			host := netip.PrefixFrom(ip, ip.BitLen())
			for _, p := range []proto{protoUDP, protoTCP} {
				b.append(redirect.ChainDNS, daddr(host), dport(p, port53), dnat(ip, cfg.ConsulDNSPort))
			}
			for _, p := range []proto{protoUDP, protoTCP} {
				b.append(ChainNATOutput, daddr(host), dport(p, port53), jump(redirect.ChainDNS))
			}
		}
	}
}

func buildInbound(b *builder, cfg annotations.TrafficConfig) {
	b.append(redirect.ChainInboundRedirect, l4proto(protoTCP), redirectTo(cfg.ProxyInboundPort))
	b.append(ChainNATPrerouting, l4proto(protoTCP), jump(redirect.ChainInbound))
	b.append(redirect.ChainInbound, l4proto(protoTCP), jump(redirect.ChainInboundRedirect))
	for _, p := range cfg.ExcludeInboundPorts {
		b.insert(redirect.ChainInbound, dport(protoTCP, p), verdictReturn())
	}
}

// Script renders the table as `nft -f` input that builds the same table the
// way the SDK does (add, delete and add the table, then every chain and
// rule). Only tests and humans run it; Apply speaks netlink.
func (t Table) Script() string {
	var b strings.Builder
	pre := "inet " + TableName
	b.WriteString("add table " + pre + "\ndelete table " + pre + "\nadd table " + pre + "\n")
	for _, c := range t.Chains {
		b.WriteString("add chain " + pre + " " + c.Name)
		if c.Hook != nil {
			fmt.Fprintf(&b, " { type %s hook %s priority %d ; }", c.Hook.Type, c.Hook.Hook, c.Hook.Priority)
		}
		b.WriteString("\n")
	}
	for _, r := range t.Rules {
		b.WriteString("add rule " + pre + " " + r.Chain + " " + r.Text + "\n")
	}
	return b.String()
}
