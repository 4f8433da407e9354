package nftables

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
)

// term is one part of a rule: its text and the expressions nft compiles it
// to (the same expressions, registers and data layout, so the kernel lists
// the rule exactly as it lists the SDK's).
type term struct {
	text  string
	exprs []expr.Any
}

type proto uint8

const (
	protoTCP proto = unix.IPPROTO_TCP
	protoUDP proto = unix.IPPROTO_UDP
)

func (p proto) String() string {
	if p == protoUDP {
		return "udp"
	}
	return "tcp"
}

func be16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }

func cmpEq(data []byte) *expr.Cmp { return &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: data} }

// nfprotoIs matches the packet's family: "meta nfproto ipv6".
func nfprotoIs(f redirect.Family) term {
	return term{"meta nfproto " + f.String(), nfprotoExprs(f)}
}

func nfprotoExprs(f redirect.Family) []expr.Any {
	v := byte(unix.NFPROTO_IPV4)
	if f == redirect.IPv6 {
		v = unix.NFPROTO_IPV6
	}
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, cmpEq([]byte{v})}
}

// l4proto is "meta l4proto tcp".
func l4proto(p proto) term {
	return term{"meta l4proto " + p.String(), l4protoExprs(p)}
}

func l4protoExprs(p proto) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, cmpEq([]byte{byte(p)})}
}

// dport is "tcp dport 80" or "tcp dport 80-90" (nft compiles a range into
// two comparisons, gte and lte).
func dport(p proto, r annotations.PortRange) term {
	exprs := append(l4protoExprs(p),
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2})
	text := p.String() + " dport " + strconv.Itoa(int(r.First))
	if r.First == r.Last {
		exprs = append(exprs, cmpEq(be16(r.First)))
	} else {
		text += "-" + strconv.Itoa(int(r.Last))
		exprs = append(exprs,
			&expr.Cmp{Op: expr.CmpOpGte, Register: 1, Data: be16(r.First)},
			&expr.Cmp{Op: expr.CmpOpLte, Register: 1, Data: be16(r.Last)})
	}
	return term{text, exprs}
}

// daddr is "ip daddr 10.0.0.0/8" or "ip6 daddr ::1". As nft does, a prefix
// on a byte boundary loads only its bytes; any other prefix (also /0) loads
// the whole address and masks it.
func daddr(p netip.Prefix) term {
	fam, kw, off := redirect.IPv4, "ip", uint32(16)
	if !p.Addr().Is4() {
		fam, kw, off = redirect.IPv6, "ip6", 24
	}
	addr := p.Addr().AsSlice()
	bits := p.Bits()
	text := kw + " daddr " + p.Addr().String()
	if bits != len(addr)*8 {
		text = kw + " daddr " + p.String()
	}
	exprs := nfprotoExprs(fam)
	if bits > 0 && bits%8 == 0 {
		n := bits / 8
		exprs = append(exprs,
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: uint32(n)},
			cmpEq(addr[:n]))
		return term{text, exprs}
	}
	mask := make([]byte, len(addr))
	for i := 0; i < bits; i++ {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	exprs = append(exprs,
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: uint32(len(addr))},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: uint32(len(addr)), Mask: mask, Xor: make([]byte, len(addr))},
		cmpEq(addr))
	return term{text, exprs}
}

// skuid is "meta skuid 5995" (the UID in host byte order).
func skuid(uid uint32) term {
	return term{"meta skuid " + strconv.FormatUint(uint64(uid), 10), []expr.Any{
		&expr.Meta{Key: expr.MetaKeySKUID, Register: 1},
		cmpEq(binary.NativeEndian.AppendUint32(nil, uid)),
	}}
}

func verdictReturn() term {
	return term{"return", []expr.Any{&expr.Verdict{Kind: expr.VerdictReturn}}}
}

func jump(chain string) term {
	return term{"jump " + chain, []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: chain}}}
}

// redirectTo is "redirect to :15001".
func redirectTo(port uint16) term {
	return term{"redirect to :" + strconv.Itoa(int(port)), []expr.Any{
		&expr.Immediate{Register: 1, Data: be16(port)},
		&expr.Redir{RegisterProtoMin: 1, Flags: unix.NF_NAT_RANGE_PROTO_SPECIFIED},
	}}
}

// dnat is "dnat ip to 10.0.0.1", or with a port "dnat ip to 10.0.0.1:8600"
// ("dnat ip6 to [::1]:8600").
func dnat(ip netip.Addr, port uint16) term {
	kw, fam := "ip", uint32(unix.NFPROTO_IPV4)
	if !ip.Is4() {
		kw, fam = "ip6", unix.NFPROTO_IPV6
	}
	n := &expr.NAT{Type: expr.NATTypeDestNAT, Family: fam, RegAddrMin: 1}
	exprs := []expr.Any{&expr.Immediate{Register: 1, Data: ip.AsSlice()}}
	text := "dnat " + kw + " to " + ip.String()
	if port != 0 {
		n.RegProtoMin, n.Specified = 2, true
		exprs = append(exprs, &expr.Immediate{Register: 2, Data: be16(port)})
		text = "dnat " + kw + " to " + netip.AddrPortFrom(ip, port).String()
	}
	return term{text, append(exprs, n)}
}

// exprString renders one expression in a stable form for comparisons and
// messages, close to `nft --debug=netlink`.
func exprString(e expr.Any) string {
	switch e := e.(type) {
	case *expr.Meta:
		return fmt.Sprintf("meta load %d => reg %d", e.Key, e.Register)
	case *expr.Cmp:
		return fmt.Sprintf("cmp %d reg %d %x", e.Op, e.Register, e.Data)
	case *expr.Payload:
		return fmt.Sprintf("payload load %db @ %d + %d => reg %d", e.Len, e.Base, e.Offset, e.DestRegister)
	case *expr.Bitwise:
		return fmt.Sprintf("bitwise reg %d = (reg %d & %x) ^ %x len %d", e.DestRegister, e.SourceRegister, e.Mask, e.Xor, e.Len)
	case *expr.Verdict:
		return fmt.Sprintf("verdict %d %s", e.Kind, e.Chain)
	case *expr.Immediate:
		return fmt.Sprintf("immediate reg %d %x", e.Register, e.Data)
	case *expr.Redir:
		// The kernel reports a max register equal to the min one when only
		// the min was given.
		return fmt.Sprintf("redir proto reg %d-%d flags %#x", e.RegisterProtoMin, orMin(e.RegisterProtoMax, e.RegisterProtoMin), e.Flags)
	case *expr.NAT:
		return fmt.Sprintf("nat %d family %d addr reg %d-%d proto reg %d-%d flags %v,%v,%v,%v,%v", e.Type, e.Family,
			e.RegAddrMin, orMin(e.RegAddrMax, e.RegAddrMin), e.RegProtoMin, orMin(e.RegProtoMax, e.RegProtoMin),
			e.Random, e.FullyRandom, e.Persistent, e.Prefix, e.Specified)
	}
	return fmt.Sprintf("%T%+v", e, e)
}

func orMin(max, min uint32) uint32 {
	if max == 0 {
		return min
	}
	return max
}

// ruleString renders a rule's expressions, one exprString per expression.
func ruleString(exprs []expr.Any) string {
	parts := make([]string, len(exprs))
	for i, e := range exprs {
		parts[i] = "[" + exprString(e) + "]"
	}
	return strings.Join(parts, " ")
}
