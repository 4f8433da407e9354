// Package install is the consul-cni installer: it runs in the CNI DaemonSet
// and keeps the consul-cni plugin installed and chained on its node.
//
// One pass (Reconcile) copies the plugin binary into the host's CNI bin
// directory (write, then rename), refreshes the plugin's token file and
// kubeconfig, finds the network the runtime uses (the lexically first valid
// .conf/.conflist/.json of the CNI net directory, as containerd, CRI-O and
// kubelet choose it), converts a single-network file into a .conflist and
// moves the old file out of the runtime's way, and appends consul-cni as the
// last plugin, exactly once. Run repeats the pass whenever the directories
// change (fsnotify) and periodically; on cancellation (SIGTERM) it removes
// everything only when no installer pod will run on the node again, so a
// rolling update never opens a window without the plugin. Ready is the
// DaemonSet's readiness probe. Uninstall removes what the installer added
// and restores converted files.
//
// This package decides and orders; what it works with lives below it:
// conflist reads and edits network configuration files as the runtime
// loads them, nodefile writes files no reader sees half written and no
// other writer's change is lost in, credentials derives the plugin's
// kubeconfig and decides whose token its token file holds, watchcheck
// tells the readiness probe whether the run process watches the
// directories, and leave decides on SIGTERM, from the API and what a watch
// of it saw, whether another installer pod comes to the node.
package install

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/conflist"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/credentials"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/leave"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/nodefile"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/version"
)

// Config is what the installer works on. Directories come in two views:
// as the installer sees them (BinDir, NetDir: host paths mounted into its
// container) and as the runtime on the host sees them (HostBinDir,
// HostNetDir: written into the chain entry and the kubeconfig).
type Config struct {
	BinDir     string
	NetDir     string
	HostBinDir string
	HostNetDir string
	// PluginBinary is the consul-cni executable to install.
	PluginBinary string
	LogLevel     string
	Multus       bool
	// ExcludeNamespaces goes into the entry's exclude_namespaces when not
	// empty.
	ExcludeNamespaces []string
	// Backend goes into the entry's backend when not empty: one of
	// cniconf.Backends.
	Backend string
	// Client is the source of the plugin's kubeconfig. When nil no
	// kubeconfig is written (the plugin then cannot reach the API).
	Client *credentials.Source
	// Resync is the period of full passes besides those triggered by file
	// events; it also bounds how stale the plugin's token copy can get.
	Resync time.Duration
	// Debounce is how long Run waits after a file event for the writer to
	// finish before it looks.
	Debounce time.Duration
	// PodAlive tells whether the pod another installer's token is bound to
	// still runs (credentials.Decide); nil without API access.
	PodAlive credentials.PodAlive
	// PodGone tells whether a pod no longer exists at all (being deleted
	// does not count): consul-k8s's entry stays until its installer's pod
	// is gone or its cleanup removed it (foreign.go). nil without API
	// access.
	PodGone PodGone
	// Recheck is how soon Run looks again while another live installer's
	// token is in the plugin's token file.
	Recheck time.Duration
	Metrics *Metrics
	// Version is this installer's version (default version.Version): an
	// installer never overwrites what a newer one installed (owner.go).
	Version string
	// Decide, when set, is asked on cancellation whether the node keeps an
	// installer (package leave); Run then also keeps the state file's
	// heartbeat. Nil: cancellation leaves everything in place.
	Decide leave.Decider
}

// Installer keeps consul-cni installed and chained.
type Installer struct {
	cfg Config
	// foreign remembers which of consul-k8s's installer pods were seen
	// to exist (foreign.go).
	foreign foreignPods
}

// New checks cfg and returns an installer.
func New(cfg Config) (*Installer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Resync <= 0 {
		cfg.Resync = 30 * time.Second
	}
	if cfg.Debounce <= 0 {
		cfg.Debounce = 200 * time.Millisecond
	}
	if cfg.Recheck <= 0 {
		cfg.Recheck = 2 * time.Second
	}
	if cfg.Version == "" {
		cfg.Version = version.Version
	}
	if cfg.LogLevel == "" {
		cfg.LogLevel = "info"
	}
	return &Installer{cfg: cfg}, nil
}

