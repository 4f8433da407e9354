package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cmdutil"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install"
)

func parse(t *testing.T, args []string) (*options, []string, error) {
	t.Helper()
	o := &options{}
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	o.AddFlags(fs)
	cmdutil.NewLogging().AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, nil, err
	}
	return o, fs.Args(), o.Validate()
}

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		wantErr string
	}{
		{[]string{"--cni-net-dir=etc/cni"}, "--cni-net-dir"},
		{[]string{"--host-cni-bin-dir=opt"}, "--host-cni-bin-dir"},
		{[]string{"--log-level=loud"}, "--log-level"},
		{[]string{"--resync=10ms"}, "--resync"},
		{[]string{"--metrics-bind-address=9090"}, "--metrics-bind-address"},
		{[]string{"--exclude-namespaces=kube-system,Bad_NS"}, "--exclude-namespaces"},
		{[]string{"--namespace=Bad_NS"}, "--namespace"},
		{[]string{"--daemonset=a/b"}, "--daemonset"},
		{[]string{"--timeout=0s"}, "--timeout"},
	} {
		if _, _, err := parse(t, tc.args); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%v: err = %v, want %q", tc.args, err, tc.wantErr)
		}
	}
	o, _, err := parse(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	exe, _ := os.Executable()
	if o.PluginBinary != filepath.Join(filepath.Dir(exe), "consul-cni") {
		t.Errorf("default plugin binary %q", o.PluginBinary)
	}
}

