package realnode

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/proc"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

// Host paths that containerd, libcni and kubelet write whatever their
// configuration says.
const (
	cgroupMount       = "/sys/fs/cgroup"
	shimSocketDir     = "/run/containerd/s"
	cniResultsDir     = "/var/lib/cni/results"
	devicePluginsDir  = "/var/lib/kubelet/device-plugins"
	containerLogLinks = "/var/log/containers"
)

// SweepStale tears down what nodes of killed test processes left: for
// every node directory whose owner process is gone, its processes, mounts,
// cgroups and host files, then the directory; cgroups of nodes whose
// directory is already gone; and the network of every address slot no live
// process holds (testnet.Sweep: routers, links, host routes). Start calls it.
func SweepStale() {
	for _, dir := range proc.StaleDirs(filepath.Join(os.TempDir(), DirPrefix+"*")) {
		killNode(dir, true)
		removeNetwork(dir)
		cleanNodeDir(dir)
	}
	testnet.Sweep()
	// Sockets of shims that died with any earlier node (another process's
	// sweep may have removed that node's directory first).
	cleanHostSockets()
	if !otherNodesRunning("") {
		removeCreatedHostDirs()
	}
	for _, h := range cgroupHierarchies() {
		names, _ := filepath.Glob(filepath.Join(h, DirPrefix+"*"))
		for _, cg := range names {
			if _, err := os.Stat(filepath.Join(os.TempDir(), filepath.Base(cg))); errors.Is(err, fs.ErrNotExist) {
				killCgroup(filepath.Base(cg))
				removeCgroup(filepath.Base(cg))
			}
		}
	}
}

// killNode kills every process in the node's cgroups and every process
// whose command line names the node's directory other than containerd and
// kubelet (the shims, the mount namespace holder), or those too when all is
// set, and waits until they are dead.
func killNode(dir string, all bool) {
	killCgroup(filepath.Base(dir))
	var killed []int
	for _, pid := range pidsMentioning(dir) {
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		base := filepath.Base(strings.TrimSuffix(exe, " (deleted)"))
		if !all && (base == "containerd" || base == "kubelet") {
			continue
		}
		_ = syscall.Kill(pid, syscall.SIGKILL)
		killed = append(killed, pid)
	}
	waitDead(killed)
}

// waitDead waits (up to 10 s) until every pid has exited: gone or a
// zombie. A process whose command line reads empty may still hold its
// files (its memory goes before them), so that is not enough.
func waitDead(pids []int) {
	for i := 0; i < 100; i++ {
		alive := false
		for _, pid := range pids {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			if err != nil {
				continue
			}
			// pid (comm) state ...: the state follows the last ")".
			f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
			if len(f) > 0 && f[0] != "Z" && f[0] != "X" {
				alive = true
			}
		}
		if !alive {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// pidsMentioning lists the processes whose command line contains dir.
func pidsMentioning(dir string) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(b, []byte(dir)) {
			out = append(out, pid)
		}
	}
	return out
}

// waitGone waits (up to 10 s) until list returns nothing.
func waitGone(list func() []int) {
	for i := 0; i < 100 && len(list()) > 0; i++ {
		time.Sleep(100 * time.Millisecond)
	}
}

// cgroupHierarchies are the mounted cgroup hierarchies (v1 controllers,
// name=systemd, the unified v2 one).
func cgroupHierarchies() []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		i := indexOf(fields, "-")
		if i < 0 || i+1 >= len(fields) || len(fields) < 5 {
			continue
		}
		if fstype := fields[i+1]; fstype == "cgroup" || fstype == "cgroup2" {
			out = append(out, unescapeMount(fields[4]))
		}
	}
	return out
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// makeCgroupRoot creates /<name> in every hierarchy (kubelet's cgroupRoot
// must exist in each). A cpuset cgroup gets its parent's CPUs and memory
// nodes, or no task could join it.
func makeCgroupRoot(name string) error {
	for _, h := range cgroupHierarchies() {
		d := filepath.Join(h, name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("cgroup %s: %w", d, err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if b, err := os.ReadFile(filepath.Join(h, f)); err == nil {
				if err := os.WriteFile(filepath.Join(d, f), b, 0o644); err != nil {
					return fmt.Errorf("cgroup %s: %s: %w", d, f, err)
				}
			}
		}
	}
	return nil
}

// cgroupPids lists the processes in /<name> and below, in every hierarchy.
func cgroupPids(name string) []int {
	seen := map[int]bool{}
	var out []int
	for _, h := range cgroupHierarchies() {
		_ = filepath.WalkDir(filepath.Join(h, name), func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			b, _ := os.ReadFile(filepath.Join(p, "cgroup.procs"))
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && !seen[pid] {
					seen[pid] = true
					out = append(out, pid)
				}
			}
			return nil
		})
	}
	return out
}

