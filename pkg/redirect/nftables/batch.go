package nftables

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
)

// The hot path of a first ADD speaks netlink itself rather than through
// google/nftables' Conn, whose batches ask the kernel to acknowledge every
// message and to echo every rule back (two receives per rule). Here a
// namespace gets one netlink socket, one dump (the chains of every family,
// for the iptables leftovers) and one batch in which only the last message
// asks for an acknowledgement: the kernel reports an error for any message
// that fails and for a failed commit (on the batch's first message) before
// that acknowledgement, so reading up to it says whether the transaction
// was committed. The expressions are encoded by google/nftables' expr
// package, as the Conn would.

const (
	nfprotoIPv4 = unix.NFPROTO_IPV4
	nfprotoIPv6 = unix.NFPROTO_IPV6
	nfprotoINet = unix.NFPROTO_INET
)

// rawConn is a netlink socket to nf_tables bound to a namespace.
type rawConn struct{ c *netlink.Conn }

// dialRaw opens the socket inside the namespace at nsPath and says whether
// the namespace has an x_tables nat table (see IptablesRules).
func dialRaw(nsPath string) (rc *rawConn, legacyNat bool, err error) {
	err = enter(nsPath, func() error {
		c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
		if err != nil {
			return fmt.Errorf("netns %s: netlink: %w", nsPath, err)
		}
		rc = &rawConn{c: c}
		legacyNat = hasNatTable()
		return nil
	})
	if err != nil && rc != nil {
		_ = rc.c.Close()
		rc = nil
	}
	return rc, legacyNat, err
}

func (rc *rawConn) close() { _ = rc.c.Close() }

func msgType(t int) netlink.HeaderType {
	return netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | t)
}

// nfgen is the nfgenmsg header that starts every nf_tables message.
func nfgen(family uint8, resID uint16) []byte {
	return []byte{family, unix.NFNETLINK_V0, byte(resID >> 8), byte(resID)}
}

// iptablesChains dumps the chains of every family in one request and
// reports whether an ip or ip6 table "nat" (iptables-nft) holds one of
// redirect.Chains.
func (rc *rawConn) iptablesChains() (bool, error) {
	msgs, err := rc.c.Execute(netlink.Message{
		Header: netlink.Header{Type: msgType(unix.NFT_MSG_GETCHAIN), Flags: netlink.Request | netlink.Dump},
		Data:   nfgen(unix.NFPROTO_UNSPEC, 0),
	})
	if err != nil {
		return false, fmt.Errorf("listing chains: %w", err)
	}
	for _, m := range msgs {
		if len(m.Data) < 4 || (m.Data[0] != nfprotoIPv4 && m.Data[0] != nfprotoIPv6) {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return false, fmt.Errorf("listing chains: %w", err)
		}
		var tbl, name string
		for ad.Next() {
			switch ad.Type() {
			case unix.NFTA_CHAIN_TABLE:
				tbl = ad.String()
			case unix.NFTA_CHAIN_NAME:
				name = ad.String()
			}
		}
		if err := ad.Err(); err != nil {
			return false, fmt.Errorf("listing chains: %w", err)
		}
		if tbl == redirect.Table && redirect.IsOurChain(name) {
			return true, nil
		}
	}
	return false, nil
}

// create sends the transaction that creates the table exclusively with
// all its chains and rules. It fails with an error wrapping unix.EEXIST
// when the table exists already; the kernel applies all of it or nothing.
func (rc *rawConn) create(t Table) error {
	msgs, err := createMessages(t)
	if err != nil {
		return err
	}
	sent, err := rc.c.SendMessages(msgs)
	if err != nil {
		return err
	}
	last := sent[len(sent)-2].Header.Sequence // the last before BATCH_END
	for {
		replies, err := rc.c.Receive()
		if err != nil {
			return err // an error message (per message or for the commit)
		}
		for _, m := range replies {
			if m.Header.Type == netlink.Error && m.Header.Sequence == last {
				return nil
			}
		}
	}
}

