package simnode

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"github.com/containernetworking/cni/libcni"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	corev1 "k8s.io/api/core/v1"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cnichain"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/podnet"
)

// loopbackNetwork is the network containerd's CRI plugin always sets up
// first, with the same plugin directories.
const loopbackNetwork = `{"cniVersion":"1.0.0","name":"cni-loopback","plugins":[{"type":"loopback"}]}`

// PrimaryNetworkFile is the conflist SetupRoot writes.
const PrimaryNetworkFile = "10-ptp.conflist"

// loadNetwork returns the network a sandbox created now would get: the
// first configuration file in lexical order (.conf, .conflist, .json) that
// parses and has plugins, as containerd's CRI plugin picks it. The file is
// read afresh on every call.
func loadNetwork(dir string) (*libcni.NetworkConfigList, error) {
	files, err := libcni.ConfFiles(dir, []string{".conf", ".conflist", ".json"})
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	var errs []string
	for _, f := range files {
		var list *libcni.NetworkConfigList
		if strings.HasSuffix(f, ".conflist") {
			list, err = libcni.NetworkConfFromFile(f)
		} else {
			var conf *libcni.PluginConfig
			if conf, err = libcni.ConfFromFile(f); err == nil {
				list, err = libcni.ConfListFromConf(conf)
			}
		}
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", filepath.Base(f), err))
			continue
		}
		if len(list.Plugins) == 0 {
			continue
		}
		return list, nil
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("no valid networks found in %s: %s", dir, strings.Join(errs, "; "))
	}
	return nil, fmt.Errorf("no networks found in %s", dir)
}

// sandbox is a pod's network namespace and the networks attached to it.
type sandbox struct {
	id        string
	netnsName string
	netnsPath string
	ips       []netip.Addr
	// network is the configuration used at ADD. Teardown uses the node's
	// configuration at that time, as containerd does (so a plugin appended
	// since gets a DEL for a sandbox it never saw), and this one only when
	// the current one cannot be loaded.
	network *libcni.NetworkConfigList
	lo      *libcni.NetworkConfigList
}

func randomID() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

func (n *Node) runtimeConf(pod *corev1.Pod, sb *sandbox) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{
		ContainerID: sb.id,
		NetNS:       sb.netnsPath,
		IfName:      "eth0",
		Args: [][2]string{
			{"IgnoreUnknown", "1"},
			{"K8S_POD_NAMESPACE", pod.Namespace},
			{"K8S_POD_NAME", pod.Name},
			{"K8S_POD_INFRA_CONTAINER_ID", sb.id},
			{"K8S_POD_UID", string(pod.UID)},
		},
	}
}

// cniConfig runs the plugins from the node's bin dir, in the node's network
// namespace; what they print on stderr goes to the node's CNI log
// (containerd puts it in its own log).
func (n *Node) cniConfig() *libcni.CNIConfig {
	return libcni.NewCNIConfigWithCacheDir([]string{binDir(n.cfg.Root)}, cacheDir(n.cfg.Root), cnichain.NodeExec(n.net.path, n.cniLog))
}

// CNILog is the file that receives the plugins' stderr.
func (n *Node) CNILog() string { return filepath.Join(logsDir(n.cfg.Root), "..", "cni.log") }

// createSandbox makes the pod's network namespace and runs CNI ADD for the
// loopback network and the node's current network. On failure everything
// done so far is undone (CNI DEL, namespace removed).
func (n *Node) createSandbox(ctx context.Context, pod *corev1.Pod) (*sandbox, error) {
	network, err := loadNetwork(confDir(n.cfg.Root))
	if err != nil {
		return nil, fmt.Errorf("cni plugin not initialized: %w", err)
	}
	lo, err := libcni.NetworkConfFromBytes([]byte(loopbackNetwork))
	if err != nil {
		return nil, err
	}
	sb := &sandbox{id: randomID(), network: network, lo: lo}
	if n.cfg.Range != nil {
		sb.netnsName = n.cfg.Range.NetnsName("pod")
	} else {
		sb.netnsName = "ccr-simnode-" + sb.id[:12]
	}
	sb.netnsPath = filepath.Join("/run/netns", sb.netnsName)
	if out, err := exec.CommandContext(ctx, "ip", "netns", "add", sb.netnsName).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("create network namespace %s: %v: %s", sb.netnsName, err, strings.TrimSpace(string(out)))
	}
	cni := n.cniConfig()
	rt := n.runtimeConf(pod, sb)
	if _, err := cni.AddNetworkList(ctx, lo, rt); err != nil {
		n.destroySandbox(context.WithoutCancel(ctx), pod, sb)
		return nil, fmt.Errorf("plugin type=\"loopback\" failed (add): %w", err)
	}
	res, err := cni.AddNetworkList(ctx, network, rt)
	if err != nil {
		n.destroySandbox(context.WithoutCancel(ctx), pod, sb)
		return nil, fmt.Errorf("failed to setup network for sandbox %q: network %q: %w", sb.id, network.Name, err)
	}
	r, err := types100.GetResult(res)
	if err != nil {
		n.destroySandbox(context.WithoutCancel(ctx), pod, sb)
		return nil, fmt.Errorf("network %q: result: %w", network.Name, err)
	}
	for _, ip := range r.IPs {
		if ip.Interface != nil && *ip.Interface < len(r.Interfaces) && r.Interfaces[*ip.Interface].Sandbox == "" {
			continue // a host-side address
		}
		if a, ok := netip.AddrFromSlice(ip.Address.IP); ok {
			sb.ips = append(sb.ips, a.Unmap())
		}
	}
	if len(sb.ips) == 0 {
		n.destroySandbox(context.WithoutCancel(ctx), pod, sb)
		return nil, fmt.Errorf("network %q returned no IP for the pod", network.Name)
	}
	return sb, nil
}

