// Package cnichain runs a CNI chain the way a container runtime does, through
// libcni: ptp + host-local, optionally followed by consul-cni, with the
// reference plugins and the consul-cni binary built by tests/harness/testbin. The
// privileged tests and the plugin benchmark use it.
package cnichain

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
)

// Options describe the chain.
type Options struct {
	// CNIVersion of the conflist; default 1.1.0.
	CNIVersion string
	// Subnet4 is the pod IPv4 subnet (required); Subnet6 adds IPv6.
	Subnet4, Subnet6 netip.Prefix
	// Consul is the consul-cni entry without "type"; nil leaves the plugin
	// out of the chain (a node where it was not installed yet).
	Consul map[string]any
}

// Chain is a conflist ready to run.
type Chain struct {
	CNI      *libcni.CNIConfig
	List     *libcni.NetworkConfigList
	Conflist []byte
	// BinDir holds the plugins, consul-cni included.
	BinDir string
}

// New builds the plugins (once per test process) and the conflist. Host-local
// keeps its state in a temporary directory of the test.
func New(tb testing.TB, o Options) *Chain {
	tb.Helper()
	if o.CNIVersion == "" {
		o.CNIVersion = "1.1.0"
	}
	dir := testbin.CNIPluginDir(tb)
	if o.Consul != nil {
		if d := filepath.Dir(testbin.Project(tb, "consul-cni")); d != dir {
			tb.Fatalf("cnichain: consul-cni built in %s, plugins in %s", d, dir)
		}
	}
	ranges := []any{[]any{map[string]string{"subnet": o.Subnet4.String()}}}
	routes := []any{map[string]string{"dst": "0.0.0.0/0"}}
	if o.Subnet6.IsValid() {
		ranges = append(ranges, []any{map[string]string{"subnet": o.Subnet6.String()}})
		routes = append(routes, map[string]string{"dst": "::/0"})
	}
	plugins := []any{map[string]any{
		"type": "ptp", "ipMasq": false, "mtu": 1500,
		"ipam": map[string]any{"type": "host-local", "dataDir": tb.TempDir(), "ranges": ranges, "routes": routes},
	}}
	if o.Consul != nil {
		entry := map[string]any{"type": "consul-cni"}
		for k, v := range o.Consul {
			entry[k] = v
		}
		plugins = append(plugins, entry)
	}
	conf, err := json.Marshal(map[string]any{"cniVersion": o.CNIVersion, "name": "ccr-test", "plugins": plugins})
	if err != nil {
		tb.Fatal(err)
	}
	list, err := libcni.ConfListFromBytes(conf)
	if err != nil {
		tb.Fatalf("cnichain: %v\n%s", err, conf)
	}
	return &Chain{
		CNI:      libcni.NewCNIConfigWithCacheDir([]string{dir}, tb.TempDir(), nil),
		List:     list,
		Conflist: conf,
		BinDir:   dir,
	}
}

// Runtime returns the runtime configuration for a container: CNI_ARGS start
// with IgnoreUnknown=1 as containerd sends them, followed by args.
func Runtime(containerID, netns string, args ...[2]string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{
		ContainerID: containerID,
		NetNS:       netns,
		IfName:      "eth0",
		Args:        append([][2]string{{"IgnoreUnknown", "1"}}, args...),
	}
}

// Add runs ADD of the whole chain.
func (c *Chain) Add(ctx context.Context, rt *libcni.RuntimeConf) (types.Result, error) {
	return c.CNI.AddNetworkList(ctx, c.List, rt)
}

// Check runs CHECK of the whole chain.
func (c *Chain) Check(ctx context.Context, rt *libcni.RuntimeConf) error {
	return c.CNI.CheckNetworkList(ctx, c.List, rt)
}

// Del runs DEL of the whole chain.
func (c *Chain) Del(ctx context.Context, rt *libcni.RuntimeConf) error {
	return c.CNI.DelNetworkList(ctx, c.List, rt)
}

// Status runs STATUS of the whole chain.
func (c *Chain) Status(ctx context.Context) error {
	return c.CNI.GetStatusNetworkList(ctx, c.List)
}

// ExecConsul runs the consul-cni binary alone, as the runtime would run the
// last plugin of the chain: cmd is ADD, CHECK or DEL, prevResult the result
// of the plugins before it. It returns stdout and stderr.
func (c *Chain) ExecConsul(ctx context.Context, cmd string, rt *libcni.RuntimeConf, prevResult types.Result) ([]byte, []byte, error) {
	var entry map[string]any
	for _, p := range c.List.Plugins {
		if p.Network.Type == "consul-cni" {
			if err := json.Unmarshal(p.Bytes, &entry); err != nil {
				return nil, nil, err
			}
		}
	}
	if entry == nil {
		return nil, nil, fmt.Errorf("no consul-cni in the chain")
	}
	entry["cniVersion"] = c.List.CNIVersion
	entry["name"] = c.List.Name
	if prevResult != nil {
		r, err := prevResult.GetAsVersion(c.List.CNIVersion)
		if err != nil {
			return nil, nil, err
		}
		b, _ := json.Marshal(r)
		var m map[string]any
		json.Unmarshal(b, &m)
		entry["prevResult"] = m
	}
	stdin, _ := json.Marshal(entry)
	var args []string
	for _, a := range rt.Args {
		args = append(args, a[0]+"="+a[1])
	}
	x := exec.CommandContext(ctx, filepath.Join(c.BinDir, "consul-cni"))
	x.Env = append(os.Environ(), "CNI_COMMAND="+cmd, "CNI_CONTAINERID="+rt.ContainerID, "CNI_NETNS="+rt.NetNS,
		"CNI_IFNAME="+rt.IfName, "CNI_PATH="+c.BinDir, "CNI_ARGS="+strings.Join(args, ";"))
	x.Stdin = strings.NewReader(string(stdin))
	var stdout, stderr strings.Builder
	x.Stdout, x.Stderr = &stdout, &stderr
	err := x.Run()
	return []byte(stdout.String()), []byte(stderr.String()), err
}
