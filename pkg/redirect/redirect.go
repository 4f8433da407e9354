// Package redirect is what the two rule backends share: the interface a
// backend implements (Backend), the chain names both use (those of Consul's
// SDK), address families, and entering a pod's network namespace.
//
// The backends are siblings: package iptables writes the nat-table rules of
// Consul's SDK v0.18.1 (the version consul-k8s pins) with one atomic
// iptables-restore per family; package nftables writes the SDK v0.19.0's
// table inet consul_tproxy in one netlink transaction. Each finds, without
// running any tool, what of its rules are in a namespace (Leftovers), so that
// the other one, configured instead, removes them: a pod moved between
// backends (a re-ADD with the other one) keeps nothing of the old one, and
// CHECK fails when both are there.
//
// The packages know nothing of Kubernetes.
package redirect

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
)

// Backend writes the redirect rules of a pod into its network namespace, the
// path netns (CNI_NETNS), one way.
type Backend interface {
	// Apply writes the rules of cfg, replacing any of ours, and removes
	// what the other backend left (its Leftovers). When it fails it leaves
	// nothing of ours there (fail closed).
	Apply(ctx context.Context, netns string, cfg annotations.TrafficConfig) error
	// Check returns an error naming every way the namespace's rules differ
	// from cfg's, the other backend's rules beside ours among them.
	Check(ctx context.Context, netns string, cfg annotations.TrafficConfig) error
	// Remove deletes the rules of both backends; nil when there are none
	// or the namespace is gone.
	Remove(ctx context.Context, netns string) error
	// Leftovers finds, without running any tool, which rules of this
	// backend are or may be in the namespace: what the other backend asks
	// before it removes them or complains.
	Leftovers(ctx context.Context, netns string) (Leftovers, error)
	// RemoveLeftovers removes what Leftovers found.
	RemoveLeftovers(ctx context.Context, netns string, l Leftovers) error
}

// Leftovers are the rules of one backend found in a namespace, without
// running any tool.
type Leftovers struct {
	// Table: the nftables backend's table inet consul_tproxy.
	Table bool
	// IptablesNFT: an ip or ip6 nat table of nf_tables holds one of
	// Chains (the iptables backend, variant nft).
	IptablesNFT bool
	// IptablesLegacy: the x_tables nat table exists in the namespace. The
	// kernel creates it only once something uses it, so a fresh pod
	// namespace has none; when it exists, it may hold Chains (the iptables
	// backend, variant legacy).
	IptablesLegacy bool
}

// Any reports whether some rules may be there.
func (l Leftovers) Any() bool { return l.Table || l.IptablesNFT || l.IptablesLegacy }

// Certain reports whether some rules are there for sure (an x_tables nat
// table may hold none).
func (l Leftovers) Certain() bool { return l.Table || l.IptablesNFT }

func (l Leftovers) String() string {
	var s []string
	if l.Table {
		s = append(s, "table inet consul_tproxy (nftables backend)")
	}
	if l.IptablesNFT {
		s = append(s, "chains in the nat table of iptables-nft (iptables backend)")
	}
	if l.IptablesLegacy {
		s = append(s, "the nat table of iptables-legacy (iptables backend)")
	}
	if len(s) == 0 {
		return "nothing"
	}
	return strings.Join(s, " and ")
}

// CleanupTimeout bounds the removal of partial rules after a failure. It
// runs on a context of its own: the failure may be the caller's deadline.
const CleanupTimeout = 10 * time.Second

// Family is an address family: which of iptables or ip6tables a rule set
// belongs to.
type Family uint8

const (
	IPv4 Family = 4
	IPv6 Family = 6
)

func (f Family) String() string {
	switch f {
	case IPv4:
		return "ipv4"
	case IPv6:
		return "ipv6"
	}
	return "family(" + strconv.Itoa(int(f)) + ")"
}

// Families lists both families in the order they are applied.
var Families = []Family{IPv4, IPv6}

// Table is the iptables table the rules live in.
const Table = "nat"

// The chains Consul's SDK creates, with the SDK's names: the iptables
// backend's chains, and the regular chains of the nftables backend's table.
const (
	ChainInbound         = "CONSUL_PROXY_INBOUND"
	ChainInboundRedirect = "CONSUL_PROXY_IN_REDIRECT"
	ChainOutput          = "CONSUL_PROXY_OUTPUT"
	ChainOutputRedirect  = "CONSUL_PROXY_REDIRECT"
	ChainDNS             = "CONSUL_DNS_REDIRECT"
)

// Chains lists our chains in the order the SDK creates them. All five are
// always created, also when DNS redirection is off.
var Chains = []string{ChainInbound, ChainInboundRedirect, ChainOutput, ChainOutputRedirect, ChainDNS}

// IsOurChain reports whether a chain name is one of Chains.
func IsOurChain(name string) bool {
	for _, c := range Chains {
		if c == name {
			return true
		}
	}
	return false
}

// ErrNetnsGone is returned (wrapped) when the namespace path does not exist
// or is not a namespace any more.
var ErrNetnsGone = errors.New("network namespace does not exist")

// InNetns runs fn on an OS thread switched into the network namespace at
// path (the current namespace when path is empty). The thread is discarded
// afterwards, so no other goroutine ever runs in the namespace.
func InNetns(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the goroutine's exit terminates the thread, so a
		// thread left in the pod namespace is never reused.
		runtime.LockOSThread()
		h, err := netns.GetFromPath(path)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				err = fmt.Errorf("%s: %w", path, ErrNetnsGone)
			}
			errc <- err
			return
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			if errors.Is(err, unix.EINVAL) {
				// The path exists but is not a network namespace (any
				// more): an unmounted bind mount, a leftover file.
				err = fmt.Errorf("%w: setns: %v", ErrNetnsGone, err)
			}
			errc <- fmt.Errorf("enter netns %s: %w", path, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}
