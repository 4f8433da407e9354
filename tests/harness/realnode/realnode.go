// Package realnode runs real Kubernetes nodes on this machine for the
// integration tests and the demo: kubelet v1.37.2 (tests/kube) with its own
// containerd v2.4.2 and runc (tests/node), joined to a control plane of
// tests/harness/cluster. `make node-bins` builds the binaries into
// .cache/node/bin ($CCR_NODE_BIN_DIR); nothing is pulled from a registry:
// the pause image and the test images are FROM-scratch OCI archives built
// here (Image, tools/cmd/testimage) or by `make images`, imported into the
// node's containerd, and pods use imagePullPolicy: Never.
//
// # A node
//
// Start gives each node a directory <tmp>/ccr-realnode-XXXX (Node.Dir) that
// holds everything it owns:
//
//	containerd/{root,state}, containerd.sock   containerd's root, state and socket (config.toml, version 3)
//	runc/                                      runc's state (Root of the runc shim options)
//	cni/net.d, cni/bin                         the node's CNI conf dir (one conflist, max_conf_num 1) and plugins
//	cni/networks                               host-local's state for the default conflist
//	kubelet/                                   kubelet's --root-dir; kubelet/pki its --cert-dir
//	pod-logs/                                  kubelet's podLogsDir
//	kubelet.yaml, kubelet.kubeconfig, *.log    kubelet's configuration, credentials and the logs
//
// Kubelet, containerd (and so the shims, runc and the containers) run in a
// mount namespace of the node's, slave to the host's, held by the pause
// program: there the node's cni/net.d and cni/bin are bound at
// HostCNIConfDir and HostCNIBinDir (/etc/cni/net.d, /opt/cni/bin), so a
// DaemonSet that mounts those hostPaths (the project's installer) works on
// this node's directories, and every mount the node makes stays in its
// namespace and ends with it. Missing mount points are created on the host
// and removed on teardown.
//
// The node also gets the cgroup /<basename of Dir> in every cgroup
// hierarchy as kubelet's cgroupRoot (kubelet makes kubepods below it;
// cgroupfs driver, cgroup v1 is accepted with failCgroupV1: false).
//
// Network: each node is a network namespace of its own (Node.Netns, named
// by the address slot of tests/harness/testnet so a killed run's is removed
// when the slot is reserved again) in which kubelet, containerd, the CNI
// plugins and hostNetwork pods run. The node takes a /24 of the slot
// (Node.Subnet, allocated with podnet.AllocSubnet so simulated and real
// nodes never share one); its first address is the node IP (Node.IP) on the
// namespace's eth0, cabled to the slot's router namespace
// (testnet.Range.Link), which routes the /24 to it and forwards between
// nodes, the external namespace and the host; nothing depends on the host's
// forwarding switch. Kubelet reports the node IP as its InternalIP and
// serves its API there on KubeletPort; the apiserver prefers InternalIP
// (cluster.KubeletAddressTypes), so pods/log, exec and port-forward work.
// The default conflist (DefaultConfList: ptp and host-local, no masquerade)
// gives pods the rest of the /24 with the node IP as their gateway; the
// host (tests) reaches pods at their addresses. Inside the namespace
// cluster.KubernetesServiceIP:443, the "kubernetes" Service's ClusterIP (named by
// the apiserver's certificate), is forwarded to the apiserver on the host's
// loopback: kubelet uses it, and in-cluster clients of pods and hostNetwork
// pods work unchanged, with no kube-proxy and nothing added to the host's
// tables.
//
// Kubelet authenticates to the apiserver as the cluster's admin, serves its
// API with a self-signed certificate, accepts the apiserver's client
// certificate (the cluster CA) and authorizes everything (AlwaysAllow).
//
// # Teardown
//
// Stop stops kubelet, kills every process in the node's cgroups and every
// containerd-shim of the node's containerd, stops containerd and the mount
// namespace (with every mount in it: netns, rootfs, shm, kubelet's bind
// mount and volume tmpfs), unmounts anything left below Dir, deletes the network namespace (with its veth and route), removes
// the node's cgroups in every hierarchy, the files some parts write to fixed
// host paths (symlinks in /var/log/containers into Dir,
// /var/lib/cni/results entries of the node's netns, dead shim sockets in
// /run/containerd/s, /var/lib/kubelet/device-plugins when no other kubelet
// runs), the Node object, and Dir. Start first does the same
// for every node directory whose owning process is gone (a killed run;
// tests/harness/proc ownership files), so reruns start clean.
//
// # API
//
//	realnode.BuildImages(tb)                                    // the pause program and image (StartForTest does it)
//	n, err := realnode.Start(ctx, c, r, realnode.Options{CNIBinDir: realnode.CNIPluginDir(tb), Images: archives})
//	n.WaitReady(ctx)                                            // Ready since kubelet's last start; n.ReadyAfter()
//	n := realnode.StartForTest(t, c, r, realnode.Options{...}) // Ready on return, stopped by t.Cleanup
//	img := realnode.ProgramImage(t, "podprog")                   // tests/cmd/podprog as ccr.test/podprog:v1
//	imgs := realnode.ProjectImages(t, "v0.1.0")                  // the project's images, as the manifests name them
//	Options{Images: realnode.Archives(imgs...), Taints: ..., Labels: ..., ConfList: ..., NoConfList: true}
//	n.Name, n.IP, n.Subnet, n.Dir, n.Netns                       // identity, node IP, pods' /24, directory, network namespace
//	n.ConfDir(), n.CNIBinDir(), n.ConfList(), n.DefaultConfList()
//	n.WriteConfList(data)        // replace the node's conflist (containerd reads it for the next sandbox)
//	n.ImportImage(ctx, archive)  // ctr -n k8s.io images import
//	n.Ctr(ctx, args...)          // any ctr command against the node's containerd (namespace k8s.io)
//	n.Restart(ctx, hook)         // a reboot: stop kubelet and containerd, lose every sandbox, hook, start both
//	n.Usage()                    // RSS of kubelet, containerd, the shims and the pods
//	n.KubeletLog(), n.ContainerdLog()
//	n.Stop()
//	realnode.SweepStale()        // what killed runs left (Start calls it)
package realnode

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/podnet"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/proc"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

