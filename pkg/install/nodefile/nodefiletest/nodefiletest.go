// Package nodefiletest gives the installer's tests another writer: one that
// replaces a file the way the primary CNI or another installer does, and
// that acts at the race points of pkg/install/nodefile.
package nodefiletest

import (
	"os"
	"testing"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/internal/racehook"
)

// ForeignWrite replaces path the way another installer or the primary CNI
// does: a file of its own renamed over it.
func ForeignWrite(t testing.TB, path string, data []byte) {
	tmp := path + ".foreign"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		t.Error(err)
		return
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Error(err)
	}
}

// BeforeCompare runs f in nodefile.ReplaceIfUnchanged between writing the
// new content and comparing the file, until the test ends.
func BeforeCompare(t testing.TB, f func(path string)) { set(t, &racehook.BeforeCompare, f) }

// AfterCompare runs f in nodefile.ReplaceIfUnchanged between the compare
// and the swap, until the test ends.
func AfterCompare(t testing.TB, f func(path string)) { set(t, &racehook.AfterCompare, f) }

// BeforeRemoveIfUnchanged runs f when nodefile.RemoveIfUnchanged is
// called, until the test ends.
func BeforeRemoveIfUnchanged(t testing.TB, f func(path string)) {
	set(t, &racehook.BeforeRemoveIfUnchanged, f)
}

func set(t testing.TB, hook *func(string), f func(string)) {
	t.Helper()
	*hook = f
	t.Cleanup(func() { *hook = nil })
}
