package testnet

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
)

// Addresses of every link between the router and a namespace linked to it
// (Link): the router's end and the namespace's end carry the same pair on
// every link, so routes name a next hop without a subnet per link. Their
// scope is the link, so no connection ever takes one as its source: a
// namespace's own connections leave from its routable addresses (a node's
// IP, the external services' addresses).
var (
	routerLL4 = netip.MustParseAddr("169.254.0.1")
	linkedLL4 = netip.MustParseAddr("169.254.0.2")
	routerLL6 = netip.MustParseAddr("fe80::1")
	linkedLL6 = netip.MustParseAddr("fe80::2")
)

// RouterName is the router namespace of the slot (for "ip -n").
func (r *Range) RouterName() string { return r.nsPrefix() + "router" }

// routerPath is the router namespace's path.
func (r *Range) routerPath() string { return filepath.Join("/run/netns", r.RouterName()) }

// HostAddr is the host's IPv4 address on its link to the router: a server of
// the test process that listens there is reached from every namespace of the
// slot (nodes, pods), as a real node reaches its apiserver.
func (r *Range) HostAddr() netip.Addr {
	h4, _ := r.hostSubnets()
	return Host(h4, 1)
}

// hostLink is the host's end of its link to the router.
func (r *Range) hostLink() string { return r.linkPrefix() + "h" }

// hostSubnets are the host link's /30 and /126: the top of the slot.
func (r *Range) hostSubnets() (netip.Prefix, netip.Prefix) {
	v4 := netip.PrefixFrom(addOffset4(r.V4.Addr(), 4096-4), 30)
	b := r.Subnet6(0xffff).Addr().As16()
	b[15] = 0xfc
	return v4, netip.PrefixFrom(netip.AddrFrom16(b), 126)
}

// startRouter makes the slot's router namespace: forwarding on inside it (its
// own switch, not the host's), an "unreachable" route over the slot's
// prefixes, and a veth pair to the host, which routes the slot's prefixes
// through it.
func (r *Range) startRouter() error {
	rt := r.RouterName()
	if err := run("ip", "netns", "add", rt); err != nil {
		return err
	}
	if err := enableForwarding(r.routerPath()); err != nil {
		return fmt.Errorf("router %s: %w", rt, err)
	}
	h4, h6 := r.hostSubnets()
	hostA4, routerA4 := r.HostAddr(), Host(h4, 2)
	hostA6, routerA6 := Host(h6, 1), Host(h6, 2)
	host := r.hostLink()
	steps := [][]string{
		{"ip", "-n", rt, "link", "set", "lo", "up"},
		{"ip", "-n", rt, "route", "add", "unreachable", r.V4.String()},
		{"ip", "-n", rt, "-6", "route", "add", "unreachable", r.V6.String()},
		{"ip", "link", "add", host, "type", "veth", "peer", "name", "host", "netns", rt},
		{"ip", "-n", rt, "link", "set", "host", "up"},
		{"ip", "-n", rt, "addr", "add", routerA4.String() + "/30", "dev", "host"},
		{"ip", "-n", rt, "addr", "add", routerA6.String() + "/126", "dev", "host", "nodad"},
		{"ip", "link", "set", host, "up"},
		{"ip", "addr", "add", hostA4.String() + "/30", "dev", host},
		{"ip", "addr", "add", hostA6.String() + "/126", "dev", host, "nodad"},
		{"ip", "route", "replace", r.V4.String(), "via", routerA4.String(), "dev", host},
		{"ip", "-6", "route", "replace", r.V6.String(), "via", routerA6.String(), "dev", host},
	}
	for _, s := range steps {
		if err := run(s[0], s[1:]...); err != nil {
			return fmt.Errorf("router %s: %w", rt, err)
		}
	}
	return nil
}

