package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/audit"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair"
)

// keysWithoutFlag are the keys of repair.ManagerConfig no flag sets.
var keysWithoutFlag = map[string]string{
	"Config":   "embedded: its own fields are checked",
	"Identity": "the lease identity is the hostname and a random suffix",
}

func configKeys(t reflect.Type) []string {
	var keys []string
	for f := range t.Fields() {
		if f.Anonymous {
			keys = append(keys, configKeys(f.Type)...)
		}
		keys = append(keys, f.Name)
	}
	return keys
}

func TestEveryConfigKeyHasAFlag(t *testing.T) {
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	newOptions().AddFlags(fs)
	for _, k := range configKeys(reflect.TypeFor[repair.ManagerConfig]()) {
		if _, ok := keysWithoutFlag[k]; ok {
			continue
		}
		f, ok := configFlags[k]
		if !ok {
			t.Errorf("key %s has no flag in configFlags", k)
			continue
		}
		if fs.Lookup(f) == nil {
			t.Errorf("key %s maps to --%s, which is not a flag", k, f)
		}
	}
}

func TestValidateNamesTheFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--action=explode"}, `--action: "explode" is not one of`},
		{[]string{"--cni-ready-gate=maybe"}, "--cni-ready-gate: "},
		{[]string{"--workers=0"}, "--workers: 0 must be at least 1"},
		{[]string{"--init-container-name="}, "--init-container-name: "},
		{[]string{"--backoff-base=2s", "--backoff-max=1s"}, "--backoff-base/--backoff-max: 2s/1s"},
		{[]string{"--breaker-threshold=2"}, "--breaker-threshold: "},
		{[]string{"--startup-taint-effect=Sometimes"}, "--startup-taint-effect: "},
		{[]string{"--leader-election-id="}, "--leader-election-id: "},
		{[]string{"--leader-election-retry-period=1h"}, "--leader-election-retry-period/--leader-election-renew-deadline/--leader-election-lease-duration: "},
		{[]string{"--kube-api-qps=0"}, "--kube-api-qps"},
	} {
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		o := newOptions()
		o.AddFlags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		err := o.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want %q", tc.args, err, tc.want)
		}
	}
}

// The audit takes the controller's detection flags under the same names,
// with the same defaults and help.
func TestAuditSharesDetectionFlags(t *testing.T) {
	ctl := pflag.NewFlagSet("repair", pflag.ContinueOnError)
	newOptions().AddFlags(ctl)
	aud := pflag.NewFlagSet("audit", pflag.ContinueOnError)
	audit.NewOptions().AddFlags(aud)
	for _, name := range []string{"min-pod-age", "sandbox-slack", "init-container-name", "init-exit-code", "cni-ready-gate",
		"injected-pod-selector", "allow-bare-pods", "circuit-breaker", "breaker-threshold", "breaker-min-pods", "action",
		"cni-namespace", "cni-pod-selector"} {
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

// Under the plugin's name, --help and --version answer with exit 0, as
// kubectl plugins do; repair's own and the audit's are left to their flag
// sets.
func TestPluginHelpAndVersion(t *testing.T) {
	for _, tc := range []struct {
		argv           []string
		done           bool
		stdout, stderr string
	}{
		{[]string{"/usr/local/bin/kubectl-consul_cni", "--help"}, true, "", "Usage: kubectl consul-cni audit [flags]"},
		{[]string{"kubectl-consul_cni", "-h"}, true, "", "audit --help"},
		{[]string{"kubectl-consul_cni", "--version"}, true, "kubectl consul-cni ", ""},
		{[]string{"kubectl-consul_cni", "audit", "--help"}, false, "", ""},
		{[]string{"kubectl-consul_cni", "--help", "audit"}, false, "", ""},
		{[]string{"repair", "--help"}, false, "", ""},
		{[]string{"repair", "--version"}, false, "", ""},
	} {
		var stdout, stderr strings.Builder
		done := pluginHelp(tc.argv, &stdout, &stderr)
		if done != tc.done || !strings.Contains(stdout.String(), tc.stdout) || !strings.Contains(stderr.String(), tc.stderr) ||
			(!done && stdout.Len()+stderr.Len() > 0) {
			t.Errorf("%q: done %v, stdout %q, stderr %q; want done %v, %q and %q", tc.argv, done, stdout.String(), stderr.String(), tc.done, tc.stdout, tc.stderr)
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

// The Lease and the CNI DaemonSet's pods are in the controller's own
// namespace unless a flag says otherwise: $POD_NAMESPACE (the downward API
// in the manifests), else the service account's namespace file, so a
// kustomize namespace: override or a Helm release in any namespace needs no
// argument.
func TestNamespacesDefaultToTheControllersOwn(t *testing.T) {
	dir := t.TempDir()
	saFile := filepath.Join(dir, "namespace")
	old := serviceAccountNamespaceFile
	serviceAccountNamespaceFile = saFile
	t.Cleanup(func() { serviceAccountNamespaceFile = old })
	parse := func(args ...string) *options {
		t.Helper()
		o := newOptions()
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		o.AddFlags(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		if err := o.Validate(); err != nil {
			t.Fatal(err)
		}
		return o
	}
	t.Setenv("POD_NAMESPACE", "mesh-system")
	if o := parse(); o.cfg.LeaseNamespace != "mesh-system" || o.cfg.CNINamespace != "mesh-system" {
		t.Errorf("POD_NAMESPACE=mesh-system: lease %q, CNI %q", o.cfg.LeaseNamespace, o.cfg.CNINamespace)
	}
	if o := parse("--cni-namespace=consul", "--leader-election-namespace=leases"); o.cfg.LeaseNamespace != "leases" || o.cfg.CNINamespace != "consul" {
		t.Errorf("flags: lease %q, CNI %q", o.cfg.LeaseNamespace, o.cfg.CNINamespace)
	}
	t.Setenv("POD_NAMESPACE", "")
	if err := os.WriteFile(saFile, []byte("from-sa\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if o := parse(); o.cfg.LeaseNamespace != "from-sa" || o.cfg.CNINamespace != "from-sa" {
		t.Errorf("service account namespace: lease %q, CNI %q", o.cfg.LeaseNamespace, o.cfg.CNINamespace)
	}
	os.Remove(saFile)
	if o := parse(); o.cfg.LeaseNamespace != "consul-cni-repair" || o.cfg.CNINamespace != "consul-cni-repair" {
		t.Errorf("outside a pod: lease %q, CNI %q", o.cfg.LeaseNamespace, o.cfg.CNINamespace)
	}
}
