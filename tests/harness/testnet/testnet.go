// Package testnet gives privileged tests an isolated slice of addresses,
// named network namespaces, and an "external" namespace that stands for the
// world outside a node, all torn down by t.Cleanup.
//
// Every address a test uses lies inside 198.18.0.0/15 (RFC 2544 test
// networks) or fd63:6372::/32 (a ULA prefix). A test process reserves one
// slot, a /20 and a /48, with an flock, so concurrent test processes never
// collide; the slot gets an "unreachable" route on the host first, so a
// packet that finds no specific route is dropped instead of leaving the
// machine through its default gateway.
package testnet

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
)

const (
	slots   = 32
	lockDir = "/run/consul-cni-repair-testnet"
)

var (
	base4 = netip.MustParseAddr("198.18.0.0")
)

// TB is the part of testing.TB the helpers use. *testing.T and *testing.B
// satisfy it, and so does tests/harness/lifecycle.Env, which lets commands such as
// the demo use the same helpers outside a test.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Cleanup(func())
}

// Range is the slice of addresses reserved by this test process.
type Range struct {
	Slot int
	V4   netip.Prefix // a /20
	V6   netip.Prefix // a /48

	lock *os.File
	mu   sync.Mutex
	next int // next free /30 for veth links
	refs int
}

var (
	procMu    sync.Mutex
	procRange *Range
	nsCount   int
)

// Reserve returns this process's address range, reserving a free slot on
// first use. The slot is released, and its routes removed, when the last test
// that reserved it has finished.
func Reserve(tb TB) *Range {
	tb.Helper()
	RequireRoot(tb)
	procMu.Lock()
	defer procMu.Unlock()
	if procRange == nil {
		r, err := reserve()
		if err != nil {
			tb.Fatalf("testnet: %v", err)
		}
		procRange = r
	}
	r := procRange
	r.refs++
	tb.Cleanup(func() {
		procMu.Lock()
		defer procMu.Unlock()
		r.refs--
		if r.refs == 0 {
			r.release()
			procRange = nil
		}
	})
	return r
}

// RequireRoot fails the test unless it runs as root: the privileged tiers
// are asked for explicitly, so a missing privilege is an error, not a skip.
func RequireRoot(tb TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Fatalf("this test needs root (network namespaces and iptables); run it through make as root")
	}
}

func reserve() (*Range, error) {
	if err := os.MkdirAll(lockDir, 0o755); err != nil {
		return nil, err
	}
	for s := 0; s < slots; s++ {
		f, err := os.OpenFile(filepath.Join(lockDir, fmt.Sprintf("slot-%d.lock", s)), os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			return nil, err
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close()
			continue
		}
		r := &Range{Slot: s, lock: f}
		b := base4.As4()
		off := s * 4096
		b[1] += byte(off >> 16)
		b[2] += byte(off >> 8)
		r.V4 = netip.PrefixFrom(netip.AddrFrom4(b), 20)
		r.V6 = netip.MustParsePrefix(fmt.Sprintf("fd63:6372:%x::/48", s))
		r.cleanLeftovers()
		if err := run("ip", "route", "replace", "unreachable", r.V4.String()); err != nil {
			r.release()
			return nil, err
		}
		if err := run("ip", "-6", "route", "replace", "unreachable", r.V6.String()); err != nil {
			r.release()
			return nil, err
		}
		return r, nil
	}
	return nil, fmt.Errorf("all %d address slots are in use by other test processes", slots)
}