// SandboxTry is the outcome of TrySandbox.
type SandboxTry struct {
	// Plugins are the plugin types of the network the sandbox got, in
	// chain order (read from the node's configuration at ADD).
	Plugins []string
	// Err is the ADD's error (nil: the sandbox was created).
	Err error
	// InspectErr is what the inspect function of TrySandbox returned.
	InspectErr error
}

// Chained tells whether the sandbox was created with plugin last in its
// chain.
func (s SandboxTry) Chained(plugin string) bool {
	return s.Err == nil && len(s.Plugins) > 0 && s.Plugins[len(s.Plugins)-1] == plugin
}

// TrySandbox creates a sandbox for pod exactly as the node does when it
// starts the pod (the network read from the node's configuration now,
// loopback and that network's ADD through libcni with containerd's
// CNI_ARGS) and tears it down at once, without running containers. It
// shows which chain a sandbox created at this moment would get; inspect
// (may be nil) is called with the network namespace's path before the
// teardown, to look at what the chain did there.
func (n *Node) TrySandbox(ctx context.Context, pod *corev1.Pod, inspect func(netns string) error) SandboxTry {
	sb, err := n.createSandbox(ctx, pod)
	if err != nil {
		var try SandboxTry
		if network, lerr := loadNetwork(confDir(n.cfg.Root)); lerr == nil {
			try.Plugins = pluginTypes(network)
		}
		try.Err = err
		return try
	}
	try := SandboxTry{Plugins: pluginTypes(sb.network)}
	if inspect != nil {
		try.InspectErr = inspect(sb.netnsPath)
	}
	if err := n.destroySandbox(context.WithoutCancel(ctx), pod, sb); err != nil {
		n.cfg.Logf("simnode %s: %v", n.cfg.Name, err)
	}
	return try
}

func pluginTypes(l *libcni.NetworkConfigList) []string {
	var out []string
	for _, p := range l.Plugins {
		out = append(out, p.Network.Type)
	}
	return out
}

// NetworkPlugins returns the plugin types, in chain order, of the network
// a sandbox created now would get.
func (n *Node) NetworkPlugins() ([]string, error) {
	l, err := loadNetwork(confDir(n.cfg.Root))
	if err != nil {
		return nil, err
	}
	return pluginTypes(l), nil
}

// destroySandbox runs CNI DEL for the node's network and the loopback and
// removes the namespace.
// DEL errors are returned after the namespace is gone, as containerd
// removes the sandbox regardless once it is stopped.
func (n *Node) destroySandbox(ctx context.Context, pod *corev1.Pod, sb *sandbox) error {
	cni := n.cniConfig()
	rt := n.runtimeConf(pod, sb)
	var errs []string
	network := sb.network
	if cur, err := loadNetwork(confDir(n.cfg.Root)); err == nil {
		network = cur
	}
	if network != nil {
		if err := cni.DelNetworkList(ctx, network, rt); err != nil {
			errs = append(errs, fmt.Sprintf("network %q: %v", network.Name, err))
		}
	}
	if sb.lo != nil {
		if err := cni.DelNetworkList(ctx, sb.lo, rt); err != nil {
			errs = append(errs, fmt.Sprintf("network %q: %v", sb.lo.Name, err))
		}
	}
	if out, err := exec.Command("ip", "netns", "del", sb.netnsName).CombinedOutput(); err != nil && !strings.Contains(string(out), "No such file") {
		errs = append(errs, fmt.Sprintf("delete netns %s: %v: %s", sb.netnsName, err, strings.TrimSpace(string(out))))
	}
	if len(errs) > 0 {
		return fmt.Errorf("teardown of sandbox %s: %s", sb.id[:12], strings.Join(errs, "; "))
	}
	return nil
}

// SetupRoot prepares a node root: the reference plugins of the primary
// network (podnet.Plugins) copied from pluginDir into Root/opt/cni/bin, and
// the primary network (podnet.Conflist) in Root/etc/cni/net.d/10-ptp.conflist
// that gives pods addresses from subnet (host-local, state under
// Root/var/lib/cni/networks).
func SetupRoot(root, pluginDir string, subnet netip.Prefix) error {
	for _, d := range []string{confDir(root), binDir(root)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	for _, p := range podnet.Plugins {
		if err := podnet.CopyExecutable(filepath.Join(pluginDir, p), filepath.Join(binDir(root), p)); err != nil {
			return err
		}
	}
	conf := podnet.Conflist(filepath.Join(root, "var", "lib", "cni", "networks"), subnet)
	return os.WriteFile(filepath.Join(confDir(root), PrimaryNetworkFile), conf, 0o644)
}