// Entry is the chain entry the installer writes.
func (in *Installer) Entry() conflist.PluginConfig {
	return conflist.PluginConfig{
		Name: cniconf.PluginName,
		Type: cniconf.PluginType,
		Settings: cniconf.Settings{
			CNIBinDir:  in.cfg.HostBinDir,
			CNINetDir:  in.cfg.HostNetDir,
			Kubeconfig: cniconf.KubeconfigFileName,
			LogLevel:   in.cfg.LogLevel,
			Multus:     in.cfg.Multus,
		},

		ExcludeNamespaces: in.cfg.ExcludeNamespaces,
		Backend:           in.cfg.Backend,
	}
}

// PassResult is what one pass of the installer found and changed.
type PassResult struct {
	// Primary is the network file the runtime reads (container view),
	// empty while there is none.
	Primary string
	// Waiting is true when no valid network configuration exists yet.
	Waiting bool
	// PluginDir is the primary network's plugin directory when the entry
	// lives there.
	PluginDir string
	// Wrote lists what this pass changed.
	Wrote []string
	// Recheck is true while the token file holds the token of another
	// installer that still runs (a rolling update): look again soon.
	Recheck bool
	// YieldedTo is the version of another installer that owns the node's
	// installation (owner.go); this pass then wrote nothing.
	YieldedTo string
}

// Reconcile makes one pass: binary, token and kubeconfig, then the chain.
// Nothing is chained unless the binary is in place; a failure to write the
// credentials is returned but does not stop the chaining.
func (in *Installer) Reconcile(ctx context.Context) (PassResult, error) {
	log := klog.FromContext(ctx)
	start := time.Now()
	var st PassResult
	st, err := in.reconcile(ctx, st)
	switch {
	case err != nil:
		in.cfg.Metrics.reconciled(ResultError, false)
	case st.Waiting:
		in.cfg.Metrics.reconciled(ResultWaiting, false)
	default:
		in.cfg.Metrics.reconciled(ResultChained, true)
	}
	if len(st.Wrote) > 0 {
		log.Info("Updated the node's CNI installation", "wrote", st.Wrote, "primary", st.Primary, "took", time.Since(start).String())
	}
	return st, err
}

func (in *Installer) reconcile(ctx context.Context, st PassResult) (PassResult, error) {
	for _, d := range []string{in.cfg.BinDir, in.cfg.NetDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return st, err
		}
	}
	if in.cfg.PluginBinary == "" {
		return st, errors.New("no plugin binary to install")
	}
	st, yielded := in.yieldToOwner(ctx, st)
	if yielded {
		return st, nil
	}
	changed, err := nodefile.InstallBinary(in.cfg.PluginBinary, in.cfg.BinDir, cniconf.PluginType)
	if err != nil {
		return st, err
	}
	if changed {
		st.Wrote = append(st.Wrote, "binary")
		in.cfg.Metrics.wrote(WroteBinary)
	}
	// A token that cannot be written does not hold the chain back: with
	// its kubeconfig in place the plugin then fails ADD for injected pods,
	// so they wait instead of starting outside the mesh (fail closed), and
	// the error is reported. The kubeconfig itself must exist before the
	// entry does: a chain without it is what the plugin takes for an
	// uninstalled node, through which it lets every pod pass. The test is
	// the plugin's own (cniconf.ResolveKubeconfig): only absence holds the
	// chain back; a kubeconfig that is there but unusable (a directory,
	// unreadable) makes the plugin fail closed, so the chain goes on and
	// the error is reported.
	var credErr error
	if in.cfg.Client != nil {
		w, recheck, err := in.writeCredentials(ctx)
		credErr = err
		st.Wrote = append(st.Wrote, w...)
		st.Recheck = recheck
		_, err = cniconf.ResolveKubeconfig(in.cfg.NetDir, cniconf.KubeconfigFileName)
		if errors.Is(err, cniconf.ErrNoKubeconfig) {
			return st, errors.Join(credErr, fmt.Errorf("the plugin's kubeconfig is not in place, so the plugin is not chained: %w", err))
		}
		if err != nil {
			credErr = errors.Join(credErr, fmt.Errorf("the plugin's kubeconfig (the plugin fails ADD closed with it): %w", err))
		}
	}
	st, err = in.ensureChain(ctx, st)
	if err != nil || st.Waiting {
		return st, errors.Join(credErr, err)
	}
	st, err = in.afterChain(ctx, st)
	return st, errors.Join(credErr, err)
}

