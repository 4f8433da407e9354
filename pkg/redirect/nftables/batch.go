package nftables

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
)

// The hot path of a first ADD speaks netlink itself rather than through
// google/nftables' Conn, whose batches ask the kernel to acknowledge every
// message and to echo every rule back (two receives per rule), over a
// socket registered with the runtime's poller. Here a namespace gets one
// plain socket, one dump (the chains of every family, for the iptables
// leftovers) and one batch in which only the last message asks for an
// acknowledgement: the kernel reports an error for any message that fails
// and for a failed commit (on the batch's first message) before that
// acknowledgement, so reading up to it says whether the transaction was
// committed. The expressions are encoded by google/nftables' expr package,
// as the Conn would; Check reads the result back through the Conn.

const (
	nfprotoIPv4 = unix.NFPROTO_IPV4
	nfprotoIPv6 = unix.NFPROTO_IPV6
	nfprotoINet = unix.NFPROTO_INET
)

// rawTimeout bounds each wait for the kernel's answer when the caller's
// context has no deadline.
const rawTimeout = 30 * time.Second

// rawConn is a netlink socket to nf_tables bound to a namespace: a plain
// blocking socket (no poller registration, no goroutine handoff; the kernel
// has queued its answer by the time send returns), with a receive timeout
// from the caller's deadline.
type rawConn struct {
	fd  int
	seq uint32
	buf []byte
}

// dialRaw opens the socket inside the namespace at nsPath and, with
// lookNat, says whether the namespace has an x_tables nat table (see
// FindIptablesRules).
func dialRaw(ctx context.Context, nsPath string, lookNat bool) (rc *rawConn, legacyNat bool, err error) {
	err = enter(nsPath, func() error {
		fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
		if err != nil {
			return fmt.Errorf("netns %s: netlink socket: %w", nsPath, err)
		}
		rc = &rawConn{fd: fd}
		legacyNat = lookNat && hasNatTable()
		return nil
	})
	if err == nil {
		wait := rawTimeout
		if d, ok := ctx.Deadline(); ok {
			wait = max(time.Until(d), time.Millisecond)
		}
		tv := unix.NsecToTimeval(wait.Nanoseconds())
		if serr := unix.SetsockoptTimeval(rc.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); serr != nil {
			err = fmt.Errorf("netns %s: netlink socket timeout: %w", nsPath, serr)
		}
	}
	if err != nil && rc != nil {
		rc.close()
		rc = nil
	}
	return rc, legacyNat, err
}

func (rc *rawConn) close() { _ = unix.Close(rc.fd) }

// send writes the messages as one datagram and returns the sequence
// number of the first.
func (rc *rawConn) send(msgs []message) (uint32, error) {
	first := rc.seq + 1
	var b []byte
	for _, m := range msgs {
		rc.seq++
		b = binary.NativeEndian.AppendUint32(b, uint32(unix.SizeofNlMsghdr+len(m.data)))
		b = binary.NativeEndian.AppendUint16(b, m.typ)
		b = binary.NativeEndian.AppendUint16(b, m.flags)
		b = binary.NativeEndian.AppendUint32(b, rc.seq)
		b = binary.NativeEndian.AppendUint32(b, 0)
		b = append(b, m.data...)
		for len(b)%unix.NLMSG_ALIGNTO != 0 {
			b = append(b, 0)
		}
	}
	if err := unix.Sendto(rc.fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, fmt.Errorf("netlink send: %w", err)
	}
	return first, nil
}

// receive reads one datagram and calls fn for each message in it; fn says
// whether the answer is complete.
func (rc *rawConn) receive(fn func(m syscall.NetlinkMessage) (done bool, err error)) error {
	if rc.buf == nil {
		rc.buf = make([]byte, 64<<10)
	}
	for {
		n, _, flags, _, err := unix.Recvmsg(rc.fd, rc.buf, nil, 0)
		if err != nil {
			return fmt.Errorf("netlink receive: %w", err)
		}
		if flags&unix.MSG_TRUNC != 0 {
			return errors.New("netlink receive: message truncated")
		}
		msgs, err := syscall.ParseNetlinkMessage(rc.buf[:n])
		if err != nil {
			return fmt.Errorf("netlink receive: %w", err)
		}
		for _, m := range msgs {
			if done, err := fn(m); done || err != nil {
				return err
			}
		}
	}
}

// errnoOf returns the error code of an NLMSG_ERROR message (0: an
// acknowledgement).
func errnoOf(m syscall.NetlinkMessage) unix.Errno {
	if len(m.Data) < 4 {
		return unix.EBADMSG
	}
	return unix.Errno(-int32(binary.NativeEndian.Uint32(m.Data[:4])))
}

