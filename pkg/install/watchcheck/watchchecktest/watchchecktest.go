// Package watchchecktest builds a /proc for tests of the readiness probe:
// one process with a command line and, for the directories asked for, the
// fdinfo the kernel writes for a real inotify instance watching them.
package watchchecktest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fsnotify/fsnotify"
)

// Proc is a /proc with one process: its command line and the fdinfo files
// of this test process's inotify watches on dirs (the kernel's own format,
// read back from /proc/self). The watcher stays open until the test ends.
func Proc(t *testing.T, cmdline []string, dirs ...string) string {
	t.Helper()
	root := t.TempDir()
	pid := filepath.Join(root, "4242")
	if err := os.MkdirAll(filepath.Join(pid, "fdinfo"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pid, "cmdline"), []byte(strings.Join(cmdline, "\x00")+"\x00"), 0o644); err != nil {
		t.Fatal(err)
	}
	if len(dirs) == 0 {
		return root
	}
	before := inotifyFDs(t)
	w, err := fsnotify.NewWatcher()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	for _, d := range dirs {
		if err := w.Add(d); err != nil {
			t.Fatal(err)
		}
	}
	n := 0
	for fd, b := range inotifyFDs(t) {
		if _, old := before[fd]; old {
			continue // another fake's watcher, still open
		}
		if err := os.WriteFile(filepath.Join(pid, "fdinfo", fd), b, 0o644); err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n != 1 {
		t.Fatalf("%d new inotify file descriptors in /proc/self/fdinfo, want 1", n)
	}
	return root
}

// inotifyFDs returns this process's inotify file descriptors and their
// fdinfo.
func inotifyFDs(t *testing.T) map[string][]byte {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fdinfo")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc/self/fdinfo", e.Name()))
		if err == nil && strings.Contains(string(b), "inotify wd:") {
			out[e.Name()] = b
		}
	}
	return out
}
