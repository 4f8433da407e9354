package realnode

import (
	"context"
	"fmt"
	"os"
)

// Restart reboots the node: kubelet stops, every pod process and shim is
// killed and containerd stops, then what a reboot loses goes (containerd's
// state and runc's, so every sandbox and its netns; the mounts below the
// node's directory, such as the pods' tmpfs volumes; the pods' cgroups),
// while what lives on disk stays (containerd's root with images and
// container records, kubelet's root dir, the CNI conf and IPAM state, pod
// logs, libcni's result cache). hook, when not nil, runs with both daemons
// down (for example to rewrite the conflist with WriteConfList). Then
// containerd and kubelet start again; WaitReady waits for the node.
// Kubelet finds its pods' sandboxes gone and makes new ones with the
// conflist of that moment.
func (n *Node) Restart(ctx context.Context, hook func() error) error {
	n.stopKubelet()
	killNode(n.Dir, false)
	n.stopContainerd()
	n.stopMountNS() // every mount of the node goes with its namespace
	killNode(n.Dir, true)
	unmountAll(n.Dir)
	removeCgroup(n.cgroupName())
	if err := makeCgroupRoot(n.cgroupName()); err != nil {
		return fmt.Errorf("realnode %s: %w", n.Name, err)
	}
	for _, d := range []string{n.paths.containerdState, n.paths.runcRoot} {
		if err := os.RemoveAll(d); err != nil {
			return fmt.Errorf("realnode %s: %w", n.Name, err)
		}
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	// Dead shim sockets of the lost sandboxes.
	cleanHostSockets()
	if hook != nil {
		if err := hook(); err != nil {
			return fmt.Errorf("realnode %s: restart hook: %w", n.Name, err)
		}
	}
	if err := n.startMountNS(); err != nil {
		return fmt.Errorf("realnode %s: %w", n.Name, err)
	}
	if err := n.startRuntime(ctx); err != nil {
		return fmt.Errorf("realnode %s: %w", n.Name, err)
	}
	if err := n.startKubelet(); err != nil {
		return fmt.Errorf("realnode %s: %w", n.Name, err)
	}
	return nil
}