// message is one nfnetlink message before its header is written.
type message struct {
	typ, flags uint16
	data       []byte
}

// describe names the part of t that message i of its batch
// (tableMessages) carries; lead is the number of table messages.
func describe(t Table, i, lead int) string {
	switch {
	case i == 0:
		return "the transaction"
	case i <= lead:
		return "table inet " + TableName
	case i-1-lead < len(t.Chains):
		return "chain " + t.Chains[i-1-lead].Name
	case i-1-lead-len(t.Chains) < len(t.Rules):
		r := t.Rules[i-1-lead-len(t.Chains)]
		return "rule in " + r.Chain + ": " + r.Text
	}
	return fmt.Sprintf("message %d", i)
}

func msgType(t int) uint16 { return uint16(unix.NFNL_SUBSYS_NFTABLES<<8 | t) }

// nfgen is the nfgenmsg header that starts every nf_tables message.
func nfgen(family uint8, resID uint16) []byte {
	return []byte{family, unix.NFNETLINK_V0, byte(resID >> 8), byte(resID)}
}

// iptablesChains dumps the chains of every family in one request and
// reports whether an ip or ip6 table "nat" (iptables-nft) holds one of
// redirect.Chains.
func (rc *rawConn) iptablesChains() (bool, error) {
	seq, err := rc.send([]message{{typ: msgType(unix.NFT_MSG_GETCHAIN), flags: unix.NLM_F_REQUEST | unix.NLM_F_DUMP,
		data: nfgen(unix.NFPROTO_UNSPEC, 0)}})
	if err != nil {
		return false, fmt.Errorf("listing chains: %w", err)
	}
	found := false
	err = rc.receive(func(m syscall.NetlinkMessage) (bool, error) {
		switch {
		case m.Header.Seq != seq:
			return false, nil
		case m.Header.Type == unix.NLMSG_DONE:
			return true, nil
		case m.Header.Type == unix.NLMSG_ERROR:
			return true, errnoOf(m)
		case len(m.Data) < 4 || (m.Data[0] != nfprotoIPv4 && m.Data[0] != nfprotoIPv6):
			return false, nil
		}
		tbl, name, err := chainNames(m.Data[4:])
		found = found || (tbl == redirect.Table && redirect.IsOurChain(name))
		return false, err
	})
	if err != nil {
		return false, fmt.Errorf("listing chains: %w", err)
	}
	return found, nil
}

func chainNames(b []byte) (tbl, name string, err error) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return "", "", err
	}
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_CHAIN_TABLE:
			tbl = ad.String()
		case unix.NFTA_CHAIN_NAME:
			name = ad.String()
		}
	}
	return tbl, name, ad.Err()
}

// apply sends the transaction that puts t in place with all its chains
// and rules: a create (replace false) makes the table exclusively and
// fails with an error wrapping unix.EEXIST when it exists already; a
// replace is the SDK's transaction (add, delete and add the table, then
// everything in it). The kernel applies all of it or nothing. An error
// names the part of the table the kernel refused.
func (rc *rawConn) apply(t Table, replace bool) error {
	msgs, lead, err := tableMessages(t, replace)
	if err != nil {
		return err
	}
	first, err := rc.send(msgs)
	if err != nil {
		return err
	}
	last := first + uint32(len(msgs)) - 2 // the last before BATCH_END
	return rc.receive(func(m syscall.NetlinkMessage) (bool, error) {
		if m.Header.Type != unix.NLMSG_ERROR || m.Header.Seq < first || m.Header.Seq > last {
			return false, nil
		}
		if errno := errnoOf(m); errno != 0 {
			return true, fmt.Errorf("%s: %w", describe(t, int(m.Header.Seq-first), lead), errno)
		}
		return m.Header.Seq == last, nil
	})
}

