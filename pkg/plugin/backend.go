package plugin

import (
	"context"
	"log/slog"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/iptables"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/nftables"
)

// backend returns the configured rule backend, wired to the other one: it
// removes whatever the other left in a pod namespace, so switching a pod
// between backends (a re-ADD) leaves nothing of the old one.
func (p *Plugin) backend(conf *Config, log *slog.Logger) redirect.Backend {
	ipt := &iptables.Backend{
		Tools: func(ctx context.Context, netns string, v *iptables.Variant) (iptables.Executor, error) {
			c := conf
			if v != nil {
				cv := *conf
				cv.iptablesVariant, cv.autoVariant = *v, false
				c = &cv
			}
			return p.NewExecutor(ctx, c, netns, log)
		},
		Find: p.Nftables.FindIptablesRules,
		Log:  log,
	}
	nft := &nftables.Backend{Kernel: p.Nftables, Other: ipt}
	ipt.Other = nft
	if conf.nftables() {
		return nft
	}
	return ipt
}