// Link joins the named network namespace to the slot's router, as a node is
// cabled to its network: a veth pair whose end in the namespace is eth0, the
// namespace's default routes through the router, the given prefixes routed to
// the namespace by the router, and forwarding on inside the namespace (for
// the pods behind it). The link goes when the namespace is deleted.
func (r *Range) Link(nsName string, routed ...netip.Prefix) error {
	r.mu.Lock()
	i := r.links
	r.links++
	r.mu.Unlock()
	rt, end := r.RouterName(), fmt.Sprintf("n%d", i)
	steps := [][]string{
		{"-n", rt, "link", "add", end, "type", "veth", "peer", "name", "eth0", "netns", nsName},
		{"-n", rt, "addr", "add", routerLL4.String() + "/32", "dev", end, "scope", "link"},
		{"-n", rt, "addr", "add", routerLL6.String() + "/64", "dev", end, "nodad"},
		{"-n", rt, "link", "set", end, "up"},
		{"-n", nsName, "link", "set", "lo", "up"},
		{"-n", nsName, "addr", "add", linkedLL4.String() + "/32", "dev", "eth0", "scope", "link"},
		{"-n", nsName, "addr", "add", linkedLL6.String() + "/64", "dev", "eth0", "nodad"},
		{"-n", nsName, "link", "set", "eth0", "up"},
		{"-n", nsName, "route", "add", "default", "via", routerLL4.String(), "dev", "eth0", "onlink"},
		{"-n", nsName, "-6", "route", "add", "default", "via", routerLL6.String(), "dev", "eth0"},
	}
	for _, p := range routed {
		if p.Addr().Is4() {
			steps = append(steps, []string{"-n", rt, "route", "replace", p.String(), "via", linkedLL4.String(), "dev", end, "onlink"})
		} else {
			steps = append(steps, []string{"-n", rt, "-6", "route", "replace", p.String(), "via", linkedLL6.String(), "dev", end})
		}
	}
	for _, s := range steps {
		if err := run("ip", s...); err != nil {
			return fmt.Errorf("link %s to the router: %w", nsName, err)
		}
	}
	if err := enableForwarding(filepath.Join("/run/netns", nsName)); err != nil {
		return fmt.Errorf("link %s to the router: %w", nsName, err)
	}
	return nil
}

// NewNode creates a network namespace linked to the router (Link) with the
// given prefixes routed to it: the "host" side of a node, where a runtime
// runs the CNI plugins of its pods. Deleted when the test ends.
func (r *Range) NewNode(tb TB, name string, routed ...netip.Prefix) *Netns {
	tb.Helper()
	ns := r.NewNetns(tb, name)
	if err := r.Link(ns.Name, routed...); err != nil {
		tb.Fatalf("testnet: %v", err)
	}
	return ns
}

// enableForwarding turns IPv4 and IPv6 forwarding on in the network namespace
// at path: the namespace's own switches (a new namespace starts with them off,
// whatever the host has).
func enableForwarding(path string) error {
	return DoIn(path, func() error {
		for _, k := range []string{"net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"} {
			if err := os.WriteFile("/proc/sys/"+k, []byte("1"), 0o644); err != nil {
				return fmt.Errorf("%s: %w", k, err)
			}
		}
		return nil
	})
}

// HostForwardingOff switches the host's IPv4 and IPv6 forwarding off until the
// test ends, then restores what it found: a fresh machine has both off, and
// a test that must show traffic crossing the slot's network calls it to prove
// that it does not depend on what another tool (podman, docker) may have set
// on this one.
func HostForwardingOff(tb TB) {
	tb.Helper()
	for _, k := range []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"} {
		was, err := os.ReadFile(k)
		if err != nil {
			tb.Fatalf("testnet: %v", err)
		}
		if err := os.WriteFile(k, []byte("0"), 0o644); err != nil {
			tb.Fatalf("testnet: %v", err)
		}
		tb.Cleanup(func() {
			// Something outside the harness turned it on meanwhile: what the
			// test saw may have crossed the host, so it proves nothing.
			if now, err := os.ReadFile(k); err == nil && strings.TrimSpace(string(now)) != "0" {
				tb.Fatalf("testnet: %s was turned on during the test by something outside the harness: the test may have passed through the host", k)
			}
			if err := os.WriteFile(k, was, 0o644); err != nil {
				tb.Fatalf("testnet: restoring %s: %v", k, err)
			}
		})
	}
}

// RouterForwarding switches the router's forwarding (both families) on or
// off: with it off the slot's namespaces reach only their own neighbours,
// as on a host whose forwarding a harness depended on and found off. Tests
// use it to prove that a run which cannot see traffic cross says so.
func (r *Range) RouterForwarding(on bool) error {
	v := "0"
	if on {
		v = "1"
	}
	return DoIn(r.routerPath(), func() error {
		for _, k := range []string{"net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"} {
			if err := os.WriteFile("/proc/sys/"+k, []byte(v), 0o644); err != nil {
				return fmt.Errorf("router %s: %w", k, err)
			}
		}
		return nil
	})
}