// createMessages encodes the batch: begin, the table (exclusive create),
// the chains, the rules (appended in order), end. Only the last message
// before the end asks for an acknowledgement.
func createMessages(t Table) ([]netlink.Message, error) {
	msgs := []netlink.Message{{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_MSG_BATCH_BEGIN), Flags: netlink.Request},
		Data:   nfgen(unix.NFPROTO_UNSPEC, unix.NFNL_SUBSYS_NFTABLES),
	}}
	add := func(typ int, flags netlink.HeaderFlags, enc func(ae *netlink.AttributeEncoder) error) error {
		ae := netlink.NewAttributeEncoder()
		ae.ByteOrder = binary.BigEndian
		if err := enc(ae); err != nil {
			return err
		}
		b, err := ae.Encode()
		if err != nil {
			return err
		}
		msgs = append(msgs, netlink.Message{
			Header: netlink.Header{Type: msgType(typ), Flags: netlink.Request | flags},
			Data:   append(nfgen(nfprotoINet, 0), b...),
		})
		return nil
	}
	err := add(unix.NFT_MSG_NEWTABLE, netlink.Create|netlink.Excl, func(ae *netlink.AttributeEncoder) error {
		ae.String(unix.NFTA_TABLE_NAME, TableName)
		ae.Uint32(unix.NFTA_TABLE_FLAGS, 0)
		return nil
	})
	for _, ch := range t.Chains {
		if err != nil {
			break
		}
		err = add(unix.NFT_MSG_NEWCHAIN, netlink.Create, func(ae *netlink.AttributeEncoder) error {
			return encodeChain(ae, ch)
		})
	}
	for _, r := range t.Rules {
		if err != nil {
			break
		}
		err = add(unix.NFT_MSG_NEWRULE, netlink.Create|netlink.Append, func(ae *netlink.AttributeEncoder) error {
			return encodeRule(ae, r)
		})
	}
	if err != nil {
		return nil, fmt.Errorf("encoding table inet %s: %w", TableName, err)
	}
	msgs[len(msgs)-1].Header.Flags |= netlink.Acknowledge
	return append(msgs, netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_MSG_BATCH_END), Flags: netlink.Request},
		Data:   nfgen(unix.NFPROTO_UNSPEC, unix.NFNL_SUBSYS_NFTABLES),
	}), nil
}

func encodeChain(ae *netlink.AttributeEncoder, ch Chain) error {
	ae.String(unix.NFTA_CHAIN_TABLE, TableName)
	ae.String(unix.NFTA_CHAIN_NAME, ch.Name)
	if ch.Hook == nil {
		return nil
	}
	hook, ok := hooks[ch.Hook.Hook]
	if !ok {
		return fmt.Errorf("chain %s: unknown hook %q", ch.Name, ch.Hook.Hook)
	}
	ae.Nested(unix.NFTA_CHAIN_HOOK, func(nae *netlink.AttributeEncoder) error {
		nae.Uint32(unix.NFTA_HOOK_HOOKNUM, uint32(*hook))
		nae.Uint32(unix.NFTA_HOOK_PRIORITY, uint32(ch.Hook.Priority))
		return nil
	})
	ae.String(unix.NFTA_CHAIN_TYPE, ch.Hook.Type)
	return nil
}

func encodeRule(ae *netlink.AttributeEncoder, r Rule) error {
	ae.String(unix.NFTA_RULE_TABLE, TableName)
	ae.String(unix.NFTA_RULE_CHAIN, r.Chain)
	ae.Nested(unix.NFTA_RULE_EXPRESSIONS, func(nae *netlink.AttributeEncoder) error {
		for _, e := range r.Exprs {
			switch e.(type) {
			case *expr.Match, *expr.Target:
				// x_tables expressions need NFTA_RULE_COMPAT, which
				// this encoder does not write.
				return fmt.Errorf("chain %s: rule %q: x_tables expression %T", r.Chain, r.Text, e)
			}
			b, merr := expr.Marshal(nfprotoINet, e)
			if merr != nil {
				return fmt.Errorf("chain %s: rule %q: %w", r.Chain, r.Text, merr)
			}
			nae.Bytes(unix.NLA_F_NESTED|unix.NFTA_LIST_ELEM, b)
		}
		return nil
	})
	return nil
}

// errExists reports whether err says the table exists already.
func errExists(err error) bool { return errors.Is(err, unix.EEXIST) }
