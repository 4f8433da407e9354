package nftables

import (
	"context"
	"errors"
	"fmt"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
)

// Backend is the nftables backend as a redirect.Backend.
type Backend struct {
	// Kernel is where the table goes: Netlink.
	Kernel Kernel
	// Other is the iptables backend, whose leftovers Apply and Remove
	// remove and Check reports.
	Other redirect.Backend
}

// Apply writes the table unless rules of the iptables backend may be in
// the namespace (ApplyUnlessIptables: a new sandbox has none, and its ADD
// is one netlink socket, one dump and one transaction); otherwise it has
// them removed first.
func (b *Backend) Apply(ctx context.Context, netns string, cfg annotations.TrafficConfig) error {
	t := Build(cfg)
	found, err := b.Kernel.ApplyUnlessIptables(ctx, netns, t)
	if err != nil || !found.Any() {
		return err
	}
	if err := b.Other.RemoveLeftovers(ctx, netns, found); err != nil {
		return fmt.Errorf("removing the iptables backend's rules: %w", err)
	}
	return b.Kernel.Apply(ctx, netns, t)
}

// Check compares the table and fails when chains of the iptables backend
// are in the nat table of nf_tables too.
func (b *Backend) Check(ctx context.Context, netns string, cfg annotations.TrafficConfig) error {
	if err := b.Kernel.Check(ctx, netns, Build(cfg)); err != nil {
		return err
	}
	found, err := b.Kernel.FindIptablesRules(ctx, netns)
	if err != nil {
		return err
	}
	if found.Certain() {
		return fmt.Errorf("the nat table (iptables-nft) still holds chains of the iptables backend beside table inet %s", TableName)
	}
	return nil
}

// Remove deletes the table and the iptables backend's rules, running the
// iptables tools only when FindIptablesRules says some may be there (a
// fresh pod namespace has none, so the nftables backend never execs).
func (b *Backend) Remove(ctx context.Context, netns string) error {
	err := b.Kernel.Remove(ctx, netns)
	found, ferr := b.Kernel.FindIptablesRules(ctx, netns)
	if ferr != nil || !found.Any() {
		return errors.Join(err, ferr)
	}
	return errors.Join(err, b.Other.RemoveLeftovers(ctx, netns, found))
}

// Leftovers reports the table (Present).
func (b *Backend) Leftovers(ctx context.Context, netns string) (redirect.Leftovers, error) {
	ok, err := b.Kernel.Present(ctx, netns)
	return redirect.Leftovers{Table: ok}, err
}

// RemoveLeftovers deletes the table when it was found.
func (b *Backend) RemoveLeftovers(ctx context.Context, netns string, l redirect.Leftovers) error {
	if !l.Table {
		return nil
	}
	return b.Kernel.Remove(ctx, netns)
}