// cleanLeftovers removes what a killed earlier holder of the slot left:
// namespaces named after the slot, and routes inside its range.
func (r *Range) cleanLeftovers() {
	out, _ := exec.Command("ip", "netns", "list").Output()
	prefix := r.nsPrefix()
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		if strings.HasPrefix(name, prefix) {
			_ = run("ip", "netns", "del", name)
		}
	}
	out, _ = exec.Command("ip", "-o", "link", "show").Output()
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) > 1 {
			name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
			if strings.HasPrefix(name, r.linkPrefix()) {
				_ = run("ip", "link", "del", name)
			}
		}
	}
	// Addresses of the slot left on host links (a simulated node puts its
	// node address on lo).
	for _, fam := range []string{"-4", "-6"} {
		out, _ = exec.Command("ip", fam, "-o", "addr", "show").Output()
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			if len(f) < 4 {
				continue
			}
			p, err := netip.ParsePrefix(f[3])
			if err != nil || !(r.V4.Contains(p.Addr()) || r.V6.Contains(p.Addr())) {
				continue
			}
			_ = run("ip", "addr", "del", f[3], "dev", strings.TrimSuffix(f[1], ":"))
		}
	}
	_ = run("ip", "route", "flush", "root", r.V4.String())
	_ = run("ip", "-6", "route", "flush", "root", r.V6.String())
}

func (r *Range) release() {
	r.cleanLeftovers()
	_ = run("ip", "route", "del", "unreachable", r.V4.String())
	_ = run("ip", "-6", "route", "del", "unreachable", r.V6.String())
	syscall.Flock(int(r.lock.Fd()), syscall.LOCK_UN)
	r.lock.Close()
}

func (r *Range) nsPrefix() string { return fmt.Sprintf("ccr-s%d-", r.Slot) }

// linkPrefix begins the name of every host link the slot creates ("ccr3x"
// for slot 3, so slot 1 never matches slot 10's links).
func (r *Range) linkPrefix() string { return fmt.Sprintf("ccr%dx", r.Slot) }

// NetnsName returns a fresh name for a network namespace owned by this slot,
// for callers that create and delete the namespace themselves (simulated
// nodes make one per pod sandbox). A namespace with such a name that a killed
// process left behind is deleted when the slot is next reserved.
func (r *Range) NetnsName(name string) string {
	procMu.Lock()
	defer procMu.Unlock()
	nsCount++
	return fmt.Sprintf("%s%s-%d", r.nsPrefix(), name, nsCount)
}

// Subnet4 returns the i-th IPv4 subnet of the given size inside the range
// (for example Subnet4(2, 24) is the third /24).
func (r *Range) Subnet4(i, bits int) netip.Prefix {
	size := 1 << (32 - bits)
	if bits < 20 || (i+1)*size > 4096 {
		panic(fmt.Sprintf("testnet: subnet %d of /%d does not fit a /20", i, bits))
	}
	return netip.PrefixFrom(addOffset4(r.V4.Addr(), i*size), bits)
}

// Subnet6 returns the i-th /64 inside the range.
func (r *Range) Subnet6(i int) netip.Prefix {
	b := r.V6.Addr().As16()
	b[6] = byte(i >> 8)
	b[7] = byte(i)
	return netip.PrefixFrom(netip.AddrFrom16(b), 64)
}

// Host returns the n-th address of a subnet (n=1 is the first usable one).
func Host(p netip.Prefix, n int) netip.Addr {
	if p.Addr().Is4() {
		return addOffset4(p.Addr(), n)
	}
	b := p.Addr().As16()
	b[14] = byte(n >> 8)
	b[15] = byte(n)
	return netip.AddrFrom16(b)
}