// afterChain does what can wait until the chain is complete: it stages a
// copy of the binary for the next restore, and removes the kubeconfig an
// earlier installer of ours wrote under the name consul-k8s's installer
// also uses (the entry names ours now) unless another configuration may
// name it (settleLegacyKubeconfig).
func (in *Installer) afterChain(ctx context.Context, st PassResult) (PassResult, error) {
	var errs []error
	staged, err := nodefile.StageBinary(in.cfg.PluginBinary, in.cfg.BinDir)
	errs = append(errs, err)
	if staged {
		st.Wrote = append(st.Wrote, "staged binary")
	}
	if in.cfg.Client != nil {
		wrote, err := in.settleLegacyKubeconfig(ctx)
		errs = append(errs, err)
		if wrote != "" {
			st.Wrote = append(st.Wrote, wrote)
		}
	}
	return st, errors.Join(errs...)
}

// writeKubeconfig writes the plugin's kubeconfig; tests make it fail.
var writeKubeconfig = nodefile.WriteAtomic

// writeCredentials writes the token copy (see credentials.Decide for which token
// wins when another installer runs too) and the kubeconfig when they differ
// from what is on disk.
func (in *Installer) writeCredentials(ctx context.Context) (wrote []string, recheck bool, err error) {
	// The kubeconfig first: it names the token file and holds no secret.
	kc, err := credentials.Kubeconfig(*in.cfg.Client, filepath.Join(in.cfg.HostNetDir, cniconf.TokenFileName))
	if err != nil {
		return nil, false, err
	}
	kcPath := filepath.Join(in.cfg.NetDir, cniconf.KubeconfigFileName)
	if cur, err := os.ReadFile(kcPath); err != nil || string(cur) != string(kc) {
		if err := writeKubeconfig(kcPath, kc, 0o600); err != nil {
			return nil, false, fmt.Errorf("writing the plugin's kubeconfig: %w", err)
		}
		wrote = append(wrote, "kubeconfig")
		in.cfg.Metrics.wrote(WroteKubeconfig)
	}
	tok, err := in.cfg.Client.ReadToken()
	if err != nil {
		return wrote, false, err
	}
	tokenPath := filepath.Join(in.cfg.NetDir, cniconf.TokenFileName)
	write := true
	if cur, err := os.ReadFile(tokenPath); err == nil {
		write, recheck = credentials.Decide(ctx, cur, tok, in.cfg.PodAlive, time.Now())
	}
	if write {
		if err := nodefile.WriteAtomic(tokenPath, tok, 0o600); err != nil {
			return wrote, false, fmt.Errorf("writing the plugin's token file: %w", err)
		}
		wrote = append(wrote, "token")
		in.cfg.Metrics.wrote(WroteToken)
	}
	return wrote, recheck, nil
}

// ensureChain makes the primary network end with the entry. Each step
// rescans the directory, since every write changes what the runtime sees.
func (in *Installer) ensureChain(ctx context.Context, st PassResult) (PassResult, error) {
	log := klog.FromContext(ctx)
	entry := in.Entry().JSON()
	for attempt := 0; attempt < 10; attempt++ {
		cands, err := conflist.ScanConfDir(in.cfg.NetDir)
		if err != nil {
			return st, err
		}
		p, bad, ok := conflist.Primary(cands)
		for _, b := range bad {
			log.Info("Skipping an invalid CNI configuration file", "file", b.Path, "err", b.Err.Error())
		}
		if !ok {
			st.Waiting, st.Primary = true, ""
			return st, nil
		}
		st.Waiting, st.Primary = false, p.Path
		if !p.List {
			err := in.convert(p, entry)
			if errors.Is(err, nodefile.ErrConflict) {
				continue
			}
			if err != nil {
				return st, fmt.Errorf("converting %s into a configuration list: %w", p.Path, err)
			}
			st.Wrote = append(st.Wrote, "convert "+filepath.Base(p.Path))
			in.cfg.Metrics.wrote(WroteConvert)
			continue
		}
		if in.keepsForeignEntry(ctx, p, &st) {
			return st, nil
		}
		changed, pluginDir, err := in.chainList(p, entry)
		st.PluginDir = pluginDir
		if errors.Is(err, nodefile.ErrConflict) {
			continue
		}
		if err != nil {
			return st, fmt.Errorf("chaining consul-cni into %s: %w", p.Path, err)
		}
		if !changed {
			return st, nil
		}
		st.Wrote = append(st.Wrote, "chain "+filepath.Base(p.Path))
		in.cfg.Metrics.wrote(WroteChain)
	}
	return st, errors.New("the CNI configuration kept changing while it was being chained; will retry")
}