// DirPrefix begins the name of every node directory (in os.TempDir()).
const DirPrefix = "ccr-realnode-"

// ConfListFile is the name of the node's conflist in its CNI conf dir.
const ConfListFile = "10-ccr.conflist"

// Options configure a node. The zero value is usable.
type Options struct {
	// Name is the Node's name. Default: real-s<slot>-<pid>-<n>.
	Name string
	// Images are OCI archives imported into the node's containerd before
	// kubelet starts (the pause image always is).
	Images []string
	// ConfList is the node's initial conflist (ConfListFile). Default:
	// DefaultConfList for the node's subnet; an empty slice with
	// NoConfList set starts the node without a network (NotReady until
	// WriteConfList).
	ConfList   []byte
	NoConfList bool
	// Plugins are copied into the node's CNI bin dir, by file name;
	// ptp, host-local and loopback (which containerd always runs) are
	// always there.
	Plugins []string
	// Labels and Taints the node registers with.
	Labels map[string]string
	Taints []corev1.Taint
	// BinDir holds containerd, ctr, containerd-shim-runc-v2, runc and
	// kubelet. Default: $CCR_NODE_BIN_DIR, else <repo>/.cache/node/bin.
	BinDir string
	// CNIBinDir holds ptp, host-local and loopback. Default:
	// $CCR_CNI_BIN_DIR when it has them, else testbin.CNIPluginDir.
	CNIBinDir string
	// Verbosity is kubelet's klog level (default 2).
	Verbosity int
	// Logf receives the node's progress lines. Default: discarded.
	Logf func(format string, args ...any)
}

// Node is a running real node.
type Node struct {
	// Name is the Node object's name, IP its InternalIP, Subnet its pods'
	// /24 (the default conflist's range).
	Name   string
	IP     netip.Addr
	Subnet netip.Prefix
	// Dir is the node's directory (see the package documentation).
	Dir string
	// KubeletStarted is when kubelet was last started, Ready when the
	// Node was first seen Ready after it (zero before).
	KubeletStarted, Ready time.Time

	c       *cluster.Cluster
	opts    Options
	paths   paths
	release func()

	// Netns is the path of the node's network namespace, where kubelet,
	// containerd, the CNI plugins and hostNetwork pods run.
	Netns string

	netnsName string
	api       *apiForward

	mu         sync.Mutex
	mountNS    *proc.Process
	containerd *proc.Process
	kubelet    *proc.Process
	kubeletArg []string
	stopOnce   sync.Once
}

