package install

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
)

func TestDebounceFor(t *testing.T) {
	n := newNode(t)
	in := n.installer(t, func(c *Config) { c.Debounce = time.Second })
	for _, c := range []struct {
		name string
		op   fsnotify.Op
		want time.Duration
	}{
		{filepath.Join(n.bin, PluginType), fsnotify.Remove, restoreDebounce},
		{filepath.Join(n.bin, PluginType), fsnotify.Rename, restoreDebounce},
		{filepath.Join(n.bin, PluginType), fsnotify.Write, time.Second},
		{filepath.Join(n.bin, "ptp"), fsnotify.Remove, time.Second},
		{filepath.Join(n.net, KubeconfigFileName), fsnotify.Remove, restoreDebounce},
		{filepath.Join(n.net, TokenFileName), fsnotify.Rename, restoreDebounce},
		{filepath.Join(n.net, "10-kindnet.conflist"), fsnotify.Create, restoreDebounce},
		{filepath.Join(n.net, "10-kindnet.conflist"), fsnotify.Write, time.Second},
		{filepath.Join(n.net, "10-kindnet.conflist.install-cni.tmp"), fsnotify.Create, time.Second},
		{filepath.Join(n.net, "kindnet", "zzz-consul-cni.conf"), fsnotify.Remove, time.Second},
	} {
		if got := in.debounceFor(fsnotify.Event{Name: c.name, Op: c.op}); got != c.want {
			t.Errorf("debounceFor(%s %s) = %v, want %v", c.op, c.name, got, c.want)
		}
	}
}