// killCgroup kills every process in the cgroups /<name> and waits for them
// to be gone.
func killCgroup(name string) {
	for i := 0; i < 100; i++ {
		pids := cgroupPids(name)
		if len(pids) == 0 {
			return
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		waitDead(pids)
	}
}

// removeCgroup removes /<name> and every cgroup below it, deepest first, in
// every hierarchy.
func removeCgroup(name string) {
	for _, h := range cgroupHierarchies() {
		var dirs []string
		_ = filepath.WalkDir(filepath.Join(h, name), func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			_ = syscall.Rmdir(dirs[i])
		}
	}
}

// mountsUnder lists the mount points at or below dir, deepest first.
func mountsUnder(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescapeMount(f[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

// unmountAll unmounts everything at or below dir (lazily: a mount still
// used by a dying process goes when it does).
func unmountAll(dir string) {
	for round := 0; round < 10; round++ {
		mps := mountsUnder(dir)
		if len(mps) == 0 {
			return
		}
		for _, mp := range mps {
			_ = syscall.Unmount(mp, syscall.MNT_DETACH)
		}
	}
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// cleanNodeDir removes what a stopped node leaves: mounts, cgroups, its
// files in host paths, and its directory.
func cleanNodeDir(dir string) {
	unmountAll(dir)
	removeCgroup(filepath.Base(dir))
	cleanHostPaths(dir)
	if err := os.RemoveAll(dir); err != nil {
		// A mount that was busy: once more after unmounting again.
		unmountAll(dir)
		_ = os.RemoveAll(dir)
	}
}

// cleanHostPaths removes the node's entries in the host paths kubelet,
// libcni and the shims use whatever they are told.
func cleanHostPaths(dir string) {
	links, _ := os.ReadDir(containerLogLinks)
	for _, l := range links {
		p := filepath.Join(containerLogLinks, l.Name())
		if t, err := os.Readlink(p); err == nil && strings.HasPrefix(t, dir+"/") {
			_ = os.Remove(p)
		}
	}
	results, _ := os.ReadDir(cniResultsDir)
	for _, r := range results {
		p := filepath.Join(cniResultsDir, r.Name())
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte(dir+"/")) {
			_ = os.Remove(p)
		}
	}
	cleanHostSockets()
	if !otherNodesRunning(dir) {
		_ = os.RemoveAll(devicePluginsDir)
		removeCreatedHostDirs()
	}
	for _, d := range []string{shimSocketDir, "/run/containerd", containerLogLinks, cniResultsDir, "/var/lib/cni", "/var/lib/kubelet"} {
		_ = syscall.Rmdir(d) // only when empty
	}
}

// cleanHostSockets removes the shim sockets nobody serves (shims of any
// node that are gone). A refused socket is tried once more a moment later:
// a starting shim binds, then listens.
func cleanHostSockets() {
	socks, _ := os.ReadDir(shimSocketDir)
	var refused []string
	for _, s := range socks {
		p := filepath.Join(shimSocketDir, s.Name())
		if !serves(p) {
			refused = append(refused, p)
		}
	}
	if len(refused) == 0 {
		return
	}
	time.Sleep(200 * time.Millisecond)
	for _, p := range refused {
		if !serves(p) {
			_ = os.Remove(p)
		}
	}
}

// serves reports whether a process accepts connections on the socket.
func serves(path string) bool {
	c, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// otherNodesRunning reports whether a process of a node other than the one
// in dir (any node when dir is empty), or any kubelet, runs on the machine.
func otherNodesRunning(dir string) bool {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		exe, _ := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		if filepath.Base(strings.TrimSuffix(exe, " (deleted)")) == "kubelet" {
			return true
		}
		b, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if bytes.Contains(b, []byte(filepath.Join(os.TempDir(), DirPrefix))) && (dir == "" || !bytes.Contains(b, []byte(dir))) {
			return true
		}
	}
	return false
}

func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Leftovers lists what of the node whose directory is dir is still on the
// host: processes naming the directory (other than this one), mounts below
// it, the directory itself, and its cgroups. Empty after a clean teardown.
func Leftovers(dir string) []string {
	var left []string
	self := strconv.Itoa(os.Getpid())
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && e.Name() != self && strings.Contains(string(b), dir) {
			left = append(left, fmt.Sprintf("process %s: %q", e.Name(), strings.ReplaceAll(string(b), "\x00", " ")))
		}
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	for _, l := range strings.Split(string(mi), "\n") {
		if strings.Contains(l, dir) {
			left = append(left, "mount: "+l)
		}
	}
	if _, err := os.Stat(dir); err == nil {
		left = append(left, "directory "+dir)
	}
	cgs, _ := filepath.Glob(filepath.Join(cgroupMount, "*", filepath.Base(dir)))
	for _, cg := range cgs {
		left = append(left, "cgroup "+cg)
	}
	return left
}