// chainList makes the configuration list end with the entry, inline or, for
// a network that takes plugins from its plugin directory, as the last file
// there.
func (in *Installer) chainList(p conflist.Candidate, entry []byte) (changed bool, pluginDir string, err error) {
	l, err := conflist.DecodeList(p.Raw)
	if err != nil {
		return false, "", err
	}
	inDir, err := conflist.UsesPluginDir(p.Path, l)
	if err != nil {
		return false, "", err
	}
	ours, err := conflist.PluginDirFiles(p.Path, l.Name(), true)
	if err != nil {
		return false, "", err
	}
	if !inDir {
		out, ch, err := conflist.ChainInline(p.Raw, entry)
		if err != nil {
			return false, "", err
		}
		if ch {
			if err := nodefile.ReplaceIfUnchanged(p.Path, p.Raw, out); err != nil {
				return false, "", err
			}
		}
		for _, f := range ours {
			if err := nodefile.RemoveIfExists(f); err != nil {
				return false, "", err
			}
		}
		return ch || len(ours) > 0, "", nil
	}
	pluginDir = filepath.Join(filepath.Dir(p.Path), l.Name())
	out, ch, err := conflist.UnchainInline(p.Raw)
	if err != nil {
		return false, pluginDir, err
	}
	if ch {
		if err := nodefile.ReplaceIfUnchanged(p.Path, p.Raw, out); err != nil {
			return false, pluginDir, err
		}
		changed = true
	}
	foreign, err := conflist.PluginDirFiles(p.Path, l.Name(), false)
	if err != nil {
		return false, pluginDir, err
	}
	target := filepath.Join(pluginDir, conflist.PluginDirEntryName(foreign))
	for _, f := range ours {
		if f != target {
			if err := nodefile.RemoveIfExists(f); err != nil {
				return false, pluginDir, err
			}
			changed = true
		}
	}
	if cur, err := os.ReadFile(target); err != nil || !conflist.SameJSON(cur, entry) {
		body, err := conflist.Marshal(json.RawMessage(entry))
		if err != nil {
			return false, pluginDir, err
		}
		if err := nodefile.WriteAtomic(target, body, 0o644); err != nil {
			return false, pluginDir, err
		}
		changed = true
	}
	return changed, pluginDir, nil
}

// convert writes <stem>.conflist holding the single network of p followed
// by the entry, then renames p out of the runtime's way (p + BackupSuffix).
// The new list is written before the old file moves, so the runtime always
// finds a network. A .conflist of the same stem that was not made by an
// earlier conversion is kept aside too.
func (in *Installer) convert(p conflist.Candidate, entry []byte) error {
	out, err := conflist.ConvertSingle(p.Raw, entry)
	if err != nil {
		return err
	}
	st, err := os.Stat(p.Path)
	if err != nil {
		return err
	}
	target := strings.TrimSuffix(p.Path, filepath.Ext(p.Path)) + ".conflist"
	backup := p.Path + BackupSuffix
	if nodefile.Exists(target) && !nodefile.Exists(backup) {
		if err := os.Rename(target, freeName(target+BackupSuffix)); err != nil {
			return err
		}
	}
	if err := nodefile.WriteAtomic(target, out, st.Mode().Perm()); err != nil {
		return err
	}
	cur, err := os.ReadFile(p.Path)
	if err != nil {
		return err
	}
	if string(cur) != string(p.Raw) {
		return nodefile.ErrConflict
	}
	return os.Rename(p.Path, backup)
}

// freeName returns path, or path with a numeric suffix when path exists.
func freeName(path string) string {
	if !nodefile.Exists(path) {
		return path
	}
	for i := 1; ; i++ {
		p := fmt.Sprintf("%s.%d", path, i)
		if !nodefile.Exists(p) {
			return p
		}
	}
}

