package nftables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"

	gnft "github.com/google/nftables"
	"github.com/vishvananda/netns"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
)

// IptablesRules says which variants of the iptables rules may be in a
// namespace, so a caller switching a pod to this backend knows whether it
// has to run the (slower) iptables removal at all.
type IptablesRules struct {
	// NFT: an ip or ip6 nat table of nf_tables (iptables-nft) holds one of
	// redirect.Chains.
	NFT bool
	// Legacy: the x_tables nat table exists in the namespace. The kernel
	// creates it only once something uses it, so a fresh pod namespace has
	// none; when it exists, it may hold our chains.
	Legacy bool
}

// Any reports whether some iptables rules of ours may be present.
func (r IptablesRules) Any() bool { return r.NFT || r.Legacy }

// FindIptablesRules looks for iptables rules of ours in the namespace at
// nsPath, without running any iptables tool: one netlink dump for nf_tables
// and one read of ip_tables_names / ip6_tables_names inside the namespace.
// A missing namespace has none.
func FindIptablesRules(ctx context.Context, nsPath string) (IptablesRules, error) {
	var found IptablesRules
	if err := ctx.Err(); err != nil {
		return found, err
	}
	c, closeConn, err := conn(nsPath)
	if errors.Is(err, ErrNoNetNS) {
		return found, nil
	}
	if err != nil {
		return found, err
	}
	defer closeConn()
	for _, fam := range []gnft.TableFamily{gnft.TableFamilyIPv4, gnft.TableFamilyIPv6} {
		chains, err := c.ListChainsOfTableFamily(fam)
		if err != nil {
			return found, fmt.Errorf("netns %s: listing chains: %w", nsPath, err)
		}
		for _, ch := range chains {
			found.NFT = found.NFT || (ch.Table != nil && ch.Table.Name == redirect.Table && redirect.IsOurChain(ch.Name))
		}
	}
	found.Legacy, err = legacyNat(nsPath)
	return found, err
}

// legacyNat reports whether the x_tables nat table (IPv4 or IPv6) exists in
// the namespace.
func legacyNat(nsPath string) (bool, error) {
	type result struct {
		ok  bool
		err error
	}
	done := make(chan result, 1)
	go func() {
		// The thread stays locked: it exits with the goroutine, so a
		// failure to switch back can never leak into other goroutines.
		runtime.LockOSThread()
		target, err := netns.GetFromPath(nsPath)
		if err != nil {
			done <- result{err: fmt.Errorf("netns %s: %w", nsPath, err)}
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			done <- result{err: fmt.Errorf("netns %s: entering: %w", nsPath, err)}
			return
		}
		for _, f := range []string{"/proc/thread-self/net/ip_tables_names", "/proc/thread-self/net/ip6_tables_names"} {
			b, err := os.ReadFile(f)
			if err != nil {
				continue // module not loaded: no table
			}
			for _, name := range bytes.Fields(b) {
				if string(name) == redirect.Table {
					done <- result{ok: true}
					return
				}
			}
		}
		done <- result{}
	}()
	r := <-done
	return r.ok, r.err
}
