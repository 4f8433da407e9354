package plugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/nftables"
)

// Nftables is the kernel side of the nftables backend: nftables.Netlink, or
// an in-memory double in tests.
type Nftables interface {
	Apply(ctx context.Context, nsPath string, t nftables.Table) error
	Check(ctx context.Context, nsPath string, t nftables.Table) error
	Remove(ctx context.Context, nsPath string) error
	Present(ctx context.Context, nsPath string) (bool, error)
	FindIptablesRules(ctx context.Context, nsPath string) (nftables.IptablesRules, error)
	ApplyUnlessIptables(ctx context.Context, nsPath string, t nftables.Table) (nftables.IptablesRules, error)
}

// rules applies, checks and removes one target's rules in one pod
// namespace with the configured backend, and removes whatever the other
// backend left there, so switching a pod between backends (a re-ADD)
// leaves nothing of the old one.
type rules struct {
	p     *Plugin
	conf  *Config
	netns string
	log   *slog.Logger
}

func (p *Plugin) rules(conf *Config, netns string, log *slog.Logger) *rules {
	return &rules{p: p, conf: conf, netns: netns, log: log}
}

// executor is the iptables executor of the configured variant, or of the
// given one when b is not nil (removing rules found by their variant).
func (r *rules) executor(ctx context.Context, b *redirect.Backend) (redirect.Executor, error) {
	conf := r.conf
	if b != nil {
		c := *r.conf
		c.iptablesVariant, c.autoVariant = *b, false
		conf = &c
	}
	return r.p.NewExecutor(ctx, conf, r.netns, r.log)
}

func (r *rules) apply(ctx context.Context, tg *target) error {
	if r.conf.nftables() {
		t := nftables.Build(tg.cfg)
		found, err := r.p.Nftables.ApplyUnlessIptables(ctx, r.netns, t)
		if err != nil || !found.Any() {
			return err
		}
		if err := r.removeFound(ctx, found); err != nil {
			return fmt.Errorf("removing the iptables backend's rules: %w", err)
		}
		return r.p.Nftables.Apply(ctx, r.netns, t)
	}
	ex, err := r.executor(ctx, nil)
	if err != nil {
		return err
	}
	if err := redirect.Apply(ctx, ex, redirect.Build(tg.cfg)); err != nil {
		return err
	}
	if err := r.p.Nftables.Remove(ctx, r.netns); err != nil {
		if rerr := redirect.Remove(context.WithoutCancel(ctx), ex, redirect.Families); rerr != nil {
			r.log.Error("removing the rules after failing to remove the nftables table", "error", rerr)
		}
		return fmt.Errorf("removing the nftables backend's table inet %s: %w", nftables.TableName, err)
	}
	return nil
}

func (r *rules) check(ctx context.Context, tg *target) error {
	if r.conf.nftables() {
		if err := r.p.Nftables.Check(ctx, r.netns, nftables.Build(tg.cfg)); err != nil {
			return err
		}
		found, err := r.p.Nftables.FindIptablesRules(ctx, r.netns)
		if err != nil {
			return err
		}
		if found.NFT {
			return fmt.Errorf("the nat table (iptables-nft) still holds chains of the iptables backend beside table inet %s", nftables.TableName)
		}
		return nil
	}
	ex, err := r.executor(ctx, nil)
	if err != nil {
		return err
	}
	if err := redirect.Check(ctx, ex, redirect.Build(tg.cfg)); err != nil {
		return err
	}
	ok, err := r.p.Nftables.Present(ctx, r.netns)
	if err != nil {
		return err
	}
	if ok {
		return fmt.Errorf("table inet %s of the nftables backend is present beside the iptables rules", nftables.TableName)
	}
	return nil
}

// remove deletes the rules of both backends (DEL, and ADD failing closed).
func (r *rules) remove(ctx context.Context) error {
	if r.conf.nftables() {
		return errors.Join(r.p.Nftables.Remove(ctx, r.netns), r.removeIptables(ctx))
	}
	nerr := r.p.Nftables.Remove(ctx, r.netns)
	ex, err := r.executor(ctx, nil)
	if err != nil {
		return errors.Join(nerr, err)
	}
	if err := redirect.Remove(ctx, ex, []redirect.Family{redirect.IPv4}); err != nil {
		if errors.Is(err, redirect.ErrNetnsGone) {
			return nerr
		}
		return errors.Join(nerr, err)
	}
	if err := redirect.Remove(ctx, ex, []redirect.Family{redirect.IPv6}); err != nil && !errors.Is(err, redirect.ErrNetnsGone) {
		// A node without IPv6 cannot even list the table; the namespace
		// is going away, so this is not worth failing for.
		r.log.Warn("could not remove IPv6 rules", "error", err)
	}
	return nerr
}

// removeIptables removes iptables rules of ours, running the tools only
// when FindIptablesRules says some may be there (a fresh pod namespace has
// none, so the nftables ADD never execs).
func (r *rules) removeIptables(ctx context.Context) error {
	found, err := r.p.Nftables.FindIptablesRules(ctx, r.netns)
	if err != nil || !found.Any() {
		return err
	}
	return r.removeFound(ctx, found)
}

// removeFound runs the iptables removal for each variant found.
func (r *rules) removeFound(ctx context.Context, found nftables.IptablesRules) error {
	var errs []error
	for _, v := range []struct {
		present bool
		backend redirect.Backend
	}{{found.NFT, redirect.BackendNFT}, {found.Legacy, redirect.BackendLegacy}} {
		if !v.present {
			continue
		}
		b := v.backend
		ex, err := r.executor(ctx, &b)
		if err == nil {
			err = redirect.Remove(ctx, ex, redirect.Families)
		}
		if err != nil && !errors.Is(err, redirect.ErrNetnsGone) {
			errs = append(errs, fmt.Errorf("%s: %w", b, err))
		}
	}
	return errors.Join(errs...)
}
