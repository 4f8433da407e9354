// Package testnet gives privileged tests an isolated slice of addresses,
// named network namespaces, and an "external" namespace that stands for the
// world outside a node, all torn down by t.Cleanup.
//
// Every address a test uses lies inside 198.18.0.0/15 (RFC 2544 test
// networks) or fd63:6372::/32 (a ULA prefix). A test process reserves one
// slot, a /20 and a /48, with an flock, so concurrent test processes never
// collide.
//
// The harness owns its network: the slot's namespaces are joined by a router
// namespace of its own, which forwards between nodes, pods and the external
// namespace, so nothing depends on the host's forwarding switch
// (net.ipv4.ip_forward is 0 on a fresh machine and stays untouched). The host
// is an endpoint only: one veth pair links it to the router, and the slot's
// two prefixes are routed through it, so the test process and the control
// plane on the host's loopback reach node and pod addresses. That link and
// its two routes are the only change to the host; they go with the router
// when the slot is released, and a killed run's are swept when the slot is
// reserved again. Inside the router an "unreachable" route covers the slot,
// so a packet that finds no specific route is dropped there instead of
// leaving the machine through its default gateway.
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

	lock  *os.File
	mu    sync.Mutex
	links int // links made to the router (Link names their router ends after it)
	refs  int
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
	var r *Range
	err := withSetupLock(func() error {
		sweep()
		for s := 0; s < slots; s++ {
			f, ok, err := lockSlot(s)
			if err != nil {
				return err
			}
			if ok {
				r = slotRange(s)
				r.lock = f
				return nil
			}
		}
		return fmt.Errorf("all %d address slots are in use by other test processes", slots)
	})
	if err != nil {
		return nil, err
	}
	if err := r.startRouter(); err != nil {
		r.release()
		return nil, err
	}
	return r, nil
}

// withSetupLock runs f holding the harness's setup lock (blocking). A sweep
// holds the lock of every free slot while it cleans, so a process choosing
// a slot at that moment would find none free: sweeps and slot choices take
// turns.
func withSetupLock(f func() error) error {
	if err := os.MkdirAll(lockDir, 0o755); err != nil {
		return err
	}
	l, err := os.OpenFile(filepath.Join(lockDir, "setup.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer l.Close() // closing releases the lock
	if err := syscall.Flock(int(l.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("testnet setup lock: %w", err)
	}
	return f()
}

// slotRange is slot s's address range (not reserved).
func slotRange(s int) *Range {
	r := &Range{Slot: s}
	b := base4.As4()
	off := s * 4096
	b[1] += byte(off >> 16)
	b[2] += byte(off >> 8)
	r.V4 = netip.PrefixFrom(netip.AddrFrom4(b), 20)
	r.V6 = netip.MustParsePrefix(fmt.Sprintf("fd63:6372:%x::/48", s))
	return r
}

// lockSlot takes slot s's lock without waiting; ok is false when another
// process holds it.
func lockSlot(s int) (_ *os.File, ok bool, _ error) {
	f, err := os.OpenFile(filepath.Join(lockDir, fmt.Sprintf("slot-%d.lock", s)), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, false, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, false, nil
	}
	return f, true, nil
}

// Sweep removes what killed test processes left on the host: for every slot
// no live process holds, its namespaces (router, nodes, pods), its host link
// and the routes and addresses inside its range. Reserve sweeps first; the
// node harness sweeps before it starts a node.
func Sweep() {
	_ = withSetupLock(func() error { sweep(); return nil })
}

// sweep is Sweep, its caller holding the setup lock.
func sweep() {
	var free []*Range
	for s := 0; s < slots; s++ {
		f, ok, err := lockSlot(s)
		if err != nil || !ok {
			continue
		}
		defer f.Close() // held until the sweep is done, so no process takes the slot meanwhile
		free = append(free, slotRange(s))
	}
	if len(free) > 0 {
		cleanLeftovers(free)
	}
}

// cleanLeftovers removes the slots' namespaces (named after the slot), host
// links, and addresses and routes inside their ranges, from one listing of
// each.
func cleanLeftovers(rs []*Range) {
	owned := func(name string, prefix func(*Range) string) bool {
		for _, r := range rs {
			if strings.HasPrefix(name, prefix(r)) {
				return true
			}
		}
		return false
	}
	inRange := func(a netip.Addr) bool {
		for _, r := range rs {
			if r.V4.Contains(a) || r.V6.Contains(a) {
				return true
			}
		}
		return false
	}
	for _, name := range netnsNames() {
		if owned(name, (*Range).nsPrefix) {
			_ = run("ip", "netns", "del", name)
		}
	}
	out, _ := exec.Command("ip", "-o", "link", "show").Output()
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 1 {
			name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
			if owned(name, (*Range).linkPrefix) {
				_ = run("ip", "link", "del", name)
			}
		}
	}
	// Addresses of the slots left on host links (simulated nodes of older
	// versions put their node address on lo).
	for _, fam := range []string{"-4", "-6"} {
		out, _ = exec.Command("ip", fam, "-o", "addr", "show").Output()
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			if len(f) < 4 {
				continue
			}
			if p, err := netip.ParsePrefix(f[3]); err == nil && inRange(p.Addr()) {
				_ = run("ip", "addr", "del", f[3], "dev", strings.TrimSuffix(f[1], ":"))
			}
		}
	}
	for _, fam := range [][2]string{{"-4", "198.18.0.0/15"}, {"-6", "fd63:6372::/32"}} {
		out, _ = exec.Command("ip", fam[0], "-o", "route", "show", "root", fam[1]).Output()
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			typ := []string{}
			if len(f) > 0 && f[0] == "unreachable" {
				typ, f = f[:1], f[1:]
			}
			if len(f) == 0 {
				continue
			}
			dst, _, _ := strings.Cut(f[0], "/")
			if a, err := netip.ParseAddr(dst); err == nil && inRange(a) {
				_ = run("ip", append(append([]string{fam[0], "route", "del"}, typ...), f[0])...)
			}
		}
	}
}

