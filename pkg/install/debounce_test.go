package install

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
)

func TestDebounceFor(t *testing.T) {
	n := newHostDirs(t)
	in := n.installer(t, func(c *Config) { c.Debounce = time.Second })
	for _, c := range []struct {
		name string
		op   fsnotify.Op
		want time.Duration
	}{
		{filepath.Join(n.bin, cniconf.PluginType), fsnotify.Remove, restoreDebounce},
		{filepath.Join(n.bin, cniconf.PluginType), fsnotify.Rename, restoreDebounce},
		{filepath.Join(n.bin, cniconf.PluginType), fsnotify.Write, time.Second},
		{filepath.Join(n.bin, "ptp"), fsnotify.Remove, time.Second},
		{filepath.Join(n.net, cniconf.KubeconfigFileName), fsnotify.Remove, restoreDebounce},
		{filepath.Join(n.net, cniconf.TokenFileName), fsnotify.Rename, restoreDebounce},
		{filepath.Join(n.net, "10-kindnet.conflist"), fsnotify.Create, restoreDebounce},
		{filepath.Join(n.net, "10-kindnet.conflist"), fsnotify.Write, restoreDebounce},
		{filepath.Join(n.net, "10-kindnet.conf"), fsnotify.Write, restoreDebounce},
		{filepath.Join(n.net, cniconf.OwnerFileName), fsnotify.Write, time.Second},
		{filepath.Join(n.net, "10-kindnet.conflist.install-cni.tmp"), fsnotify.Create, time.Second},
		{filepath.Join(n.net, "kindnet", "zzz-consul-cni.conf"), fsnotify.Remove, time.Second},
	} {
		if got := in.debounceFor(fsnotify.Event{Name: c.name, Op: c.op}); got != c.want {
			t.Errorf("debounceFor(%s %s) = %v, want %v", c.op, c.name, got, c.want)
		}
	}
}

func TestScheduleKeepsTheSoonerPass(t *testing.T) {
	tm := time.NewTimer(time.Hour)
	defer tm.Stop()
	now := time.Unix(1000, 0)
	due := schedule(tm, time.Time{}, restoreDebounce, now)
	if want := now.Add(restoreDebounce); !due.Equal(want) {
		t.Fatalf("first schedule: due %v, want %v", due, want)
	}
	// A write event right after must not push the restore back.
	if got := schedule(tm, due, 200*time.Millisecond, now.Add(time.Millisecond)); !got.Equal(due) {
		t.Fatalf("later, longer debounce moved the pending pass to %v, want %v", got, due)
	}
	// A removal while a long debounce is pending brings the pass forward.
	long := schedule(tm, time.Time{}, time.Hour, now)
	if got := schedule(tm, long, restoreDebounce, now); !got.Equal(now.Add(restoreDebounce)) {
		t.Fatalf("removal during a long debounce: due %v, want %v", got, now.Add(restoreDebounce))
	}
}

// Run follows every file event but the installer's own writes: nodefile's
// temporary files (their rename into place is the event that counts), the
// staged binary and the state file. A file that only looks temporary is
// another writer's, and a pass looks at what it did.
func TestRunIgnoresOnlyItsOwnWrites(t *testing.T) {
	for name, want := range map[string]bool{
		"/etc/cni/net.d/.10-kindnet.conflist.123456.tmp": true,
		"/opt/cni/bin/.consul-cni.42.tmp":                true,
		"/opt/cni/bin/" + cniconf.StagedBinaryName:       true,
		"/opt/cni/bin/" + cniconf.StateFileName:          true,
		"/etc/cni/net.d/10-kindnet.conflist":             false,
		"/opt/cni/bin/consul-cni":                        false,
		"/etc/cni/net.d/.10-kindnet.conflist.tmp":        false,
		"/etc/cni/net.d/.other-writer.tmp":               false,
	} {
		if got := ownWrite(name); got != want {
			t.Errorf("ownWrite(%s) = %v, want %v", name, got, want)
		}
	}
}