func addOffset4(a netip.Addr, off int) netip.Addr {
	b := a.As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += uint32(off)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// linkSubnets returns a fresh /30 and /126 pair for a host<->namespace link,
// taken from the top /24 (and /64 0xffff) of the range.
func (r *Range) linkSubnets() (netip.Prefix, netip.Prefix, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	i := r.next
	r.next++
	if i >= 64 {
		panic("testnet: out of link subnets")
	}
	v4 := netip.PrefixFrom(addOffset4(r.V4.Addr(), 4096-256+i*4), 30)
	b := r.Subnet6(0xffff).Addr().As16()
	b[15] = byte(i * 4)
	return v4, netip.PrefixFrom(netip.AddrFrom16(b), 126), i
}

// Netns is a named network namespace created for a test.
type Netns struct {
	Name string
	Path string
}

// NewNetns creates a named network namespace (visible to "ip netns") whose
// loopback is up, deleted when the test ends.
func (r *Range) NewNetns(tb TB, name string) *Netns {
	tb.Helper()
	full := r.NetnsName(name)
	if err := run("ip", "netns", "add", full); err != nil {
		tb.Fatalf("testnet: %v", err)
	}
	n := &Netns{Name: full, Path: filepath.Join("/run/netns", full)}
	tb.Cleanup(func() { _ = run("ip", "netns", "del", full) })
	if err := run("ip", "-n", full, "link", "set", "lo", "up"); err != nil {
		tb.Fatalf("testnet: %v", err)
	}
	return n
}

// Do runs fn on an OS thread switched into the namespace. Sockets created by
// fn stay in the namespace after Do returns.
func (n *Netns) Do(fn func() error) error {
	return DoIn(n.Path, fn)
}

// DoIn runs fn on an OS thread switched into the network namespace at path.
func DoIn(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		// The thread is never unlocked: if restoring the original namespace
		// failed the thread would be poisoned, so it exits with the goroutine.
		runtime.LockOSThread()
		target, err := netns.GetFromPath(path)
		if err != nil {
			errc <- fmt.Errorf("open netns %s: %w", path, err)
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			errc <- fmt.Errorf("enter netns %s: %w", path, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// DialRead connects from inside the namespace to addr over TCP and returns
// what the peer writes before closing, trimmed; timeout bounds the dial and
// the read each.
func (n *Netns) DialRead(addr string, timeout time.Duration) (string, error) {
	var got string
	err := n.Do(func() error {
		c, err := net.DialTimeout("tcp", addr, timeout)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(timeout))
		b, err := io.ReadAll(c)
		got = strings.TrimSpace(string(b))
		return err
	})
	return got, err
}

// Listen opens a listener inside the namespace.
func (n *Netns) Listen(network, addr string) (net.Listener, error) {
	var l net.Listener
	err := n.Do(func() (err error) { l, err = net.Listen(network, addr); return })
	return l, err
}

// ListenPacket opens a packet listener inside the namespace.
func (n *Netns) ListenPacket(network, addr string) (net.PacketConn, error) {
	var c net.PacketConn
	err := n.Do(func() (err error) { c, err = net.ListenPacket(network, addr); return })
	return c, err
}

// Command returns a command that runs inside the namespace, as uid/gid when
// uid >= 0 (through nsenter, which applies the credentials after entering).
func (n *Netns) Command(uid int, name string, args ...string) *exec.Cmd {
	return NsCommand(n.Path, uid, name, args...)
}

// NsCommand is Command for any network namespace path.
func NsCommand(path string, uid int, name string, args ...string) *exec.Cmd {
	a := []string{"--net=" + path}
	if uid >= 0 {
		a = append(a, fmt.Sprintf("--setuid=%d", uid), fmt.Sprintf("--setgid=%d", uid))
	}
	a = append(a, "--", name)
	return exec.Command("nsenter", append(a, args...)...)
}

// Run runs a command inside the namespace as root and returns its stdout,
// failing the test on error.
func (n *Netns) Run(tb TB, name string, args ...string) string {
	tb.Helper()
	var stdout, stderr bytes.Buffer
	c := n.Command(-1, name, args...)
	c.Stdout, c.Stderr = &stdout, &stderr
	if err := c.Run(); err != nil {
		tb.Fatalf("%s %s in %s: %v: %s", name, strings.Join(args, " "), n.Name, err, stderr.String())
	}
	return stdout.String()
}

// External is a namespace that stands for the world beyond a node: it is
// linked to the host by a veth pair and routed from the host, so pods
// attached to the host (ptp) reach it by their default route.
type External struct {
	*Netns
	// V4 and V6 are the addresses services in the namespace listen on.
	V4, V6 netip.Addr

	r                  *Range
	hostVia4, hostVia6 netip.Addr
	mu                 sync.Mutex
	next               int
}

// NewExternal creates the external namespace. Its service addresses are
// taken from subnet index svc4 (a /24) of the range, so callers can reserve
// pod subnets elsewhere in it.
func (r *Range) NewExternal(tb TB) *External {
	tb.Helper()
	ns := r.NewNetns(tb, "ext")
	l4, l6, i := r.linkSubnets()
	host, peer := fmt.Sprintf("%s%d", r.linkPrefix(), i), "eth0"
	hostA4, extA4 := Host(l4, 1), Host(l4, 2)
	hostA6, extA6 := Host(l6, 1), Host(l6, 2)
	svc4 := Host(r.Subnet4(14, 24), 10) // 15th /24: services
	svc6 := Host(r.Subnet6(0xfffe), 10)
	steps := [][]string{
		{"ip", "link", "add", host, "type", "veth", "peer", "name", peer, "netns", ns.Name},
		{"ip", "link", "set", host, "up"},
		{"ip", "addr", "add", hostA4.String() + "/30", "dev", host},
		{"ip", "addr", "add", hostA6.String() + "/126", "dev", host, "nodad"},
		{"ip", "-n", ns.Name, "link", "set", peer, "up"},
		{"ip", "-n", ns.Name, "addr", "add", extA4.String() + "/30", "dev", peer},
		{"ip", "-n", ns.Name, "addr", "add", extA6.String() + "/126", "dev", peer, "nodad"},
		{"ip", "-n", ns.Name, "addr", "add", svc4.String() + "/32", "dev", "lo"},
		{"ip", "-n", ns.Name, "addr", "add", svc6.String() + "/128", "dev", "lo"},
		{"ip", "-n", ns.Name, "route", "add", r.V4.String(), "via", hostA4.String()},
		{"ip", "-n", ns.Name, "-6", "route", "add", r.V6.String(), "via", hostA6.String()},
		{"ip", "route", "replace", svc4.String() + "/32", "via", extA4.String()},
		{"ip", "-6", "route", "replace", svc6.String() + "/128", "via", extA6.String()},
	}
	tb.Cleanup(func() {
		_ = run("ip", "route", "del", svc4.String()+"/32")
		_ = run("ip", "-6", "route", "del", svc6.String()+"/128")
		_ = run("ip", "link", "del", host)
	})
	for _, s := range steps {
		if err := run(s[0], s[1:]...); err != nil {
			tb.Fatalf("testnet: %v", err)
		}
	}
	return &External{Netns: ns, V4: svc4, V6: svc6, r: r, hostVia4: extA4, hostVia6: extA6, next: 11}
}

// AddAddress gives the external namespace one more service address of the
// family of v6 (false: IPv4), routed from the host like V4 and V6, removed
// when the test ends. Tests use it to tell two external destinations apart
// (for example one excluded by CIDR and one not).
func (e *External) AddAddress(tb TB, v6 bool) netip.Addr {
	tb.Helper()
	e.mu.Lock()
	n := e.next
	e.next++
	e.mu.Unlock()
	if n > 250 {
		tb.Fatalf("testnet: out of external addresses")
	}
	var a, via netip.Addr
	family, bits := "-4", "/32"
	if v6 {
		a, via, family, bits = Host(e.r.Subnet6(0xfffe), n), e.hostVia6, "-6", "/128"
	} else {
		a, via = Host(e.r.Subnet4(14, 24), n), e.hostVia4
	}
	if err := run("ip", "-n", e.Name, family, "addr", "add", a.String()+bits, "dev", "lo"); err != nil {
		tb.Fatalf("testnet: %v", err)
	}
	tb.Cleanup(func() { _ = run("ip", family, "route", "del", a.String()+bits) })
	if err := run("ip", family, "route", "replace", a.String()+bits, "via", via.String()); err != nil {
		tb.Fatalf("testnet: %v", err)
	}
	return a
}

func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// FreePort returns a TCP port on 127.0.0.1 that was free when asked (a
// process may take it before the caller binds it).
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
