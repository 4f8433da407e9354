package nftables

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"

	gnft "github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
)

var table = &gnft.Table{Name: TableName, Family: gnft.TableFamilyINet}

var hooks = map[string]*gnft.ChainHook{"output": gnft.ChainHookOutput, "prerouting": gnft.ChainHookPrerouting}

// conn opens a google/nftables connection to nf_tables inside the
// namespace, for CHECK, which reads the table back. The socket is made on the calling goroutine's own thread,
// switched into the namespace and back (no extra thread, no handoff); it
// stays bound to the namespace, so the netlink work that follows runs
// unlocked.
func conn(nsPath string) (c *gnft.Conn, closeConn func(), err error) {
	err = enter(nsPath, func() error {
		if c, err = gnft.New(gnft.AsLasting()); err != nil {
			return fmt.Errorf("netns %s: netlink: %w", nsPath, err)
		}
		return nil
	})
	if err != nil {
		if c != nil {
			_ = c.CloseLasting()
		}
		return nil, nil, err
	}
	return c, func() { _ = c.CloseLasting() }, nil
}

// enter runs fn on the calling goroutine's thread switched into the network
// namespace at nsPath, then switches back. A path that does not exist, or
// is not a network namespace (any more: an unmounted bind mount, a leftover
// file), gives an error wrapping redirect.ErrNetnsGone, as for the iptables
// backend. If switching back fails the
// goroutine stays locked to the thread (the runtime then never hands the
// thread to other goroutines, and discards it when this goroutine ends)
// and enter returns an error.
func enter(nsPath string, fn func() error) error {
	target, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("netns %s: %w", nsPath, redirect.ErrNetnsGone)
		}
		return fmt.Errorf("netns %s: %w", nsPath, &os.PathError{Op: "open", Path: nsPath, Err: err})
	}
	defer unix.Close(target)
	runtime.LockOSThread()
	orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netns: opening this thread's namespace: %w", err)
	}
	defer unix.Close(orig)
	if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		if errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("netns %s: entering: %w (%v)", nsPath, redirect.ErrNetnsGone, err)
		}
		return fmt.Errorf("netns %s: entering: %w", nsPath, err)
	}
	ferr := fn()
	if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
		return errors.Join(ferr, fmt.Errorf("netns %s: switching back: %w", nsPath, err))
	}
	runtime.UnlockOSThread()
	return ferr
}

// Apply replaces the table in the network namespace at nsPath with t, in
// one netlink transaction. A namespace without the table (every new pod
// sandbox) gets a transaction that creates it exclusively with all its
// chains and rules (see batch.go); only when that fails because the table
// exists already (a repeated ADD) does Apply send the SDK's transaction:
// add, delete and add the table again, then every chain and rule. Deleting
// a table makes the kernel wait for readers of the old rules (an RCU grace
// period, milliseconds), which a first ADD has no reason to pay. The end
// state is the same either way. The kernel applies a transaction entirely
// or not at all; if it fails, Apply deletes whatever table of ours is
// there, so nothing of ours is left in place (fail closed).
func Apply(ctx context.Context, nsPath string, t Table) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	rc, _, err := dialRaw(ctx, nsPath, false)
	if err != nil {
		return err
	}
	defer rc.close()
	return createOrReplace(rc, nsPath, t)
}

// ApplyUnlessIptables is FindIptablesRules followed, on the same netlink
// socket, by Apply when nothing was found. When iptables rules of ours
// may be in the namespace it applies nothing and returns what it found, so
// the caller can remove them (with the iptables tools) and then Apply. A new
// pod sandbox has none, so its ADD opens one socket, sends one dump request
// and one transaction.
func ApplyUnlessIptables(ctx context.Context, nsPath string, t Table) (redirect.Leftovers, error) {
	if err := ctx.Err(); err != nil {
		return redirect.Leftovers{}, err
	}
	rc, legacyNat, err := dialRaw(ctx, nsPath, true)
	if err != nil {
		return redirect.Leftovers{}, err
	}
	defer rc.close()
	found := redirect.Leftovers{IptablesLegacy: legacyNat}
	if found.IptablesNFT, err = rc.iptablesChains(); err != nil {
		return found, fmt.Errorf("netns %s: %w", nsPath, err)
	}
	if found.Any() {
		return found, nil
	}
	return found, createOrReplace(rc, nsPath, t)
}