// Start starts a node against c in the address slot r and returns once
// kubelet runs (not yet Ready: WaitReady).
func Start(ctx context.Context, c *cluster.Cluster, r *testnet.Range, opts Options) (_ *Node, err error) {
	if err := opts.complete(); err != nil {
		return nil, err
	}
	SweepStale()
	idx, release, err := podnet.AllocSubnet()
	if err != nil {
		return nil, err
	}
	n := &Node{c: c, opts: opts, release: release, Subnet: r.Subnet4(idx, 24)}
	n.IP = testnet.Host(n.Subnet, 1)
	n.Name = opts.Name
	if n.Name == "" {
		n.Name = nextName(r)
	}
	defer func() {
		if err != nil {
			n.Stop()
		}
	}()
	if n.Dir, err = os.MkdirTemp("", DirPrefix); err != nil {
		return nil, err
	}
	if err := proc.MarkOwned(n.Dir); err != nil {
		return nil, err
	}
	n.paths = newPaths(n.Dir, opts.BinDir)
	if err := n.prepare(r); err != nil {
		return nil, fmt.Errorf("realnode %s: %w", n.Name, err)
	}
	if err := n.startMountNS(); err != nil {
		return nil, fmt.Errorf("realnode %s: %w", n.Name, err)
	}
	if err := n.startRuntime(ctx); err != nil {
		return nil, fmt.Errorf("realnode %s: %w", n.Name, err)
	}
	for _, img := range append([]string{pauseArchive()}, opts.Images...) {
		if err := n.ImportImage(ctx, img); err != nil {
			return nil, fmt.Errorf("realnode %s: %w", n.Name, err)
		}
	}
	if err := n.startKubelet(); err != nil {
		return nil, fmt.Errorf("realnode %s: %w", n.Name, err)
	}
	return n, nil
}

var (
	seqMu sync.Mutex
	seq   int
)

func nextName(r *testnet.Range) string {
	seqMu.Lock()
	defer seqMu.Unlock()
	seq++
	return fmt.Sprintf("real-s%d-%d-%d", r.Slot, os.Getpid()%100000, seq)
}