// Run keeps the plugin installed and chained until ctx is cancelled. It
// makes a pass at once, after every change in the watched directories
// (debounced) and every Resync. ready, when not nil, receives the outcome of
// each pass. On cancellation (SIGTERM) it decides with Config.Decide
// whether the node keeps an installer, and removes everything when it does
// not (stop.go); without Decide everything stays in place.
func (in *Installer) Run(ctx context.Context, ready func(PassResult, error)) error {
	log := klog.FromContext(ctx)
	for _, d := range []string{in.cfg.BinDir, in.cfg.NetDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	// A watch that cannot be set up (inotify limits) does not stop the
	// installer: its periodic pass still restores the chain, it tries
	// again at every pass, and `ready` fails saying why (pkg/install/watchcheck).
	w := &dirWatcher{log: log, watched: map[string]uint64{}}
	defer w.close()
	rewatch := func(st PassResult) {
		dirs := []string{in.cfg.NetDir, in.cfg.BinDir}
		if in.cfg.Client != nil && in.cfg.Client.TokenFile != "" {
			dirs = append(dirs, filepath.Dir(in.cfg.Client.TokenFile))
		}
		w.rewatch(append(dirs, st.PluginDir)...)
	}
	recheck := time.NewTimer(time.Hour)
	recheck.Stop()
	defer recheck.Stop()
	waiting := false
	pass := func() {
		st, err := in.Reconcile(ctx)
		if st.Recheck {
			recheck.Reset(in.cfg.Recheck)
		}
		switch {
		case err != nil:
			log.Error(err, "CNI installation pass failed; will retry")
		case st.Waiting && !waiting:
			log.Info("Waiting for the primary CNI to write its network configuration", "dir", in.cfg.NetDir)
		}
		waiting = err == nil && st.Waiting
		rewatch(st)
		if ready != nil {
			ready(st, err)
		}
	}
	rewatch(PassResult{})
	in.cleanTemps(ctx)
	pass()
	return in.serve(ctx, w, recheck, pass)
}

// serve runs Run's passes: after file events (debounced), rechecks,
// resyncs, and the heartbeat, until ctx is cancelled (then stop).
func (in *Installer) serve(ctx context.Context, w *dirWatcher, recheck *time.Timer, pass func()) error {
	log := klog.FromContext(ctx)
	resync := time.NewTicker(in.cfg.Resync)
	defer resync.Stop()
	var beat <-chan time.Time
	if in.cfg.Decide != nil {
		in.heartbeat(ctx)
		t := time.NewTicker(cniconf.HeartbeatInterval)
		defer t.Stop()
		beat = t.C
	}
	debounce := time.NewTimer(time.Hour)
	debounce.Stop()
	var due time.Time // when the pending debounced pass runs; zero when none
	for {
		select {
		case <-ctx.Done():
			in.stop(ctx)
			return nil
		case ev, ok := <-w.events():
			if !ok {
				return errors.New("file watcher closed")
			}
			if ownWrite(ev.Name) {
				continue
			}
			log.V(4).Info("File event", "event", ev.String())
			due = schedule(debounce, due, in.debounceFor(ev), time.Now())
		case err, ok := <-w.errors():
			if !ok {
				return errors.New("file watcher closed")
			}
			log.Error(err, "File watcher error; relying on the periodic pass")
		case <-debounce.C:
			due = time.Time{}
			pass()
		case <-recheck.C:
			pass()
		case <-resync.C:
			in.cleanTemps(ctx)
			pass()
		case <-beat:
			in.heartbeat(ctx)
		}
	}
}

// cleanTemps removes what writers killed mid-write left (temp.go).
func (in *Installer) cleanTemps(ctx context.Context) {
	removed, err := in.removeTempFiles(staleTempAge)
	if len(removed) > 0 {
		klog.FromContext(ctx).Info("Removed temporary files a killed writer left", "files", removed)
	}
	if err != nil {
		klog.FromContext(ctx).Error(err, "Removing temporary files a killed writer left")
	}
}

// dirWatcher keeps an fsnotify watch on directories; a watch follows the
// directory, not its path, so a directory removed, recreated or swapped is
// watched again by rewatch. The watcher itself is made on first use and
// again after it could not be (fs.inotify.max_user_instances reached).
type dirWatcher struct {
	w   *fsnotify.Watcher
	log klog.Logger
	// watched maps each watched directory to the inode the watch is on.
	watched map[string]uint64
	// failed is the last setup error reported, so each is logged once.
	failed string
}

// events and errors are the watcher's channels, nil (never ready) while
// there is no watcher.
func (d *dirWatcher) events() chan fsnotify.Event {
	if d.w == nil {
		return nil
	}
	return d.w.Events
}

func (d *dirWatcher) errors() chan error {
	if d.w == nil {
		return nil
	}
	return d.w.Errors
}

func (d *dirWatcher) close() {
	if d.w != nil {
		d.w.Close()
	}
}

// report logs a watch that cannot be set up, once per distinct error.
func (d *dirWatcher) report(err error) {
	if err.Error() == d.failed {
		return
	}
	d.failed = err.Error()
	d.log.Error(err, "Cannot watch the CNI directories: changes are seen only by the periodic pass (--resync), and the readiness probe fails until the watch is set up; check fs.inotify.max_user_instances and fs.inotify.max_user_watches")
}

// watch adds a watch on dir unless it is watched on its current inode or
// does not exist yet.
func (d *dirWatcher) watch(dir string) {
	if dir == "" || d.w == nil {
		return
	}
	ino := inode(dir)
	if ino == 0 {
		return
	}
	if old, ok := d.watched[dir]; ok && old == ino {
		return
	}
	if err := d.w.Add(dir); err != nil {
		d.report(fmt.Errorf("watching %s: %w", dir, err))
		return
	}
	d.watched[dir] = ino
}

// rewatch makes the watcher if there is none, drops the watches whose
// directory changed inode and watches dirs.
func (d *dirWatcher) rewatch(dirs ...string) {
	if d.w == nil {
		w, err := newWatcher()
		if err != nil {
			d.report(fmt.Errorf("starting the file watcher: %w", err))
			return
		}
		d.w = w
	}
	for dir, ino := range d.watched {
		if inode(dir) != ino {
			_ = d.w.Remove(dir)
			delete(d.watched, dir)
		}
	}
	for _, dir := range dirs {
		d.watch(dir)
	}
}

// newWatcher makes an fsnotify watcher; tests make it fail.
var newWatcher = fsnotify.NewWatcher

// inode returns the inode of path, 0 when it cannot be read.
func inode(path string) uint64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		return s.Ino
	}
	return 0
}