// tableMessages encodes the batch: begin, the table messages (lead of
// them), the chains, the rules (appended in order), end. Only the last
// message before the end asks for an acknowledgement: the kernel reports
// an error for any message that fails and for a failed commit before it.
func tableMessages(t Table, replace bool) (msgs []message, lead int, err error) {
	msgs = append(make([]message, 0, len(t.Chains)+len(t.Rules)+5), batch(unix.NFNL_MSG_BATCH_BEGIN))
	add := func(typ int, flags uint16, enc func(ae *netlink.AttributeEncoder) error) error {
		ae := netlink.NewAttributeEncoder()
		ae.ByteOrder = binary.BigEndian
		if err := enc(ae); err != nil {
			return err
		}
		b, err := ae.Encode()
		if err != nil {
			return err
		}
		msgs = append(msgs, message{typ: msgType(typ), flags: unix.NLM_F_REQUEST | flags, data: append(nfgen(nfprotoINet, 0), b...)})
		return nil
	}
	if replace {
		msgs = append(msgs, tableMessage(unix.NFT_MSG_NEWTABLE, unix.NLM_F_CREATE), tableMessage(unix.NFT_MSG_DELTABLE, 0),
			tableMessage(unix.NFT_MSG_NEWTABLE, unix.NLM_F_CREATE))
	} else {
		msgs = append(msgs, tableMessage(unix.NFT_MSG_NEWTABLE, unix.NLM_F_CREATE|unix.NLM_F_EXCL))
	}
	lead = len(msgs) - 1
	for _, ch := range t.Chains {
		if err != nil {
			break
		}
		err = add(unix.NFT_MSG_NEWCHAIN, unix.NLM_F_CREATE, func(ae *netlink.AttributeEncoder) error {
			return encodeChain(ae, ch)
		})
	}
	for _, r := range t.Rules {
		if err != nil {
			break
		}
		err = add(unix.NFT_MSG_NEWRULE, unix.NLM_F_CREATE|unix.NLM_F_APPEND, func(ae *netlink.AttributeEncoder) error {
			return encodeRule(ae, r)
		})
	}
	if err != nil {
		return nil, 0, fmt.Errorf("encoding table inet %s: %w", TableName, err)
	}
	msgs[len(msgs)-1].flags |= unix.NLM_F_ACK
	return append(msgs, batch(unix.NFNL_MSG_BATCH_END)), lead, nil
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

// batch is the message that begins or ends a transaction.
func batch(typ uint16) message {
	return message{typ: typ, flags: unix.NLM_F_REQUEST, data: nfgen(unix.NFPROTO_UNSPEC, unix.NFNL_SUBSYS_NFTABLES)}
}

// tableMessage is a message of type typ naming our table.
func tableMessage(typ int, flags uint16) message {
	ae := netlink.NewAttributeEncoder()
	ae.String(unix.NFTA_TABLE_NAME, TableName)
	b, _ := ae.Encode() // a string attribute always encodes
	return message{typ: msgType(typ), flags: unix.NLM_F_REQUEST | flags, data: append(nfgen(nfprotoINet, 0), b...)}
}

// deleteTable sends a transaction that deletes our table. A missing table
// is not an error.
func (rc *rawConn) deleteTable() error {
	first, err := rc.send([]message{batch(unix.NFNL_MSG_BATCH_BEGIN), tableMessage(unix.NFT_MSG_DELTABLE, unix.NLM_F_ACK),
		batch(unix.NFNL_MSG_BATCH_END)})
	if err != nil {
		return err
	}
	return rc.receive(func(m syscall.NetlinkMessage) (bool, error) {
		if m.Header.Type != unix.NLMSG_ERROR || m.Header.Seq < first || m.Header.Seq > first+1 {
			return false, nil
		}
		switch errno := errnoOf(m); errno {
		case 0:
			return m.Header.Seq == first+1, nil
		case unix.ENOENT:
			return true, nil
		default:
			return true, errno
		}
	})
}

// hasTable asks the kernel for our table by name.
func (rc *rawConn) hasTable() (bool, error) {
	seq, err := rc.send([]message{tableMessage(unix.NFT_MSG_GETTABLE, unix.NLM_F_ACK)})
	if err != nil {
		return false, err
	}
	found := false
	err = rc.receive(func(m syscall.NetlinkMessage) (bool, error) {
		switch {
		case m.Header.Seq != seq:
			return false, nil
		case m.Header.Type == msgType(unix.NFT_MSG_NEWTABLE):
			found = true
			return false, nil
		case m.Header.Type != unix.NLMSG_ERROR:
			return false, nil
		}
		switch errno := errnoOf(m); errno {
		case 0:
			return true, nil
		case unix.ENOENT:
			found = false
			return true, nil
		default:
			return true, errno
		}
	})
	return found, err
}

// unavailable reports whether err says the kernel has no nf_tables: the
// socket's protocol is missing (no nfnetlink), or nfnetlink has no nf_tables
// subsystem, which it answers to a transaction with EOPNOTSUPP (and to a
// request with EINVAL, see Present). Such a kernel holds no table of ours.
func unavailable(err error) bool {
	return errors.Is(err, unix.EPROTONOSUPPORT) || errors.Is(err, unix.EOPNOTSUPP)
}

// errExists reports whether err says the table exists already.
func errExists(err error) bool { return errors.Is(err, unix.EEXIST) }
