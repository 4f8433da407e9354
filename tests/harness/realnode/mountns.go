package realnode

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/proc"
)

// HostCNIConfDir and HostCNIBinDir are the paths the manifests' installer
// mounts (hostPath); inside a node they are the node's own CNI directories.
const (
	HostCNIConfDir = "/etc/cni/net.d"
	HostCNIBinDir  = "/opt/cni/bin"
)

// HostCRISocket is containerd's default CRI socket. Inside a node, the
// node's own containerd socket is bound there (bindCRISocket), where a
// DaemonSet pod that mounts the node's root finds it as on any containerd
// node.
const HostCRISocket = "/run/containerd/containerd.sock"

// createdMarker is the file a node leaves in a mount point it created on
// the host (listing the directories it created, deepest first); the last
// node to go removes them.
const createdMarker = ".ccr-realnode-created"

// startMountNS starts the holder of the node's mount namespace (the pause
// program under unshare, mounts slave to the host's: the host's mounts are
// seen, the node's stay inside and end with it), makes its root shared and
// binds the node's CNI directories at HostCNIConfDir and HostCNIBinDir
// there.
func (n *Node) startMountNS() error {
	for _, d := range []string{HostCNIConfDir, HostCNIBinDir} {
		if err := n.makeHostDir(d); err != nil {
			return err
		}
	}
	// The node's directory is an argument so that a sweep finds the holder.
	cmd := exec.Command("unshare", "--mount", "--propagation", "slave", pauseBinary(), n.Dir)
	p, err := proc.Start(cmd, "")
	if err != nil {
		return fmt.Errorf("mount namespace: %w", err)
	}
	n.mu.Lock()
	n.mountNS = p
	n.mu.Unlock()
	self, _ := os.Readlink("/proc/self/ns/mnt")
	ns := fmt.Sprintf("/proc/%d/ns/mnt", p.Cmd.Process.Pid)
	for i := 0; ; i++ {
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", p.Cmd.Process.Pid))
		if mnt, _ := os.Readlink(ns); mnt != "" && mnt != self && filepath.Base(exe) == filepath.Base(pauseBinary()) {
			break
		}
		if i == 200 {
			return fmt.Errorf("mount namespace holder did not start (exe %q)", exe)
		}
		time.Sleep(25 * time.Millisecond)
	}
	binds := map[string]string{n.paths.cniConf: HostCNIConfDir, n.paths.cniBin: HostCNIBinDir}
	if err := n.tunableFiles(binds); err != nil {
		return err
	}
	// The root is shared inside the node, as systemd makes it on a real
	// node (a host whose root is private, as in many containers, would
	// otherwise leave it private): kubelet then accepts HostToContainer
	// propagation (a DaemonSet that mounts the node's root sees the netns
	// bind mounts made after it started). The node's mounts still never
	// reach the host: the namespace is a slave of the host's, or private.
	script := []string{"mount --make-rshared /"}
	for src, dst := range binds {
		script = append(script, fmt.Sprintf("mount --bind '%s' '%s'", src, dst))
	}
	if out, err := exec.Command("nsenter", "--mount="+ns, "--", "sh", "-ec", strings.Join(script, "\n")).CombinedOutput(); err != nil {
		return fmt.Errorf("bind mounts in the node: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// kubeletTunables are the kernel settings kubelet sets when it starts
// (protectKernelDefaults: false), with the values it wants. They belong to
// the whole machine, not to a namespace, and one of them (kernel.panic_on_oops)
// turns any oops into a reboot: in the node's mount namespace each is a file
// of the node's own, bound over its /proc/sys path and holding that value, so
// kubelet finds them as it wants them and the host's stay as they were.
var kubeletTunables = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
}

// tunableFiles writes the node's files for kubeletTunables and adds their
// bind mounts to binds (source: target).
func (n *Node) tunableFiles(binds map[string]string) error {
	dir := filepath.Join(n.Dir, "sysctl")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for k, v := range kubeletTunables {
		f := filepath.Join(dir, strings.ReplaceAll(k, "/", "."))
		if err := os.WriteFile(f, []byte(v+"\n"), 0o644); err != nil {
			return err
		}
		binds[f] = filepath.Join("/proc/sys", k)
	}
	return nil
}

// MountNamespace is the node's mount namespace as a /proc/<pid>/ns/mnt
// path (a new one after Restart), where its CNI directories are at
// HostCNIConfDir and HostCNIBinDir as a hostPath container sees them.
func (n *Node) MountNamespace() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.mountNS == nil {
		return ""
	}
	return fmt.Sprintf("/proc/%d/ns/mnt", n.mountNS.Cmd.Process.Pid)
}

// inNode is a command that runs bin in the node's mount namespace (nsenter
// execs it: the process is bin's).
func (n *Node) inNode(bin string, args ...string) *exec.Cmd {
	n.mu.Lock()
	pid := n.mountNS.Cmd.Process.Pid
	n.mu.Unlock()
	a := append([]string{fmt.Sprintf("--mount=/proc/%d/ns/mnt", pid), "--", bin}, args...)
	return exec.Command("nsenter", a...)
}

func (n *Node) stopMountNS() {
	n.mu.Lock()
	p := n.mountNS
	n.mountNS = nil
	n.mu.Unlock()
	if p != nil {
		p.Stop(5 * time.Second)
	}
}

// bindCRISocket binds the node's containerd socket at HostCRISocket in the
// node's mount namespace; containerd makes its socket anew at every start,
// so it runs after each. The mount point is an empty file, made on the host
// when missing and removed when no node runs (removeCreatedHostDirs).
func (n *Node) bindCRISocket() error {
	if _, err := os.Lstat(HostCRISocket); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(filepath.Dir(HostCRISocket), 0o700); err != nil {
			return err
		}
		f, err := os.OpenFile(HostCRISocket, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		if f != nil {
			f.Close()
		}
	} else if err != nil {
		return err
	}
	if out, err := n.inNode("mount", "--bind", n.paths.containerdSock, HostCRISocket).CombinedOutput(); err != nil {
		return fmt.Errorf("binding the CRI socket at %s in the node: %v: %s", HostCRISocket, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// makeHostDir creates a missing mount point and marks it as created.
func (n *Node) makeHostDir(d string) error {
	if _, err := os.Stat(d); err == nil {
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	var created []string
	for p := d; ; p = filepath.Dir(p) {
		if _, err := os.Stat(p); err == nil {
			break
		}
		created = append(created, p)
	}
	if err := os.MkdirAll(d, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(d, createdMarker), []byte(strings.Join(created, "\n")+"\n"), 0o644)
}

// removeCreatedHostDirs removes the mount points nodes created, when no
// node runs any more (removing a directory that is a mount point in a live
// node's namespace would take the node's bind mount away).
func removeCreatedHostDirs() {
	// An empty regular file is never a runtime's socket: it is the mount
	// point bindCRISocket made.
	if st, err := os.Lstat(HostCRISocket); err == nil && st.Mode().IsRegular() && st.Size() == 0 {
		_ = os.Remove(HostCRISocket)
	}
	for _, d := range []string{HostCNIConfDir, HostCNIBinDir} {
		b, err := os.ReadFile(filepath.Join(d, createdMarker))
		if err != nil {
			continue
		}
		_ = os.Remove(filepath.Join(d, createdMarker))
		for _, c := range strings.Fields(string(b)) {
			_ = os.Remove(c) // only when empty
		}
	}
}
