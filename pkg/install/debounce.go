package install

import (
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/conflist"
)

// restoreDebounce is how soon a pass follows an event that can mean
// something of the installation was taken away: one of our files removed
// or renamed away, or a network configuration replaced by a rename (an
// atomic write, complete when the event arrives) or written in place.
// Another installer cleaning up on its way out is the case it is for:
// consul-k8s's install-cni, on SIGTERM, removes its consul-cni entry by
// writing the list in place, then removes the binary and its kubeconfig;
// new sandboxes are created without the plugin until the pass puts
// everything back. A list read while it is being written in place is read
// again every restoreDebounce (conflist.SettleStep). Every other event waits
// Config.Debounce for its writer to finish.
const restoreDebounce = conflist.SettleStep

// debounceFor returns how long Run waits after ev before its pass.
func (in *Installer) debounceFor(ev fsnotify.Event) time.Duration {
	dir, base := filepath.Split(ev.Name)
	dir = filepath.Clean(dir)
	if ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename) {
		switch {
		case dir == filepath.Clean(in.cfg.BinDir) && base == cniconf.PluginType,
			dir == filepath.Clean(in.cfg.NetDir) && (base == cniconf.KubeconfigFileName || base == cniconf.TokenFileName):
			return restoreDebounce
		}
	}
	if (ev.Has(fsnotify.Create) || ev.Has(fsnotify.Write)) && dir == filepath.Clean(in.cfg.NetDir) {
		for _, ext := range conflist.Extensions {
			if filepath.Ext(base) == ext {
				return restoreDebounce
			}
		}
	}
	return in.cfg.Debounce
}

// schedule sets the debounce timer to fire after d, unless a pass already
// pending (due, zero when none) would run sooner than that: a restore
// scheduled after a removal is not pushed back by the events of the writes
// that follow. It returns when the pending pass runs.
func schedule(t *time.Timer, due time.Time, d time.Duration, now time.Time) time.Time {
	next := now.Add(d)
	if !due.IsZero() && due.Before(next) {
		return due
	}
	t.Reset(d)
	return next
}