// createOrReplace creates the table exclusively; when it exists already,
// it replaces it with the SDK's transaction on the same socket. Either way a
// failure removes whatever table of ours is there.
func createOrReplace(rc *rawConn, nsPath string, t Table) error {
	err := rc.apply(t, false)
	if err == nil {
		return nil
	}
	if errExists(err) {
		if err = rc.apply(t, true); err == nil {
			return nil
		}
	}
	err = fmt.Errorf("netns %s: applying table inet %s: %w", nsPath, TableName, err)
	if rerr := rc.deleteTable(); rerr != nil {
		return fmt.Errorf("%w (and removing the table failed too, it may be left: %v)", err, rerr)
	}
	return fmt.Errorf("%w (no table of ours was left in place)", err)
}

// Remove deletes the table from the network namespace at nsPath, in one
// transaction on a plain netlink socket (the iptables backend calls it on
// every ADD and DEL, to take away what a switch of backends left). A missing
// namespace, a missing table or a kernel without nf_tables is not an error:
// Remove is idempotent.
func Remove(ctx context.Context, nsPath string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	rc, _, err := dialRaw(ctx, nsPath, false)
	if errors.Is(err, redirect.ErrNetnsGone) || unavailable(err) {
		return nil
	}
	if err != nil {
		return err
	}
	defer rc.close()
	if err := rc.deleteTable(); err != nil && !unavailable(err) {
		return fmt.Errorf("netns %s: deleting table inet %s: %w", nsPath, TableName, err)
	}
	return nil
}

func exists(c *gnft.Conn) (bool, error) {
	tables, err := c.ListTablesOfFamily(gnft.TableFamilyINet)
	if err != nil {
		return false, fmt.Errorf("listing inet tables: %w", err)
	}
	for _, t := range tables {
		if t.Name == TableName {
			return true, nil
		}
	}
	return false, nil
}

// Present reports whether the network namespace at nsPath holds our table
// (false, nil for a missing namespace or a kernel without nf_tables).
func Present(ctx context.Context, nsPath string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	rc, _, err := dialRaw(ctx, nsPath, false)
	if errors.Is(err, redirect.ErrNetnsGone) || unavailable(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer rc.close()
	ok, err := rc.hasTable()
	if unavailable(err) || errors.Is(err, unix.EINVAL) {
		// nfnetlink without nf_tables answers a request with EINVAL;
		// a request naming a table is otherwise well-formed.
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("netns %s: looking for table inet %s: %w", nsPath, TableName, err)
	}
	return ok, nil
}

// Drift lists every way the table in the kernel differs from the expected
// one.
type Drift struct {
	Problems []string
}

func (d *Drift) Error() string {
	return fmt.Sprintf("table inet %s differs from the expected Consul redirect rules: %s",
		TableName, strings.Join(d.Problems, "; "))
}

// Check compares the table in the network namespace at nsPath with t and
// returns nil when they are equal: the same chains (hooks, types,
// priorities, no others), each with the same rules in the same order. It
// returns a *Drift naming every difference, or the error of reading.
func Check(ctx context.Context, nsPath string, t Table) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c, closeConn, err := conn(nsPath)
	if err != nil {
		return err
	}
	defer closeConn()
	d := &Drift{}
	if err := check(c, t, d); err != nil {
		return fmt.Errorf("netns %s: %w", nsPath, err)
	}
	if len(d.Problems) == 0 {
		return nil
	}
	return d
}

func check(c *gnft.Conn, t Table, d *Drift) error {
	ok, err := exists(c)
	if err != nil {
		return err
	}
	if !ok {
		d.Problems = append(d.Problems, "table inet "+TableName+" is missing")
		return nil
	}
	all, err := c.ListChainsOfTableFamily(gnft.TableFamilyINet)
	if err != nil {
		return fmt.Errorf("listing inet chains: %w", err)
	}
	have := map[string]*gnft.Chain{}
	for _, ch := range all {
		if ch.Table != nil && ch.Table.Name == TableName {
			have[ch.Name] = ch
		}
	}
	for _, want := range t.Chains {
		got, ok := have[want.Name]
		if !ok {
			d.Problems = append(d.Problems, "chain "+want.Name+" is missing")
			continue
		}
		delete(have, want.Name)
		checkHook(d, want, got)
		rules, err := c.GetRules(table, got)
		if err != nil {
			return fmt.Errorf("listing rules of chain %s: %w", want.Name, err)
		}
		compareRules(d, want.Name, t.ChainRules(want.Name), rules)
	}
	for _, ch := range all {
		if _, extra := have[ch.Name]; extra && ch.Table != nil && ch.Table.Name == TableName {
			d.Problems = append(d.Problems, "unexpected chain "+ch.Name)
		}
	}
	return nil
}

