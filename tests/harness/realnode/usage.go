package realnode

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Usage is the resident memory of a node's processes, in bytes.
type Usage struct {
	Kubelet, Containerd int64
	// Shims is the sum over the node's containerd-shim-runc-v2 processes
	// (ShimCount of them), Pods the sum over the processes in its pods'
	// cgroups (PodProcesses of them).
	Shims, Pods             int64
	ShimCount, PodProcesses int
}

// Daemons is kubelet + containerd + shims.
func (u Usage) Daemons() int64 { return u.Kubelet + u.Containerd + u.Shims }

func (u Usage) String() string {
	mib := func(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }
	return fmt.Sprintf("kubelet %s, containerd %s, %d shims %s (kubelet+containerd+shims %s); %d pod processes %s",
		mib(u.Kubelet), mib(u.Containerd), u.ShimCount, mib(u.Shims), mib(u.Daemons()), u.PodProcesses, mib(u.Pods))
}

// Usage reads the node's processes' VmRSS from /proc.
func (n *Node) Usage() (Usage, error) {
	var u Usage
	n.mu.Lock()
	kubelet, containerd := n.kubelet, n.containerd
	n.mu.Unlock()
	var err error
	if kubelet != nil {
		if u.Kubelet, err = rss(kubelet.Cmd.Process.Pid); err != nil {
			return u, fmt.Errorf("kubelet: %w", err)
		}
	}
	if containerd != nil {
		if u.Containerd, err = rss(containerd.Cmd.Process.Pid); err != nil {
			return u, fmt.Errorf("containerd: %w", err)
		}
	}
	for _, pid := range pidsMentioning(n.Dir) {
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		if filepath.Base(exe) == "containerd-shim-runc-v2" {
			if b, err := rss(pid); err == nil {
				u.Shims += b
				u.ShimCount++
			}
		}
	}
	for _, pid := range cgroupPids(n.cgroupName()) {
		if b, err := rss(pid); err == nil {
			u.Pods += b
			u.PodProcesses++
		}
	}
	return u, nil
}

// rss is a process's VmRSS in bytes.
func rss(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS for pid %d", pid)
}
