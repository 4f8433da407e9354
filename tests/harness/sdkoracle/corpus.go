package sdkoracle

import (
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// DefaultSeed is the seed of the corpus tests use unless told otherwise.
const DefaultSeed = 20261201

// Case is one generated configuration.
type Case struct {
	// Name is "c<index>", stable for a seed.
	Name string
	// JSON is the annotation value.
	JSON      string
	DualStack bool
	// Mutation names the one invalid or unusual change made to an
	// otherwise valid configuration ("" for none): the tests decide per
	// mutation which sides may accept the config.
	Mutation string
}

// Input is the case as the oracles take it.
func (c Case) Input() Input {
	return Input{Config: json.RawMessage(c.JSON), DualStack: c.DualStack}
}

// Mutations: what a careless or hostile annotation may hold; a third of
// the corpus carries one.
var Mutations = []string{
	"no-proxy-uid", "no-inbound-port", "uid-not-numeric", "uid-name", "uid-too-big", "uid-negative",
	"port-zero", "port-too-big", "range-reversed", "range-equal", "range-open", "port-service-name",
	"port-space", "port-injection", "cidr-bad-prefix", "cidr-garbage", "cidr-wrong-family",
	"dns-ip-wrong-family", "dns-ip-garbage", "dns-port-negative", "inbound-port-too-big",
	"outbound-port-too-big", "uid-as-number", "list-not-array",
}

// Corpus returns n configurations generated from seed: every field of the
// annotation, present, absent, null or empty; single and dual stack; each
// DNS mode; single ports and ranges; IPv4 and IPv6 CIDRs and bare
// addresses (both families in dual stack); keys in other letter cases; and
// about one in three with a mutation from Mutations.
func Corpus(seed uint64, n int) []Case {
	r := rand.New(rand.NewPCG(seed, seed^0x5eed))
	out := make([]Case, n)
	for i := range out {
		g := gen{r: r, dual: r.IntN(100) < 35}
		m := g.config()
		mut := ""
		if r.IntN(3) == 0 {
			mut = Mutations[r.IntN(len(Mutations))]
			g.mutate(m, mut)
		}
		b, err := json.Marshal(g.keys(m))
		if err != nil {
			panic(err)
		}
		out[i] = Case{Name: fmt.Sprintf("c%04d", i), JSON: string(b), DualStack: g.dual, Mutation: mut}
	}
	return out
}

type gen struct {
	r    *rand.Rand
	dual bool
}

func (g gen) pct(p int) bool { return g.r.IntN(100) < p }

func (g gen) port() int {
	switch g.r.IntN(6) {
	case 0:
		return 1
	case 1:
		return 65535
	default:
		return 1 + g.r.IntN(65535)
	}
}

func (g gen) uid() string {
	switch g.r.IntN(6) {
	case 0:
		return "0"
	case 1:
		return strconv.FormatUint(uint64(1+g.r.Uint32N(4294967294)), 10)
	default:
		return strconv.Itoa(1 + g.r.IntN(65535))
	}
}

func (g gen) portSpec() string {
	if g.pct(30) {
		a := 1 + g.r.IntN(65534)
		b := a + 1 + g.r.IntN(65535-a)
		return fmt.Sprintf("%d:%d", a, b)
	}
	return strconv.Itoa(g.port())
}

func (g gen) addr(v6 bool) netip.Addr {
	if v6 {
		var b [16]byte
		for i := range b {
			b[i] = byte(g.r.IntN(256))
		}
		if g.pct(50) {
			b[0], b[1] = 0xfd, byte(g.r.IntN(256))
		}
		a := netip.AddrFrom16(b)
		if a.Is4In6() {
			b[0] = 0x20
			a = netip.AddrFrom16(b)
		}
		return a
	}
	var b [4]byte
	for i := range b {
		b[i] = byte(g.r.IntN(256))
	}
	return netip.AddrFrom4(b)
}

func (g gen) cidr(v6 bool) string {
	a := g.addr(v6)
	if g.pct(25) {
		return a.String()
	}
	return fmt.Sprintf("%s/%d", a, g.r.IntN(a.BitLen()+1))
}

func (g gen) dnsIP() string {
	if g.dual {
		return []string{"::1", "fd00::53", g.addr(true).String()}[g.r.IntN(3)]
	}
	return []string{"127.0.0.1", "10.96.0.10", g.addr(false).String()}[g.r.IntN(3)]
}

// list returns nil (key absent), the JSON null, an empty list, or 1 to 8
// entries (sometimes 40).
func (g gen) list(entry func() string) any {
	switch k := g.r.IntN(10); {
	case k == 0:
		return nil
	case k == 1:
		return json.RawMessage("null")
	case k == 2:
		return []string{}
	default:
		n := 1 + g.r.IntN(8)
		if g.pct(5) {
			n = 40
		}
		l := make([]string, n)
		for i := range l {
			l[i] = entry()
		}
		return l
	}
}

func (g gen) config() map[string]any {
	m := map[string]any{
		"ProxyUserID":      g.uid(),
		"ProxyInboundPort": g.port(),
	}
	if g.pct(60) {
		m["ProxyOutboundPort"] = g.port()
	} else if g.pct(50) {
		m["ProxyOutboundPort"] = 0
	}
	switch g.r.IntN(4) {
	case 1:
		m["ConsulDNSIP"] = g.dnsIP()
	case 2:
		m["ConsulDNSPort"] = g.port()
	case 3:
		m["ConsulDNSIP"], m["ConsulDNSPort"] = g.dnsIP(), g.port()
	}
	m["ExcludeInboundPorts"] = g.list(g.portSpec)
	m["ExcludeOutboundPorts"] = g.list(g.portSpec)
	m["ExcludeUIDs"] = g.list(g.uid)
	m["ExcludeOutboundCIDRs"] = g.list(func() string { return g.cidr(g.dual && g.pct(50)) })
	if g.pct(10) {
		m["NetNS"] = "/var/run/netns/cni-" + strconv.Itoa(g.r.IntN(1000))
	}
	if g.pct(10) {
		m["IptablesProvider"] = json.RawMessage("null")
	}
	for k, v := range m {
		if v == nil {
			delete(m, k)
		}
	}
	return m
}

// keys writes some keys in another letter case (encoding/json matches
// fields case-insensitively, in the SDK as in the plugin).
func (g gen) keys(m map[string]any) map[string]any {
	if !g.pct(10) {
		return m
	}
	out := map[string]any{}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		v := m[k]
		if g.pct(50) {
			k = strings.ToLower(k)
		}
		out[k] = v
	}
	return out
}