// ownWrite reports whether a file event is one of the installer's own
// writes that no pass needs to follow: a temporary file of nodefile's
// (its rename into place is the event that counts), the staged copy of the
// binary, the state file.
func ownWrite(path string) bool {
	base := filepath.Base(path)
	_, temp := nodefile.TempTarget(base)
	return temp || base == cniconf.StagedBinaryName || base == cniconf.StateFileName
}

// VerifyInstalled returns nil only when the plugin binary is installed (identical to
// PluginBinary) and consul-cni is the last plugin, exactly once, of the
// network the runtime reads, with its kubeconfig and token in place.
// Otherwise the error says what is missing.
func (in *Installer) VerifyInstalled() error {
	bin := filepath.Join(in.cfg.BinDir, cniconf.PluginType)
	st, err := os.Stat(bin)
	if err != nil {
		return fmt.Errorf("plugin binary: %w", err)
	}
	if !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("plugin binary %s is not an executable file", bin)
	}
	if o, yield := in.ownerToYieldTo(context.Background()); yield {
		klog.V(4).InfoS("Another installer owns the plugin binary", "owner", o.Version, "ownerPod", o.Pod)
	} else if in.cfg.PluginBinary != "" {
		same, err := nodefile.SameBinary(in.cfg.PluginBinary, bin)
		if err != nil {
			return fmt.Errorf("comparing plugin binaries: %w", err)
		}
		if !same {
			return fmt.Errorf("plugin binary %s differs from %s", bin, in.cfg.PluginBinary)
		}
	}
	cands, err := conflist.ScanConfDir(in.cfg.NetDir)
	if err != nil {
		return err
	}
	p, _, ok := conflist.Primary(cands)
	if !ok {
		return fmt.Errorf("no valid CNI network configuration in %s yet", in.cfg.NetDir)
	}
	if !p.List {
		return fmt.Errorf("the runtime reads %s, a single-network file without consul-cni", p.Path)
	}
	s := conflist.FindEntry(p.Network)
	switch {
	case s.Count == 0:
		return fmt.Errorf("consul-cni is not in the chain of %s (network %q)", p.Path, p.Network.Name)
	case !s.Last:
		return fmt.Errorf("consul-cni is not the last plugin, exactly once, of %s (%d entries)", p.Path, s.Count)
	}
	if in.cfg.Client != nil {
		var e conflist.PluginConfig
		if err := json.Unmarshal(s.Entry, &e); err != nil {
			return fmt.Errorf("consul-cni entry of %s: %w", p.Path, err)
		}
		kc := filepath.Join(in.cfg.NetDir, e.Kubeconfig)
		if filepath.IsAbs(e.Kubeconfig) || e.Kubeconfig == "" {
			kc = filepath.Join(in.cfg.NetDir, cniconf.KubeconfigFileName)
		}
		if _, err := clientcmd.LoadFromFile(kc); err != nil {
			return fmt.Errorf("plugin kubeconfig: %w", err)
		}
		tok, err := os.ReadFile(filepath.Join(in.cfg.NetDir, cniconf.TokenFileName))
		if err != nil {
			return fmt.Errorf("plugin token: %w", err)
		}
		if len(tok) == 0 {
			return errors.New("plugin token file is empty")
		}
	}
	return nil
}
