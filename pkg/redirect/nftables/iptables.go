package nftables

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
)

// FindIptablesRules looks for the iptables backend's rules in the namespace
// at nsPath (its Leftovers: IptablesNFT, IptablesLegacy), without running any
// iptables tool: one netlink dump of the chains of every family, and one
// read of ip_tables_names / ip6_tables_names inside the namespace. A missing
// namespace has none.
func FindIptablesRules(ctx context.Context, nsPath string) (redirect.Leftovers, error) {
	var found redirect.Leftovers
	if err := ctx.Err(); err != nil {
		return found, err
	}
	rc, legacyNat, err := dialRaw(ctx, nsPath, true)
	if errors.Is(err, redirect.ErrNetnsGone) {
		return found, nil
	}
	if err != nil {
		return found, err
	}
	defer rc.close()
	found.IptablesLegacy = legacyNat
	if found.IptablesNFT, err = rc.iptablesChains(); err != nil {
		return found, fmt.Errorf("netns %s: %w", nsPath, err)
	}
	return found, nil
}

// hasNatTable reads the x_tables table lists of the calling thread's
// namespace.
func hasNatTable() bool {
	for _, f := range []string{"/proc/thread-self/net/ip_tables_names", "/proc/thread-self/net/ip6_tables_names"} {
		for _, name := range bytes.Fields(readSmall(f)) {
			if string(name) == redirect.Table {
				return true
			}
		}
	}
	return false
}

// readSmall reads a small proc file with plain system calls (os.ReadFile
// registers it with the poller first); nil if it cannot be read (the module
// is not loaded: no table).
func readSmall(path string) []byte {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	defer unix.Close(fd)
	var out []byte
	buf := make([]byte, 512)
	for {
		n, err := unix.Read(fd, buf)
		if n <= 0 || err != nil {
			return out
		}
		out = append(out, buf[:n]...)
	}
}