// setEntry puts v into a random position of the list field (making the
// list when it has none).
func (g gen) setEntry(m map[string]any, field, v string) {
	l, _ := m[field].([]string)
	if len(l) == 0 {
		m[field] = []string{v}
		return
	}
	l = append([]string(nil), l...)
	l[g.r.IntN(len(l))] = v
	m[field] = l
}

func (g gen) portField() string {
	return []string{"ExcludeInboundPorts", "ExcludeOutboundPorts"}[g.r.IntN(2)]
}

func (g gen) mutate(m map[string]any, mut string) {
	switch mut {
	case "no-proxy-uid":
		delete(m, "ProxyUserID")
	case "no-inbound-port":
		delete(m, "ProxyInboundPort")
	case "uid-not-numeric":
		m["ProxyUserID"] = "5995;x"
	case "uid-name":
		g.setEntry(m, "ExcludeUIDs", "root")
	case "uid-too-big":
		g.setEntry(m, "ExcludeUIDs", "4294967296")
	case "uid-negative":
		m["ProxyUserID"] = "-1"
	case "port-zero":
		g.setEntry(m, g.portField(), "0")
	case "port-too-big":
		g.setEntry(m, g.portField(), "65536")
	case "range-reversed":
		g.setEntry(m, g.portField(), "9000:8000")
	case "range-equal":
		g.setEntry(m, g.portField(), "8080:8080")
	case "range-open":
		g.setEntry(m, g.portField(), "1024:")
	case "port-service-name":
		g.setEntry(m, g.portField(), "ssh")
	case "port-space":
		g.setEntry(m, g.portField(), " 8080")
	case "port-injection":
		g.setEntry(m, g.portField(), "80 -j ACCEPT")
	default:
		g.mutateAddr(m, mut)
	}
}

func (g gen) mutateAddr(m map[string]any, mut string) {
	switch mut {
	case "cidr-bad-prefix":
		g.setEntry(m, "ExcludeOutboundCIDRs", "10.0.0.0/33")
	case "cidr-garbage":
		g.setEntry(m, "ExcludeOutboundCIDRs", "10.0.0.0/8,10.1.0.0/16")
	case "cidr-wrong-family":
		if !g.dual {
			g.setEntry(m, "ExcludeOutboundCIDRs", "fd00::/8")
		} else {
			g.setEntry(m, "ExcludeOutboundCIDRs", "::ffff:10.0.0.0/104")
		}
	case "dns-ip-wrong-family":
		if g.dual {
			m["ConsulDNSIP"] = "10.96.0.10"
		} else {
			m["ConsulDNSIP"] = "fd00::53"
		}
	case "dns-ip-garbage":
		m["ConsulDNSIP"] = "127.0.0.1 -j ACCEPT"
	case "dns-port-negative":
		m["ConsulDNSPort"] = -1
	case "inbound-port-too-big":
		m["ProxyInboundPort"] = 70000
	case "outbound-port-too-big":
		m["ProxyOutboundPort"] = 65536
	case "uid-as-number":
		m["ProxyUserID"] = 5995
	case "list-not-array":
		m["ExcludeUIDs"] = "5996"
	default:
		panic("sdkoracle: unknown mutation " + mut)
	}
}
