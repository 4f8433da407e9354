package proc

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

const ownerFile = ".owner-pid"

// MarkOwned records the current process as the owner of dir, so that
// RemoveStale can delete the directory if this process dies without
// cleaning up (SIGKILL, a test timeout).
func MarkOwned(dir string) error {
	return os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644)
}

// RemoveStale deletes the directories matching pattern whose owner process
// (MarkOwned) no longer exists. Directories without an owner file are left
// alone.
func RemoveStale(pattern string) {
	for _, d := range StaleDirs(pattern) {
		_ = os.RemoveAll(d)
	}
}

// StaleDirs returns the directories matching pattern whose owner process
// (MarkOwned) no longer exists, for callers that must undo more than files
// (mounts, processes) before removing them. Directories without an owner
// file are left out.
func StaleDirs(pattern string) []string {
	dirs, _ := filepath.Glob(pattern)
	var out []string
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, ownerFile))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); err == syscall.ESRCH {
			out = append(out, d)
		}
	}
	return out
}
