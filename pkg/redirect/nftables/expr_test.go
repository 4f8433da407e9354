package nftables

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/nftables/expr"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
)

// nftDebug renders expressions the way `nft --debug=netlink` prints them
// (data as 32-bit words in host order), so the cases below are nft's own
// output for the same statements, pasted as nft 1.0 printed it.
func nftDebug(exprs []expr.Any) string {
	words := func(b []byte) string {
		var out []string
		for i := 0; i < len(b); i += 4 {
			var w uint32
			for j := 3; j >= 0; j-- {
				w <<= 8
				if i+j < len(b) {
					w |= uint32(b[i+j])
				}
			}
			out = append(out, fmt.Sprintf("0x%08x", w))
		}
		return strings.Join(out, " ")
	}
	metaKeys := map[expr.MetaKey]string{expr.MetaKeyNFPROTO: "nfproto", expr.MetaKeyL4PROTO: "l4proto", expr.MetaKeySKUID: "skuid"}
	ops := map[expr.CmpOp]string{expr.CmpOpEq: "eq", expr.CmpOpGte: "gte", expr.CmpOpLte: "lte"}
	bases := map[expr.PayloadBase]string{expr.PayloadBaseNetworkHeader: "network", expr.PayloadBaseTransportHeader: "transport"}
	var lines []string
	for _, e := range exprs {
		switch e := e.(type) {
		case *expr.Meta:
			lines = append(lines, fmt.Sprintf("[ meta load %s => reg %d ]", metaKeys[e.Key], e.Register))
		case *expr.Cmp:
			lines = append(lines, fmt.Sprintf("[ cmp %s reg %d %s ]", ops[e.Op], e.Register, words(e.Data)))
		case *expr.Payload:
			lines = append(lines, fmt.Sprintf("[ payload load %db @ %s header + %d => reg %d ]", e.Len, bases[e.Base], e.Offset, e.DestRegister))
		case *expr.Bitwise:
			lines = append(lines, fmt.Sprintf("[ bitwise reg %d = ( reg %d & %s ) ^ %s ]", e.DestRegister, e.SourceRegister, words(e.Mask), words(e.Xor)))
		case *expr.Verdict:
			if e.Kind == expr.VerdictJump {
				lines = append(lines, "[ immediate reg 0 jump -> "+e.Chain+" ]")
			} else {
				lines = append(lines, "[ immediate reg 0 return ]")
			}
		case *expr.Immediate:
			lines = append(lines, fmt.Sprintf("[ immediate reg %d %s ]", e.Register, words(e.Data)))
		case *expr.Redir:
			lines = append(lines, fmt.Sprintf("[ redir proto_min reg %d flags 0x%x ]", e.RegisterProtoMin, e.Flags))
		case *expr.NAT:
			fam := map[uint32]string{2: "ip", 10: "ip6"}[e.Family]
			s := fmt.Sprintf("[ nat dnat %s addr_min reg %d", fam, e.RegAddrMin)
			if e.RegProtoMin != 0 {
				s += fmt.Sprintf(" proto_min reg %d flags 0x2", e.RegProtoMin)
			}
			lines = append(lines, s+" ]")
		default:
			lines = append(lines, fmt.Sprintf("%T", e))
		}
	}
	return strings.Join(lines, "\n")
}

func rule(terms ...term) []expr.Any {
	var out []expr.Any
	for _, t := range terms {
		out = append(out, t.exprs...)
	}
	return out
}