var hookNames = map[gnft.ChainHook]string{*gnft.ChainHookOutput: "output", *gnft.ChainHookPrerouting: "prerouting"}

func checkHook(d *Drift, want Chain, got *gnft.Chain) {
	describe := func(typ, hook string, prio int64) string {
		return fmt.Sprintf("type %s hook %s priority %d", typ, hook, prio)
	}
	w, g := "regular chain", "regular chain"
	if want.Hook != nil {
		w = describe(want.Hook.Type, want.Hook.Hook, int64(want.Hook.Priority))
	}
	if got.Hooknum != nil {
		name, ok := hookNames[*got.Hooknum]
		if !ok {
			name = fmt.Sprintf("hook(%d)", *got.Hooknum)
		}
		var prio int64
		if got.Priority != nil {
			prio = int64(*got.Priority)
		}
		g = describe(string(got.Type), name, prio)
	}
	if w != g {
		d.Problems = append(d.Problems, fmt.Sprintf("chain %s is %s, want %s", want.Name, g, w))
	}
	if got.Policy != nil && *got.Policy != gnft.ChainPolicyAccept {
		d.Problems = append(d.Problems, fmt.Sprintf("chain %s has policy %d, want accept", want.Name, *got.Policy))
	}
}

// compareRules reports how the rules of one chain in the kernel differ from
// the expected ones: missing rules, unexpected rules, or (same rules) the
// wrong order. Rules compare by their expressions.
func compareRules(d *Drift, chain string, want []Rule, got []*gnft.Rule) {
	w := make([]string, len(want))
	text := map[string]string{}
	for i, r := range want {
		w[i] = ruleString(r.Exprs)
		text[w[i]] = r.Text
	}
	g := make([]string, len(got))
	for i, r := range got {
		g[i] = ruleString(r.Exprs)
	}
	diff := redirect.DiffLists(w, g)
	for _, s := range diff.Missing {
		d.Problems = append(d.Problems, fmt.Sprintf("rule missing in %s: %s", chain, text[s]))
	}
	for _, s := range diff.Extra {
		d.Problems = append(d.Problems, fmt.Sprintf("unexpected rule in %s: %s", chain, s))
	}
	if diff.Reordered {
		names := func(list []string) string {
			out := make([]string, len(list))
			for i, s := range list {
				out[i] = text[s]
			}
			return strings.Join(out, " | ")
		}
		d.Problems = append(d.Problems, fmt.Sprintf("rules of %s are out of order: have [%s], want [%s]",
			chain, names(g), names(w)))
	}
}

// Kernel is the kernel side of the backend: Netlink, or an in-memory
// double in tests (nftablestest.Fake).
type Kernel interface {
	Apply(ctx context.Context, nsPath string, t Table) error
	Check(ctx context.Context, nsPath string, t Table) error
	Remove(ctx context.Context, nsPath string) error
	Present(ctx context.Context, nsPath string) (bool, error)
	FindIptablesRules(ctx context.Context, nsPath string) (redirect.Leftovers, error)
	ApplyUnlessIptables(ctx context.Context, nsPath string, t Table) (redirect.Leftovers, error)
}

// Netlink is the kernel side as a value: its methods are the package's
// functions, so that Backend can hold it behind Kernel and tests can put an
// in-memory double in its place.
type Netlink struct{}

func (Netlink) Apply(ctx context.Context, nsPath string, t Table) error { return Apply(ctx, nsPath, t) }
func (Netlink) Check(ctx context.Context, nsPath string, t Table) error { return Check(ctx, nsPath, t) }
func (Netlink) Remove(ctx context.Context, nsPath string) error         { return Remove(ctx, nsPath) }
func (Netlink) Present(ctx context.Context, nsPath string) (bool, error) {
	return Present(ctx, nsPath)
}
func (Netlink) FindIptablesRules(ctx context.Context, nsPath string) (redirect.Leftovers, error) {
	return FindIptablesRules(ctx, nsPath)
}
func (Netlink) ApplyUnlessIptables(ctx context.Context, nsPath string, t Table) (redirect.Leftovers, error) {
	return ApplyUnlessIptables(ctx, nsPath, t)
}
