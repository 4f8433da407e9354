package initcheck

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// NotRedirectedError means the probe's connection was not redirected to the
// outbound port: the pod's traffic bypasses the proxy.
type NotRedirectedError struct{ msg string }

func (e *NotRedirectedError) Error() string { return e.msg }

func notRedirected(format string, a ...any) error {
	return &NotRedirectedError{msg: fmt.Sprintf(format, a...)}
}

// Probe proves that an outbound TCP connection from this process is
// redirected to the proxy's outbound port: it listens on the loopback
// address of the target's family at outboundPort (where the REDIRECT target
// sends locally generated connections), dials target, and confirms that the
// connection arrived at that listener with target as its original
// destination (SO_ORIGINAL_DST) and carries the bytes sent. A
// *NotRedirectedError means the traffic is not redirected; any other error
// means the probe could not run or could not judge (a connection that timed
// out with nothing sent out of the pod: sentPackets).
func Probe(ctx context.Context, outboundPort uint16, target netip.AddrPort, timeout time.Duration) error {
	network, lo := "tcp4", netip.MustParseAddr("127.0.0.1")
	if target.Addr().Is6() && !target.Addr().Is4In6() {
		network, lo = "tcp6", netip.IPv6Loopback()
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, network, netip.AddrPortFrom(lo, outboundPort).String())
	if err != nil {
		return fmt.Errorf("cannot listen on the outbound port %d (the check must run before the proxy starts): %w", outboundPort, err)
	}
	defer ln.Close()
	tl := ln.(*net.TCPListener)

	sent, counted := sentPackets(procNetDev)
	d := net.Dialer{Timeout: timeout}
	conn, err := d.DialContext(ctx, "tcp", target.String())
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var ne net.Error
		if after, ok := sentPackets(procNetDev); errors.As(err, &ne) && ne.Timeout() && counted && ok && after == sent {
			return fmt.Errorf("connection to %s timed out (%v) and no packet left the pod's network namespace (%d sent on its interfaces before and after): "+
				"a rule in the pod drops it before the redirect could take it, so whether the redirect is in place cannot be told", target, err, sent)
		}
		return notRedirected("connection to %s was not redirected to the outbound port %d: %v", target, outboundPort, err)
	}
	defer conn.Close()
	nonce := make([]byte, 16)
	if _, err := rand.Read(nonce); err != nil {
		return err
	}
	_ = conn.SetDeadline(time.Now().Add(timeout))
	if _, err := conn.Write(nonce); err != nil {
		return notRedirected("connection to %s: sending failed: %v", target, err)
	}
	local := conn.LocalAddr().String()
	deadline := time.Now().Add(timeout)
	for {
		_ = tl.SetDeadline(deadline)
		c, err := tl.AcceptTCP()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return notRedirected("connection to %s was answered by something other than the outbound port %d: not redirected", target, outboundPort)
			}
			return fmt.Errorf("accepting on the outbound port: %w", err)
		}
		if c.RemoteAddr().String() != local {
			c.Close() // not ours
			continue
		}
		defer c.Close()
		orig, err := OriginalDst(c)
		if err != nil {
			return notRedirected("connection to %s arrived at the outbound port without an original destination: %v", target, err)
		}
		if orig != target {
			return notRedirected("connection to %s arrived at the outbound port with original destination %s", target, orig)
		}
		_ = c.SetDeadline(deadline)
		got := make([]byte, len(nonce))
		if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, nonce) {
			return notRedirected("connection to %s reached the outbound port but its data did not: %v", target, err)
		}
		return nil
	}
}

// procNetDev lists the interfaces of the reading process's network
// namespace with their counters, readable without privileges.
const procNetDev = "/proc/net/dev"

// sentPackets sums, over the interfaces of the network namespace in path's
// format (/proc/net/dev), except the loopback, the packets each sent or
// failed to send (transmit packets, errors and drops): everything routed out
// of the namespace. ok is false when path cannot be read or parsed.
//
// The probe reads it around a connection that timed out: a connection that
// is not redirected is routed out of an interface (its SYN, or the ARP or
// neighbour solicitation that precedes it, is counted there) to the
// non-local probe address, while one a rule in the pod drops ahead of the
// redirect sends nothing. Other traffic of the pod only adds to the count,
// so an unchanged sum proves that nothing of the probe left, and a changed
// one proves nothing. A refused connection is not judged this way: a local
// address refuses without sending anything either.
func sentPackets(path string) (sum uint64, ok bool) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	lines := strings.Split(string(data), "\n")
	if len(lines) < 2 {
		return 0, false
	}
	for _, line := range lines[2:] {
		name, counters, found := strings.Cut(line, ":")
		if !found {
			continue
		}
		if strings.TrimSpace(name) == "lo" {
			continue
		}
		f := strings.Fields(counters)
		if len(f) < 12 {
			return 0, false
		}
		// Receive: bytes packets errs drop fifo frame compressed
		// multicast; transmit: bytes packets errs drop ...
		for _, v := range f[9:12] {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return 0, false
			}
			sum += n
		}
	}
	return sum, true
}

// OriginalDst returns the destination a redirected connection was sent to,
// as netfilter recorded it before the REDIRECT (SO_ORIGINAL_DST).
func OriginalDst(c *net.TCPConn) (netip.AddrPort, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	is6 := false
	if la, ok := c.LocalAddr().(*net.TCPAddr); ok && la.IP.To4() == nil {
		is6 = true
	}
	var buf [28]byte // sockaddr_in6, large enough for sockaddr_in
	var sockErr error
	err = rc.Control(func(fd uintptr) {
		level := unix.SOL_IP
		if is6 {
			level = unix.SOL_IPV6
		}
		size := uint32(len(buf))
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, uintptr(level), unix.SO_ORIGINAL_DST,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&size)), 0)
		if errno != 0 {
			sockErr = errno
		}
	})
	if err != nil {
		return netip.AddrPort{}, err
	}
	if sockErr != nil {
		if errors.Is(sockErr, syscall.ENOENT) {
			return netip.AddrPort{}, errors.New("no netfilter redirection recorded (ENOENT)")
		}
		return netip.AddrPort{}, sockErr
	}
	port := binary.BigEndian.Uint16(buf[2:4])
	if is6 {
		var a [16]byte
		copy(a[:], buf[8:24])
		return netip.AddrPortFrom(netip.AddrFrom16(a), port), nil
	}
	var a [4]byte
	copy(a[:], buf[4:8])
	return netip.AddrPortFrom(netip.AddrFrom4(a), port), nil
}