// TestExpressionsAsNftCompilesThem pins the expressions of each statement
// to what `nft --debug=netlink` printed for it on a real kernel.
func TestExpressionsAsNftCompilesThem(t *testing.T) {
	p := netip.MustParsePrefix
	for _, tc := range []struct {
		exprs []expr.Any
		want  string
	}{
		{rule(nfprotoIs(6), verdictReturn()), "[ meta load nfproto => reg 1 ]\n[ cmp eq reg 1 0x0000000a ]\n[ immediate reg 0 return ]"},
		{rule(l4proto(protoTCP), redirectTo(15001)), "[ meta load l4proto => reg 1 ]\n[ cmp eq reg 1 0x00000006 ]\n" +
			"[ immediate reg 1 0x0000993a ]\n[ redir proto_min reg 1 flags 0x2 ]"},
		{rule(dport(protoUDP, annotations.PortRange{First: 53, Last: 53}), dnat(netip.MustParseAddr("10.0.0.1"), 0)),
			"[ meta load l4proto => reg 1 ]\n[ cmp eq reg 1 0x00000011 ]\n[ payload load 2b @ transport header + 2 => reg 1 ]\n" +
				"[ cmp eq reg 1 0x00003500 ]\n[ immediate reg 1 0x0100000a ]\n[ nat dnat ip addr_min reg 1 ]"},
		{rule(daddr(p("::1/128")), dport(protoTCP, annotations.PortRange{First: 53, Last: 53}), dnat(netip.MustParseAddr("::1"), 8600)),
			"[ meta load nfproto => reg 1 ]\n[ cmp eq reg 1 0x0000000a ]\n[ payload load 16b @ network header + 24 => reg 1 ]\n" +
				"[ cmp eq reg 1 0x00000000 0x00000000 0x00000000 0x01000000 ]\n[ meta load l4proto => reg 1 ]\n[ cmp eq reg 1 0x00000006 ]\n" +
				"[ payload load 2b @ transport header + 2 => reg 1 ]\n[ cmp eq reg 1 0x00003500 ]\n" +
				"[ immediate reg 1 0x00000000 0x00000000 0x00000000 0x01000000 ]\n[ immediate reg 2 0x00009821 ]\n" +
				"[ nat dnat ip6 addr_min reg 1 proto_min reg 2 flags 0x2 ]"},
		{rule(skuid(5995), verdictReturn()), "[ meta load skuid => reg 1 ]\n[ cmp eq reg 1 0x0000176b ]\n[ immediate reg 0 return ]"},
		{rule(dport(protoTCP, annotations.PortRange{First: 8080, Last: 9000}), verdictReturn()),
			"[ meta load l4proto => reg 1 ]\n[ cmp eq reg 1 0x00000006 ]\n[ payload load 2b @ transport header + 2 => reg 1 ]\n" +
				"[ cmp gte reg 1 0x0000901f ]\n[ cmp lte reg 1 0x00002823 ]\n[ immediate reg 0 return ]"},
		{rule(daddr(p("10.0.0.0/8")), verdictReturn()), "[ meta load nfproto => reg 1 ]\n[ cmp eq reg 1 0x00000002 ]\n" +
			"[ payload load 1b @ network header + 16 => reg 1 ]\n[ cmp eq reg 1 0x0000000a ]\n[ immediate reg 0 return ]"},
		{rule(daddr(p("10.16.0.0/12")), verdictReturn()), "[ meta load nfproto => reg 1 ]\n[ cmp eq reg 1 0x00000002 ]\n" +
			"[ payload load 4b @ network header + 16 => reg 1 ]\n[ bitwise reg 1 = ( reg 1 & 0x0000f0ff ) ^ 0x00000000 ]\n" +
			"[ cmp eq reg 1 0x0000100a ]\n[ immediate reg 0 return ]"},
		{rule(daddr(p("0.0.0.0/0")), verdictReturn()), "[ meta load nfproto => reg 1 ]\n[ cmp eq reg 1 0x00000002 ]\n" +
			"[ payload load 4b @ network header + 16 => reg 1 ]\n[ bitwise reg 1 = ( reg 1 & 0x00000000 ) ^ 0x00000000 ]\n" +
			"[ cmp eq reg 1 0x00000000 ]\n[ immediate reg 0 return ]"},
		{rule(daddr(p("fd00::/64")), verdictReturn()), "[ meta load nfproto => reg 1 ]\n[ cmp eq reg 1 0x0000000a ]\n" +
			"[ payload load 8b @ network header + 24 => reg 1 ]\n[ cmp eq reg 1 0x000000fd 0x00000000 ]\n[ immediate reg 0 return ]"},
		{rule(daddr(p("fd00::/65")), verdictReturn()), "[ meta load nfproto => reg 1 ]\n[ cmp eq reg 1 0x0000000a ]\n" +
			"[ payload load 16b @ network header + 24 => reg 1 ]\n" +
			"[ bitwise reg 1 = ( reg 1 & 0xffffffff 0xffffffff 0x00000080 0x00000000 ) ^ 0x00000000 0x00000000 0x00000000 0x00000000 ]\n" +
			"[ cmp eq reg 1 0x000000fd 0x00000000 0x00000000 0x00000000 ]\n[ immediate reg 0 return ]"},
		{rule(l4proto(protoTCP), jump("CONSUL_PROXY_OUTPUT")), "[ meta load l4proto => reg 1 ]\n[ cmp eq reg 1 0x00000006 ]\n" +
			"[ immediate reg 0 jump -> CONSUL_PROXY_OUTPUT ]"},
	} {
		if got := nftDebug(tc.exprs); got != tc.want {
			t.Errorf("got\n%s\nwant\n%s", got, tc.want)
		}
	}
}
