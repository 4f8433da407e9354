// Package watchcheck tells whether the installer's `run` process watches
// the node's CNI directories, for the readiness probe (`consul-cni-installer
// ready`).
//
// An installer whose directory watch could not be set up (the node's
// fs.inotify.max_user_instances or max_user_watches reached: a known way
// installers go silently blind, linkerd2 PR #13198) still restores the
// chain at every periodic pass, but no longer within milliseconds. The
// readiness probe (`ready`) makes it visible: it finds the installer's
// `run` process beside it (the same container, so the same PID namespace)
// and reads the kernel's own record of that process's inotify watches
// (/proc/<pid>/fdinfo: one "inotify wd:… ino:… sdev:…" line per watch),
// which must cover the inodes of the net and bin directories. No state is
// exchanged, so the probe cannot be told something the kernel does not
// hold.
//
// Check knows nothing of the installer's configuration: the caller
// (pkg/install's Ready, after it verified the chain) passes the
// directories as the probe's container sees them, which are the ones the
// run process watches, since both share the container's mounts.
package watchcheck

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrNoInstallerProcess means no `consul-cni-installer run` process is
// visible (the probe runs without the installer: tests, by hand).
var ErrNoInstallerProcess = errors.New("no consul-cni-installer run process is visible")

// inotifyWatch is a watched inode: its number and its file system's device
// (as stat reports st_dev).
type inotifyWatch struct {
	ino uint64
	dev uint64
}

// Check returns nil when an installer `run` process visible in
// procRoot (/proc) watches every one of dirs, ErrNoInstallerProcess when no
// such process is visible, and otherwise an error naming the directories
// no installer watches.
func Check(procRoot string, dirs ...string) error {
	want := map[inotifyWatch]string{}
	for _, d := range dirs {
		var st unix.Stat_t
		if err := unix.Stat(d, &st); err != nil {
			return fmt.Errorf("%s: %w", d, err)
		}
		want[inotifyWatch{ino: st.Ino, dev: st.Dev}] = d
	}
	pids := installerProcesses(procRoot)
	if len(pids) == 0 {
		return ErrNoInstallerProcess
	}
	var missing []string
	for _, pid := range pids {
		have := processWatches(filepath.Join(procRoot, pid))
		missing = missing[:0]
		for w, d := range want {
			if !have[w] {
				missing = append(missing, d)
			}
		}
		if len(missing) == 0 {
			return nil
		}
	}
	return fmt.Errorf("the installer does not watch %s (inotify limits reached? see fs.inotify.max_user_instances and fs.inotify.max_user_watches and the installer's log); only its periodic pass restores the chain",
		strings.Join(missing, ", "))
}

// installerProcesses lists the PIDs whose command is consul-cni-installer
// with the run subcommand (explicit or the default).
func installerProcesses(procRoot string) []string {
	ents, err := os.ReadDir(procRoot)
	if err != nil {
		return nil
	}
	self := strconv.Itoa(os.Getpid())
	var pids []string
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil || e.Name() == self {
			continue
		}
		b, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "cmdline"))
		if err != nil || len(b) == 0 {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if filepath.Base(args[0]) != "consul-cni-installer" {
			continue
		}
		sub := "run"
		for _, a := range args[1:] {
			if !strings.HasPrefix(a, "-") {
				sub = a
				break
			}
		}
		if sub == "run" {
			pids = append(pids, e.Name())
		}
	}
	return pids
}

// processWatches reads the inotify watches of a process from its fdinfo.
func processWatches(procDir string) map[inotifyWatch]bool {
	out := map[inotifyWatch]bool{}
	ents, err := os.ReadDir(filepath.Join(procDir, "fdinfo"))
	if err != nil {
		return out
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(procDir, "fdinfo", e.Name()))
		if err != nil || !bytes.Contains(b, []byte("inotify wd:")) {
			continue
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			if w, ok := parseInotifyLine(sc.Text()); ok {
				out[w] = true
			}
		}
	}
	return out
}

// parseInotifyLine reads "inotify wd:1 ino:2a sdev:800021 mask:…": ino and
// sdev are hexadecimal, sdev the kernel's internal device number (major
// above bit 20), turned into stat's encoding.
func parseInotifyLine(line string) (inotifyWatch, bool) {
	if !strings.HasPrefix(line, "inotify ") {
		return inotifyWatch{}, false
	}
	var w inotifyWatch
	var okIno, okDev bool
	for _, f := range strings.Fields(line) {
		k, v, found := strings.Cut(f, ":")
		if !found {
			continue
		}
		n, err := strconv.ParseUint(v, 16, 64)
		if err != nil {
			continue
		}
		switch k {
		case "ino":
			w.ino, okIno = n, true
		case "sdev":
			w.dev, okDev = unix.Mkdev(uint32(n>>20), uint32(n&0xfffff)), true
		}
	}
	return w, okIno && okDev
}
