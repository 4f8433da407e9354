package iptables

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
)

// Backend is the iptables backend as a redirect.Backend.
type Backend struct {
	// Tools returns the executor of the iptables tools in the namespace at
	// netns: of variant when it is not nil (removing what that variant
	// left), else of the configured one.
	Tools func(ctx context.Context, netns string, variant *Variant) (Executor, error)
	// Find looks for iptables rules of ours in the namespace without
	// running a tool (nftables.FindIptablesRules: they live in nf_tables
	// or in an x_tables nat table).
	Find func(ctx context.Context, netns string) (redirect.Leftovers, error)
	// Other is the nftables backend, whose leftovers Apply and Remove
	// remove and Check reports.
	Other redirect.Backend
	// Log receives what is not worth failing for.
	Log *slog.Logger
}

// Apply writes the rules, then removes the nftables backend's table; when
// that fails, it removes the rules again (fail closed).
func (b *Backend) Apply(ctx context.Context, netns string, cfg annotations.TrafficConfig) error {
	ex, err := b.Tools(ctx, netns, nil)
	if err != nil {
		return err
	}
	if err := Apply(ctx, ex, Build(cfg)); err != nil {
		return err
	}
	if err := b.removeOther(ctx, netns); err != nil {
		if rerr := Remove(context.WithoutCancel(ctx), ex, redirect.Families); rerr != nil {
			b.Log.Error("removing the rules after failing to remove the nftables backend's", "error", rerr)
		}
		return err
	}
	return nil
}

// Check compares the rules and fails when the nftables backend's table is
// there too.
func (b *Backend) Check(ctx context.Context, netns string, cfg annotations.TrafficConfig) error {
	ex, err := b.Tools(ctx, netns, nil)
	if err != nil {
		return err
	}
	if err := Check(ctx, ex, Build(cfg)); err != nil {
		return err
	}
	other, err := b.Other.Leftovers(ctx, netns)
	if err != nil {
		return err
	}
	if other.Certain() {
		return fmt.Errorf("%s is present beside the iptables rules", other)
	}
	return nil
}

// Remove deletes the nftables backend's table and the rules: IPv4 first,
// whose failure fails it, then IPv6, whose failure is only logged (a node
// without IPv6 cannot even list its table, and the namespace is going away).
func (b *Backend) Remove(ctx context.Context, netns string) error {
	oerr := b.removeOther(ctx, netns)
	ex, err := b.Tools(ctx, netns, nil)
	if err != nil {
		return errors.Join(oerr, err)
	}
	if err := Remove(ctx, ex, []redirect.Family{redirect.IPv4}); err != nil {
		if errors.Is(err, redirect.ErrNetnsGone) {
			return oerr
		}
		return errors.Join(oerr, err)
	}
	if err := Remove(ctx, ex, []redirect.Family{redirect.IPv6}); err != nil && !errors.Is(err, redirect.ErrNetnsGone) {
		b.Log.Warn("could not remove IPv6 rules", "error", err)
	}
	return oerr
}

// removeOther removes what the nftables backend left.
func (b *Backend) removeOther(ctx context.Context, netns string) error {
	other, err := b.Other.Leftovers(ctx, netns)
	if err != nil || !other.Any() {
		return err
	}
	if err := b.Other.RemoveLeftovers(ctx, netns, other); err != nil {
		return fmt.Errorf("removing %s: %w", other, err)
	}
	return nil
}

// Leftovers finds iptables rules of ours (Find).
func (b *Backend) Leftovers(ctx context.Context, netns string) (redirect.Leftovers, error) {
	return b.Find(ctx, netns)
}

// RemoveLeftovers removes the rules of each variant found, with that
// variant's tools.
func (b *Backend) RemoveLeftovers(ctx context.Context, netns string, l redirect.Leftovers) error {
	var errs []error
	for _, v := range []struct {
		present bool
		variant Variant
	}{{l.IptablesNFT, VariantNFT}, {l.IptablesLegacy, VariantLegacy}} {
		if !v.present {
			continue
		}
		variant := v.variant
		ex, err := b.Tools(ctx, netns, &variant)
		if err == nil {
			err = Remove(ctx, ex, redirect.Families)
		}
		if err != nil && !errors.Is(err, redirect.ErrNetnsGone) {
			errs = append(errs, fmt.Errorf("%s: %w", variant, err))
		}
	}
	return errors.Join(errs...)
}
