package install

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/conflist/conflisttest"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/nodefile"
)

// Temporary files a writer killed mid-write left (SIGKILL, OOM) are removed
// when the installer starts, once old enough that no live writer (another
// installer during a rolling update) can own them; other tools' files stay.
// Leftovers lists them at any age and uninstall removes them.
func TestTemporaryFilesOfKilledWriters(t *testing.T) {
	n := newHostDirs(t)
	conflisttest.WriteFiles(t, n.net, map[string]string{"10-n.conflist": ptpList, "dirnet/.keep": ""})
	old := time.Now().Add(-2 * staleTempAge)
	files := map[string]bool{ // path -> removed at start
		filepath.Join(n.bin, ".consul-cni.2596996162.tmp"):             true,
		filepath.Join(n.bin, ".consul-cni-repair-staged.17.tmp"):       true,
		filepath.Join(n.net, "."+cniconf.TokenFileName+".42.tmp"):      true,
		filepath.Join(n.net, "."+cniconf.KubeconfigFileName+".43.tmp"): true,
		filepath.Join(n.net, ".10-n.conflist.44.tmp"):                  true,
		filepath.Join(n.net, "dirnet", ".zzz-consul-cni.conf.45.tmp"):  true,
		filepath.Join(n.bin, ".ptp.46.tmp"):                            false, // not ours
		filepath.Join(n.net, ".notes.txt.47.tmp"):                      false, // not ours
		filepath.Join(n.bin, ".consul-cni.tmp"):                        false, // not our pattern
	}
	for f := range files {
		if err := os.WriteFile(f, []byte("partial"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(f, old, old); err != nil {
			t.Fatal(err)
		}
	}
	fresh := filepath.Join(n.bin, ".consul-cni.99.tmp") // a live writer's
	if err := os.WriteFile(fresh, []byte("being written"), 0o600); err != nil {
		t.Fatal(err)
	}
	in := n.installer(t)
	left, err := in.Leftovers()
	if err != nil {
		t.Fatal(err)
	}
	for f, ours := range files {
		if slices.Contains(left, filepath.Base(f)) != ours {
			t.Errorf("Leftovers %v: %s listed %v, want %v", left, filepath.Base(f), !ours, ours)
		}
	}
	if !slices.Contains(left, filepath.Base(fresh)) {
		t.Errorf("Leftovers %v without %s", left, filepath.Base(fresh))
	}

	runAndStop(t, in)
	for f, removed := range files {
		if nodefile.Exists(f) == removed {
			t.Errorf("after start: %s exists %v, want %v", f, nodefile.Exists(f), !removed)
		}
	}
	if !nodefile.Exists(fresh) {
		t.Errorf("a fresh temporary file (a live writer's) was removed at start")
	}

	if _, err := in.Uninstall(context.Background()); err != nil {
		t.Fatal(err)
	}
	if nodefile.Exists(fresh) {
		t.Errorf("uninstall left %s", fresh)
	}
	left, err = in.Leftovers()
	if err != nil || len(left) != 0 {
		t.Fatalf("after uninstall: %v %v", left, err)
	}
	for f, ours := range files {
		if !ours && !nodefile.Exists(f) {
			t.Errorf("uninstall removed %s, not ours", f)
		}
	}
}