// netnsNames lists the named network namespaces ("ip netns list").
func netnsNames() []string {
	out, _ := exec.Command("ip", "netns", "list").Output()
	var names []string
	for _, line := range strings.Split(string(out), "\n") {
		if name, _, _ := strings.Cut(strings.TrimSpace(line), " "); name != "" {
			names = append(names, name)
		}
	}
	return names
}

func (r *Range) release() {
	cleanLeftovers([]*Range{r})
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
// linked to the router like a node (Link), which routes its service
// addresses to it, so pods reach it by their default route and the host
// through its route to the slot.
type External struct {
	*Netns
	// V4 and V6 are the addresses services in the namespace listen on.
	V4, V6 netip.Addr

	r    *Range
	mu   sync.Mutex
	next int
}

// NewExternal creates the external namespace. Its service addresses are
// taken from subnet index 14 (a /24) of the range and /64 0xfffe, so callers
// can reserve pod subnets elsewhere in it.
func (r *Range) NewExternal(tb TB) *External {
	tb.Helper()
	svc4 := Host(r.Subnet4(14, 24), 10) // 15th /24: services
	svc6 := Host(r.Subnet6(0xfffe), 10)
	ns := r.NewNode(tb, "ext", netip.PrefixFrom(svc4, 32), netip.PrefixFrom(svc6, 128))
	for _, a := range []string{svc4.String() + "/32", svc6.String() + "/128"} {
		if err := run("ip", "-n", ns.Name, "addr", "add", a, "dev", "lo"); err != nil {
			tb.Fatalf("testnet: %v", err)
		}
	}
	return &External{Netns: ns, V4: svc4, V6: svc6, r: r, next: 11}
}

// AddAddress gives the external namespace one more service address of the
// family of v6 (false: IPv4), routed to it by the router like V4 and V6.
// Tests use it to tell two external destinations apart (for example one
// excluded by CIDR and one not).
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
		a, via, family, bits = Host(e.r.Subnet6(0xfffe), n), linkedLL6, "-6", "/128"
	} else {
		a, via = Host(e.r.Subnet4(14, 24), n), linkedLL4
	}
	if err := run("ip", "-n", e.Name, family, "addr", "add", a.String()+bits, "dev", "lo"); err != nil {
		tb.Fatalf("testnet: %v", err)
	}
	dev, err := e.routerEnd()
	if err != nil {
		tb.Fatalf("testnet: %v", err)
	}
	route := []string{"-n", e.r.RouterName(), family, "route", "replace", a.String() + bits, "via", via.String(), "dev", dev}
	if !v6 {
		route = append(route, "onlink")
	}
	if err := run("ip", route...); err != nil {
		tb.Fatalf("testnet: %v", err)
	}
	return a
}

// routerEnd names the router's end of the external namespace's link: the
// device of the router's route to V4.
func (e *External) routerEnd() (string, error) {
	out, err := exec.Command("ip", "-n", e.r.RouterName(), "-o", "route", "show", netip.PrefixFrom(e.V4, 32).String()).Output()
	if err != nil {
		return "", fmt.Errorf("router route to %s: %v", e.V4, err)
	}
	f := strings.Fields(string(out))
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "dev" {
			return f[i+1], nil
		}
	}
	return "", fmt.Errorf("router has no route to %s: %q", e.V4, out)
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