func TestExitCodes(t *testing.T) {
	if code := run([]string{"bogus"}); code != 2 {
		t.Errorf("unknown subcommand: exit %d", code)
	}
	if code := run([]string{"uninstall-all"}); code != 2 {
		t.Errorf("uninstall-all without --namespace: exit %d", code)
	}
	if code := run([]string{"ready", "extra"}); code != 2 {
		t.Errorf("two subcommands: exit %d", code)
	}
	dir := t.TempDir()
	args := []string{"ready", "--cni-bin-dir", filepath.Join(dir, "bin"), "--cni-net-dir", filepath.Join(dir, "net"), "--plugin-binary", filepath.Join(dir, "p")}
	if code := run(args); code != 1 {
		t.Errorf("ready on an empty node: exit %d", code)
	}
	args[0] = "uninstall"
	if code := run(args); code != 1 {
		t.Errorf("uninstall with directories that do not exist: exit %d", code)
	}
	for _, d := range []string{"bin", "net"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if code := run(args); code != 0 {
		t.Errorf("uninstall on an empty node: exit %d", code)
	}
	if code := run(append(args, "--expect-installed")); code != 1 {
		t.Errorf("uninstall --expect-installed on an empty node: exit %d", code)
	}
	if err := os.WriteFile(filepath.Join(dir, "bin", "consul-cni"), []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	args[0] = "uninstalled"
	if code := run(args); code != 1 {
		t.Errorf("uninstalled with the binary in place: exit %d", code)
	}
	args[0] = "uninstall"
	if code := run(append(args, "--expect-installed")); code != 0 {
		t.Errorf("uninstall --expect-installed with the binary in place: exit %d", code)
	}
	args[0] = "uninstalled"
	if code := run(args); code != 0 {
		t.Errorf("uninstalled on a clean node: exit %d", code)
	}
}

// The DaemonSet in manifests/ must run the installer with arguments it
// accepts, probe readiness with the same directories, and mount the host
// directories the flags name.
func TestDaemonSetArguments(t *testing.T) {
	// go test runs a test in its package's directory.
	b, err := os.ReadFile(filepath.Join("..", "..", "manifests", "base", "cni", "daemonset.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict(b, &ds); err != nil {
		t.Fatal(err)
	}
	spec := ds.Spec.Template.Spec
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers", len(spec.Containers))
	}
	c := spec.Containers[0]
	if len(c.Command) != 1 || c.Command[0] != "consul-cni-installer" {
		t.Fatalf("command %v", c.Command)
	}
	run, sub, err := parse(t, c.Args)
	if err != nil || len(sub) != 1 || sub[0] != "run" {
		t.Fatalf("args %v: %v (subcommand %v)", c.Args, err, sub)
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.Exec == nil {
		t.Fatal("no exec readiness probe")
	}
	pc := c.ReadinessProbe.Exec.Command
	if len(pc) < 2 || pc[0] != "consul-cni-installer" {
		t.Fatalf("probe %v", pc)
	}
	ready, sub, err := parse(t, pc[1:])
	if err != nil || len(sub) != 1 || sub[0] != "ready" {
		t.Fatalf("probe args %v: %v (subcommand %v)", pc[1:], err, sub)
	}
	if run.BinDir != ready.BinDir || run.NetDir != ready.NetDir || run.HostNetDir != ready.HostNetDir || run.HostBinDir != ready.HostBinDir {
		t.Errorf("run and ready see different directories: %+v vs %+v", run, ready)
	}
	hostPaths := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	mounted := map[string]string{} // mount path -> host path
	for _, m := range c.VolumeMounts {
		if hp, ok := hostPaths[m.Name]; ok {
			mounted[m.MountPath] = hp
		}
	}
	for _, pair := range [][2]string{{run.BinDir, run.HostBinDir}, {run.NetDir, run.HostNetDir}} {
		if hp, ok := mounted[pair[0]]; !ok || hp != pair[1] {
			t.Errorf("%s should be hostPath %s mounted there; mounts %v", pair[0], pair[1], mounted)
		}
	}
}

// keysWithoutFlag are the keys of install.Config no flag sets: the command
// fills them itself (Version is the build's stamped version).
var keysWithoutFlag = map[string]bool{"Client": true, "Debounce": true, "PodAlive": true, "PodGone": true, "Recheck": true, "Metrics": true, "Version": true, "Decide": true}

func TestEveryConfigKeyHasAFlag(t *testing.T) {
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	(&options{}).AddFlags(fs)
	for f := range reflect.TypeFor[install.Config]().Fields() {
		if keysWithoutFlag[f.Name] {
			continue
		}
		flag, ok := configFlags[f.Name]
		if !ok {
			t.Errorf("key %s has no flag in configFlags", f.Name)
		} else if fs.Lookup(flag) == nil {
			t.Errorf("key %s maps to --%s, which is not a flag", f.Name, flag)
		}
	}
}

func TestValidateNamesTheFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--cni-bin-dir="}, `--cni-bin-dir: must be set`},
		{[]string{"--host-cni-net-dir=etc"}, `--host-cni-net-dir: "etc" is not an absolute path`},
		{[]string{"--log-level=loud"}, `--log-level: "loud" is not a log level`},
		{[]string{"--exclude-namespaces=Bad_NS"}, `--exclude-namespaces: "Bad_NS" is not a namespace name`},
		{[]string{"--backend=nft"}, `--backend: "nft" is not a redirect backend`},
	} {
		if _, _, err := parse(t, tc.args); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want %q", tc.args, err, tc.want)
		}
	}
	// The plugin's levels, off included, are the installer's.
	for _, l := range cniconf.LogLevels {
		if _, _, err := parse(t, []string{"--log-level=" + l}); err != nil {
			t.Errorf("--log-level=%s: %v", l, err)
		}
	}
}

// --backend reaches the chain entry; unset, the entry has no backend key.
func TestBackendFlagReachesTheEntry(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{{nil, ""}, {[]string{"--backend=nftables"}, "nftables"}, {[]string{"--backend=iptables"}, "iptables"}} {
		o, _, err := parse(t, append(tc.args, "--plugin-binary=/bin/true"))
		if err != nil {
			t.Fatal(err)
		}
		in, err := install.New(o.config())
		if err != nil {
			t.Fatal(err)
		}
		if got := in.Entry().Backend; got != tc.want {
			t.Errorf("%v: entry backend %q, want %q", tc.args, got, tc.want)
		}
	}
}
