// Package cnichain runs a CNI chain the way a container runtime does, through
// libcni: ptp + host-local, optionally followed by consul-cni, with the
// reference plugins and the consul-cni binary built by tests/harness/testbin. The
// privileged tests and the plugin benchmark use it.
//
// A runtime runs the plugins in its node's network namespace, and so does a
// Chain: in a namespace of its own linked to the test slot's router
// (testnet.Range.NewNode) with the chain's pod subnets routed to it, never in
// the host's (ptp would make its veths, routes and forwarding switch there).
// NodeExec gives the same to any libcni caller.
package cnichain

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
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
	// Loopback are addresses on the host's loopback (host:port) that the
	// node namespace forwards from its own loopback, such as the local
	// apiserver a kubeconfig of the plugin names.
	Loopback []string
}

// Chain is a conflist ready to run.
type Chain struct {
	CNI      *libcni.CNIConfig
	List     *libcni.NetworkConfigList
	Conflist []byte
	// BinDir holds the plugins, consul-cni included.
	BinDir string

	tb       testing.TB
	subnets  []netip.Prefix
	loopback []string
	node     *testnet.Netns
	once     sync.Once
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
	c := &Chain{List: list, Conflist: conf, BinDir: dir, tb: tb, subnets: []netip.Prefix{o.Subnet4}, loopback: o.Loopback}
	if o.Subnet6.IsValid() {
		c.subnets = append(c.subnets, o.Subnet6)
	}
	c.CNI = libcni.NewCNIConfigWithCacheDir([]string{dir}, tb.TempDir(), chainExec{c})
	return c
}

// Node is the namespace the chain's plugins run in (the node's side of the
// pods' veths), made on first use.
func (c *Chain) Node() *testnet.Netns {
	c.once.Do(func() {
		c.node = testnet.Reserve(c.tb).NewNode(c.tb, "node", c.subnets...)
		for _, a := range c.loopback {
			forward(c.tb, c.node, a)
		}
	})
	return c.node
}

// forward listens at addr in the namespace and relays every connection to
// addr on the host, until the test ends.
func forward(tb testing.TB, ns *testnet.Netns, addr string) {
	l, err := ns.Listen("tcp", addr)
	if err != nil {
		tb.Fatalf("cnichain: forwarding %s into %s: %v", addr, ns.Name, err)
	}
	tb.Cleanup(func() { l.Close() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go testnet.Relay(conn, addr) // dials in the host's namespace: this goroutine never entered another
		}
	}()
}

// chainExec runs the plugins in the chain's node namespace.
type chainExec struct{ c *Chain }

func (e chainExec) ExecPlugin(ctx context.Context, path string, stdin []byte, env []string) ([]byte, error) {
	return NodeExec(e.c.Node().Path, nil).ExecPlugin(ctx, path, stdin, env)
}

func (e chainExec) FindInPath(plugin string, paths []string) (string, error) {
	return invoke.FindInPath(plugin, paths)
}

func (e chainExec) Decode(b []byte) (version.PluginInfo, error) {
	return (&version.PluginDecoder{}).Decode(b)
}

// NodeExec is libcni's plugin runner with the plugins started inside the
// network namespace at netnsPath, as a runtime on that node starts them;
// their stderr goes to stderr (nil: discarded).
func NodeExec(netnsPath string, stderr io.Writer) invoke.Exec {
	return nodeExec{DefaultExec: &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: stderr}, PluginDecoder: version.PluginDecoder{}}, netns: netnsPath}
}

type nodeExec struct {
	*invoke.DefaultExec
	netns string
}

// ExecPlugin starts the plugin from a thread switched into the namespace:
// the child inherits the thread's network namespace.
func (e nodeExec) ExecPlugin(ctx context.Context, path string, stdin []byte, env []string) ([]byte, error) {
	var out []byte
	err := testnet.DoIn(e.netns, func() (err error) {
		out, err = e.DefaultExec.ExecPlugin(ctx, path, stdin, env)
		return err
	})
	return out, err
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
	err := x.Run() // consul-cni works in CNI_NETNS only: no node namespace needed
	return []byte(stdout.String()), []byte(stderr.String()), err
}
