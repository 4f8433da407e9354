package main

import (
	"testing"

	"github.com/spf13/pflag"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/audit"
)

// The audit takes the controller's detection flags under the same names,
// with the same defaults and help.
func TestAuditSharesDetectionFlags(t *testing.T) {
	ctl := pflag.NewFlagSet("repair", pflag.ContinueOnError)
	newOptions().AddFlags(ctl)
	aud := pflag.NewFlagSet("audit", pflag.ContinueOnError)
	audit.NewOptions().AddFlags(aud)
	for _, name := range []string{"min-pod-age", "sandbox-slack", "init-container-name", "init-exit-code", "cni-ready-gate",
		"injected-pod-selector", "allow-bare-pods", "circuit-breaker", "breaker-threshold", "breaker-min-pods", "action",
		"cni-namespace", "cni-pod-selector", "kubeconfig"} {
		c, a := ctl.Lookup(name), aud.Lookup(name)
		if c == nil || a == nil {
			t.Errorf("--%s: controller %v, audit %v: want both", name, c != nil, a != nil)
			continue
		}
		if c.DefValue != a.DefValue || c.Usage != a.Usage || c.Value.Type() != a.Value.Type() {
			t.Errorf("--%s: controller %s %q (%s), audit %s %q (%s)", name, c.Value.Type(), c.DefValue, c.Usage, a.Value.Type(), a.DefValue, a.Usage)
		}
	}
}

func TestSubcommand(t *testing.T) {
	for _, tc := range []struct {
		argv  []string
		audit bool
		name  string
		args  int
		err   bool
	}{
		{[]string{"/bin/repair", "--dry-run"}, false, "repair", 1, false},
		{[]string{"repair"}, false, "repair", 0, false},
		{[]string{"repair", "audit", "-A"}, true, "repair audit", 1, false},
		{[]string{"/usr/local/bin/kubectl-consul_cni", "audit", "-o", "json"}, true, "kubectl consul-cni audit", 2, false},
		{[]string{"kubectl-consul_cni"}, false, "kubectl consul-cni", 0, true},
		{[]string{"kubectl-consul_cni", "--dry-run"}, false, "kubectl consul-cni", 1, true},
	} {
		isAudit, name, args, err := subcommand(tc.argv)
		if isAudit != tc.audit || name != tc.name || len(args) != tc.args || (err != nil) != tc.err {
			t.Errorf("%q: audit %v name %q args %q err %v", tc.argv, isAudit, name, args, err)
		}
	}
}