// complete fills in the defaults and checks that the binaries exist.
func (o *Options) complete() error {
	if o.BinDir == "" {
		o.BinDir = os.Getenv("CCR_NODE_BIN_DIR")
	}
	if o.BinDir == "" {
		o.BinDir = filepath.Join(testbin.RepoRoot(), ".cache", "node", "bin")
	}
	for _, b := range nodeBinaries {
		if _, err := os.Stat(filepath.Join(o.BinDir, b)); err != nil {
			return fmt.Errorf("realnode: %s not found in %s: build the node binaries with `make node-bins`", b, o.BinDir)
		}
	}
	if pauseArchive() == "" {
		return errors.New("realnode: no pause image: call realnode.BuildImages (StartForTest does) before Start")
	}
	if o.CNIBinDir == "" {
		return errors.New("realnode: Options.CNIBinDir is required (StartForTest sets testbin.CNIPluginDir)")
	}
	if o.Verbosity == 0 {
		o.Verbosity = 2
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	return nil
}

// nodeBinaries are what `make node-bins` builds.
var nodeBinaries = []string{"containerd", "ctr", "containerd-shim-runc-v2", "runc", "kubelet"}

// prepare makes the directories, the cgroup root, the network namespace
// and the CNI set-up.
func (n *Node) prepare(r *testnet.Range) error {
	for _, d := range n.paths.dirs() {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	// Containers may run as any user: they must reach their files.
	if err := os.Chmod(n.Dir, 0o755); err != nil {
		return err
	}
	if err := makeCgroupRoot(n.cgroupName()); err != nil {
		return err
	}
	if err := n.setupNetwork(r); err != nil {
		return err
	}
	var plugins []string
	for _, p := range podnet.Plugins {
		plugins = append(plugins, filepath.Join(n.opts.CNIBinDir, p))
	}
	for _, p := range append(plugins, n.opts.Plugins...) {
		if err := podnet.CopyExecutable(p, filepath.Join(n.paths.cniBin, filepath.Base(p))); err != nil {
			return fmt.Errorf("CNI plugin %s: %w", p, err)
		}
	}
	if n.opts.NoConfList {
		return nil
	}
	conf := n.opts.ConfList
	if len(conf) == 0 {
		conf = n.DefaultConfList()
	}
	return n.WriteConfList(conf)
}

// cgroupName is kubelet's cgroupRoot without the leading "/".
func (n *Node) cgroupName() string { return filepath.Base(n.Dir) }

// DefaultConfList is the node's primary network: ptp with host-local in
// Subnet (state in the node's directory), ipMasq off, MTU 1500.
func (n *Node) DefaultConfList() []byte {
	return podnet.Conflist(n.paths.cniNetworks, n.Subnet)
}

// ConfDir and CNIBinDir are the node's CNI directories.
func (n *Node) ConfDir() string   { return n.paths.cniConf }
func (n *Node) CNIBinDir() string { return n.paths.cniBin }

// WriteConfList replaces the node's conflist atomically; containerd's CRI
// plugin uses the new one for the next sandbox (and for teardowns).
func (n *Node) WriteConfList(data []byte) error {
	dst := filepath.Join(n.paths.cniConf, ConfListFile)
	tmp := dst + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// ConfList returns the node's current conflist.
func (n *Node) ConfList() ([]byte, error) {
	return os.ReadFile(filepath.Join(n.paths.cniConf, ConfListFile))
}

// WaitReady waits until kubelet, since its last start, reports the Node
// Ready, and records when (Ready).
func (n *Node) WaitReady(ctx context.Context) error {
	n.mu.Lock()
	started := n.KubeletStarted.Truncate(time.Second) // heartbeats have a one-second resolution
	n.mu.Unlock()
	var last string
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if err := n.exited(); err != nil {
			return false, err
		}
		node, err := n.c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				last = fmt.Sprintf("Ready=%s (%s: %s)", cond.Status, cond.Reason, cond.Message)
				// A condition from before kubelet's (re)start does not count.
				if cond.Status == corev1.ConditionTrue && !cond.LastHeartbeatTime.Time.Before(started) {
					return true, nil
				}
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("node %s not Ready (last: %s): %w\n--- kubelet log (last lines):\n%s", n.Name, last, err, tailFile(n.paths.kubeletLog, 25))
	}
	n.mu.Lock()
	if n.Ready.IsZero() || n.Ready.Before(n.KubeletStarted) {
		n.Ready = time.Now()
	}
	n.mu.Unlock()
	return nil
}

// ReadyAfter is the time from kubelet's start to the Node being seen Ready.
func (n *Node) ReadyAfter() time.Duration {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.Ready.IsZero() {
		return 0
	}
	return n.Ready.Sub(n.KubeletStarted)
}

// exited reports kubelet or containerd having exited.
func (n *Node) exited() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	for name, p := range map[string]*proc.Process{"kubelet": n.kubelet, "containerd": n.containerd} {
		if p == nil {
			continue
		}
		select {
		case <-p.Done():
			log := n.paths.kubeletLog
			if name == "containerd" {
				log = n.paths.containerdLog
			}
			return fmt.Errorf("%s of node %s exited (%v):\n%s", name, n.Name, p.Err(), tailFile(log, 25))
		default:
		}
	}
	return nil
}

// Stop tears the node down (see the package documentation). It is safe to
// call more than once.
func (n *Node) Stop() {
	n.stopOnce.Do(func() {
		n.stopKubelet()
		if n.Dir != "" {
			killNode(n.Dir, false)
		}
		n.stopContainerd()
		n.stopMountNS()
		if n.api != nil {
			n.api.close()
		}
		if n.Dir != "" {
			// A shim containerd started while it was stopping.
			killNode(n.Dir, true)
			removeNetwork(n.Dir)
			cleanNodeDir(n.Dir)
			if left := Leftovers(n.Dir); len(left) > 0 {
				n.opts.Logf("realnode %s: the teardown left (the next Start sweeps it):\n%s", n.Name, strings.Join(left, "\n"))
			}
		}
		if n.c != nil && n.Name != "" {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			err := n.c.Client.CoreV1().Nodes().Delete(ctx, n.Name, metav1.DeleteOptions{})
			cancel()
			if err != nil && !apierrors.IsNotFound(err) {
				n.opts.Logf("realnode %s: delete Node: %v", n.Name, err)
			}
		}
		if n.release != nil {
			n.release()
		}
	})
}
