package install

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/conflist"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/nodefile"
)

// BackupSuffix is appended to a single-network file (.conf/.json) once it
// has been converted into a .conflist, so that the runtime no longer reads
// it, and to a .conflist the conversion had to replace.
const BackupSuffix = ".consul-cni-orig"

// UninstallResult says what Uninstall found of the installer's on the node.
type UninstallResult struct {
	// Removed lists what was removed or restored, as file names relative to
	// their directory ("10-net.conflist: entry", "consul-cni", ...).
	Removed []string
	// KeptBinary is set when the plugin binary stayed because a chain entry
	// of another installer still names it.
	KeptBinary bool
}

// Found reports whether anything of the installer's was on the node.
func (r UninstallResult) Found() bool { return len(r.Removed) > 0 }

// Uninstall removes what the installer added: converted files are
// restored, its consul-cni entries leave every configuration list (inline
// and plugin directories), retried while other writers change the lists,
// and only once every list is clean are the kubeconfig (under either name,
// when ours), token, owner file, staged binary and binary removed, so no
// chain ever names a missing binary or credentials. A consul-cni entry of
// another installer (one naming another kubeconfig) is left in place and
// so is the binary it runs. Both directories must exist. It must run only
// once no installer of ours runs on the node any more. This is the node
// half of uninstalling; the cluster half, which turns every installer into
// a remover running it, is pkg/uninstallall (`uninstall-all`).
func (in *Installer) Uninstall(ctx context.Context) (UninstallResult, error) {
	var res UninstallResult
	for _, d := range []struct{ flag, path string }{{"cni-net-dir", in.cfg.NetDir}, {"cni-bin-dir", in.cfg.BinDir}} {
		st, err := os.Stat(d.path)
		if err != nil {
			return res, fmt.Errorf("%s %s: %w", d.flag, d.path, err)
		}
		if !st.IsDir() {
			return res, fmt.Errorf("%s %s: not a directory", d.flag, d.path)
		}
	}
	if err := in.restoreConverted(ctx, &res); err != nil {
		return res, err
	}
	if err := in.unchainAll(ctx, &res); err != nil {
		return res, fmt.Errorf("%w; the plugin's binary and credentials are kept until every list is clean", err)
	}
	ours, foreign, err := in.entriesLeft()
	if err != nil {
		return res, err
	}
	if len(ours) > 0 {
		// Put back meanwhile (an installer of ours still running).
		return res, fmt.Errorf("consul-cni entries came back in %v; the plugin's binary and credentials are kept", ours)
	}
	var errs []error
	for _, f := range in.ownNetFiles() {
		errs = append(errs, in.remove(filepath.Join(in.cfg.NetDir, f), &res))
	}
	// The staged copy and the state file go in any case: no runtime runs
	// them.
	errs = append(errs, in.remove(filepath.Join(in.cfg.BinDir, cniconf.StagedBinaryName), &res))
	errs = append(errs, in.remove(in.statePath(), &res))
	temps, err := in.removeTempFiles(0)
	errs = append(errs, err)
	for _, f := range temps {
		res.Removed = append(res.Removed, filepath.Base(f))
	}
	if len(foreign) > 0 {
		res.KeptBinary = true
		klog.FromContext(ctx).Info("Keeping the plugin binary: another installer's entry still names it", "files", foreign)
	} else {
		errs = append(errs, in.remove(filepath.Join(in.cfg.BinDir, cniconf.PluginType), &res))
	}
	return res, errors.Join(errs...)
}

// ownNetFiles lists the files of the installer's in the net dir that
// exist: kubeconfig, token, owner file, and the kubeconfig under the name
// earlier installers of ours used when that file is theirs (never
// consul-k8s's under the same name).
func (in *Installer) ownNetFiles() []string {
	var files []string
	for _, f := range []string{cniconf.KubeconfigFileName, cniconf.TokenFileName, cniconf.OwnerFileName} {
		if nodefile.Exists(filepath.Join(in.cfg.NetDir, f)) {
			files = append(files, f)
		}
	}
	if in.legacyKubeconfigIsOurs() {
		files = append(files, cniconf.LegacyKubeconfigFileName)
	}
	return files
}

func (in *Installer) remove(path string, res *UninstallResult) error {
	if !nodefile.Exists(path) {
		return nil
	}
	if err := nodefile.RemoveIfExists(path); err != nil {
		return err
	}
	res.Removed = append(res.Removed, filepath.Base(path))
	return nil
}

// isOurs reports whether a chain entry is the installer's: type consul-cni
// and the kubeconfig the installer writes, or the name earlier installers
// of ours wrote it under while the file there is theirs (consul-k8s's
// installer uses that name too).
func (in *Installer) isOurs(raw []byte) bool {
	var e conflist.PluginConfig
	if json.Unmarshal(raw, &e) != nil || e.Type != cniconf.PluginType {
		return false
	}
	kc := e.Kubeconfig
	if filepath.IsAbs(kc) && filepath.Dir(kc) == filepath.Clean(in.cfg.HostNetDir) {
		kc = filepath.Base(kc)
	}
	return kc == in.Entry().Kubeconfig || kc == cniconf.LegacyKubeconfigFileName && in.legacyKubeconfigIsOurs()
}

// restoreConverted puts back the single-network files a conversion set
// aside (and removes the lists made from them), then the lists it had to
// move away. It never deletes or replaces a list it did not write: a list
// under the converted name that is not the conversion of the set-aside file
// (the primary CNI wrote its own since) is kept (unchainAll takes our entry
// out of it), and the set-aside files of that name are dropped as stale,
// since the old single-network file sorts first and would shadow it.
// Restores never replace a file (RENAME_NOREPLACE).
func (in *Installer) restoreConverted(ctx context.Context, res *UninstallResult) error {
	entries, err := os.ReadDir(in.cfg.NetDir)
	if err != nil {
		return err
	}
	var errs []error
	stale := map[string]bool{} // lists the primary rewrote since the conversion
	for _, e := range entries {
		orig, ok := in.backupOf(e, ".conf", ".json")
		if !ok {
			continue
		}
		res.Removed = append(res.Removed, e.Name())
		fresh, err := in.restoreSingle(ctx, orig)
		errs = append(errs, err)
		if fresh {
			stale[strings.TrimSuffix(orig, filepath.Ext(orig))+".conflist"] = true
		}
	}
	for _, e := range entries {
		orig, ok := in.backupOf(e, ".conflist")
		if !ok {
			continue
		}
		res.Removed = append(res.Removed, e.Name())
		errs = append(errs, in.restoreList(ctx, orig, stale[orig]))
	}
	return errors.Join(errs...)
}

// backupOf returns the file a set-aside file e stands for, when e is one
// and that file has one of the extensions.
func (in *Installer) backupOf(e fs.DirEntry, exts ...string) (string, bool) {
	if e.IsDir() || !strings.HasSuffix(e.Name(), BackupSuffix) {
		return "", false
	}
	orig := strings.TrimSuffix(filepath.Join(in.cfg.NetDir, e.Name()), BackupSuffix)
	return orig, slices.Contains(exts, filepath.Ext(orig)) && nodefile.Exists(orig+BackupSuffix)
}

// restoreSingle puts back the single-network file orig set aside by a
// conversion and removes the list made from it. rewritten reports that the
// list under that name is no longer the conversion (the primary CNI wrote
// its own): the list stays and the set-aside file, stale, goes.
func (in *Installer) restoreSingle(ctx context.Context, orig string) (rewritten bool, err error) {
	log := klog.FromContext(ctx)
	backup := orig + BackupSuffix
	converted := strings.TrimSuffix(orig, filepath.Ext(orig)) + ".conflist"
	old, err := os.ReadFile(backup)
	if err != nil {
		return false, err
	}
	conv, err := os.ReadFile(converted)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return false, err
	case !conflist.ConvertedFrom(conv, old):
		log.Info("Keeping a configuration list written since the conversion; dropping the stale file it replaced", "list", converted, "stale", backup)
		return true, nodefile.RemoveIfExists(backup)
	default:
		if err := nodefile.RemoveIfUnchanged(converted, conv); errors.Is(err, nodefile.ErrConflict) {
			log.Info("A configuration list changed while being removed; keeping it, dropping the stale file it replaced", "list", converted, "stale", backup)
			return true, nodefile.RemoveIfExists(backup)
		} else if err != nil {
			return false, err
		}
	}
	restored, err := nodefile.RenameNoReplace(backup, orig)
	if err != nil {
		return false, err
	}
	if !restored {
		// The primary CNI wrote the file again since: the set-aside
		// copy is stale.
		return false, nodefile.RemoveIfExists(backup)
	}
	log.Info("Restored a converted network configuration", "file", orig)
	return false, nil
}

// restoreList puts back a list a conversion moved out of the way, unless a
// file took its name since; stale drops it (the primary wrote a newer list
// under that name).
func (in *Installer) restoreList(ctx context.Context, orig string, stale bool) error {
	backup := orig + BackupSuffix
	if stale {
		klog.FromContext(ctx).Info("Dropping a configuration list set aside by a conversion: the primary CNI wrote a newer one", "stale", backup, "list", orig)
		return nodefile.RemoveIfExists(backup)
	}
	restored, err := nodefile.RenameNoReplace(backup, orig)
	if err == nil && restored {
		klog.FromContext(ctx).Info("Restored a configuration list set aside by a conversion", "file", orig)
	}
	return err
}

// unchainAll removes the installer's entries from every configuration list
// and plugin directory, starting over when another writer changed a list
// meanwhile (as ensureChain does), until a pass finds nothing of ours.
func (in *Installer) unchainAll(ctx context.Context, res *UninstallResult) error {
	for attempt := 0; attempt < 10; attempt++ {
		changed, err := in.unchainPass(ctx, res)
		if errors.Is(err, nodefile.ErrConflict) {
			continue
		}
		if err != nil {
			return err
		}
		if !changed {
			return nil
		}
	}
	return errors.New("the CNI configuration kept changing while consul-cni was being removed from it")
}

func (in *Installer) unchainPass(ctx context.Context, res *UninstallResult) (changed bool, err error) {
	log := klog.FromContext(ctx)
	cands, err := conflist.ScanConfDir(in.cfg.NetDir)
	if err != nil {
		return false, err
	}
	for _, c := range cands {
		if !c.List || c.Raw == nil {
			continue
		}
		l, err := conflist.DecodeList(c.Raw)
		if err != nil {
			continue // not a list we can edit; nothing of ours can be in it
		}
		if l.WithoutEntries(in.isOurs) {
			out, err := l.Encode()
			if err != nil {
				return changed, err
			}
			if err := nodefile.ReplaceIfUnchanged(c.Path, c.Raw, out); err != nil {
				return changed, err
			}
			changed = true
			res.Removed = append(res.Removed, filepath.Base(c.Path)+": entry")
			log.Info("Removed consul-cni from a configuration list", "file", c.Path)
		}
		files, err := conflist.PluginDirFiles(c.Path, l.Name(), true)
		if err != nil {
			return changed, err
		}
		for _, f := range files {
			if b, err := os.ReadFile(f); err != nil || !in.isOurs(b) {
				continue
			}
			if err := nodefile.RemoveIfExists(f); err != nil {
				return changed, err
			}
			changed = true
			res.Removed = append(res.Removed, filepath.Join(filepath.Base(filepath.Dir(f)), filepath.Base(f)))
		}
	}
	return changed, nil
}

// entriesLeft lists the configuration files whose chain (as the runtime
// loads it) holds a consul-cni entry of the installer's (ours) or of
// another installer (foreign).
func (in *Installer) entriesLeft() (ours, foreign []string, err error) {
	cands, err := conflist.ScanConfDir(in.cfg.NetDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, nil, err
	}
	for _, c := range cands {
		if c.Network == nil {
			continue
		}
		o, f := false, false
		for _, p := range c.Network.Plugins {
			if p.Network.Type == cniconf.PluginType {
				mine := in.isOurs(p.Bytes)
				o, f = o || mine, f || !mine
			}
		}
		if o {
			ours = append(ours, c.Path)
		}
		if f {
			foreign = append(foreign, c.Path)
		}
	}
	return ours, foreign, nil
}

// Leftovers lists what of the installer's is still on the node: its entries
// in configuration lists and plugin directories, set-aside files, the
// kubeconfig (also one under the earlier name when it is ours), the token,
// the owner file, temporary files a killed writer left, the staged binary, and the binary unless another installer's entry
// names it. Empty means the node is clean (the uninstall mode's readiness).
func (in *Installer) Leftovers() ([]string, error) {
	var left []string
	entries, err := os.ReadDir(in.cfg.NetDir)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if !e.IsDir() && strings.HasSuffix(e.Name(), BackupSuffix) {
			left = append(left, e.Name())
		}
	}
	cands, err := conflist.ScanConfDir(in.cfg.NetDir)
	if err != nil {
		return nil, err
	}
	for _, c := range cands {
		if !c.List || c.Raw == nil {
			continue
		}
		l, err := conflist.DecodeList(c.Raw)
		if err != nil {
			continue
		}
		for _, p := range l.Plugins() {
			if in.isOurs(p) {
				left = append(left, filepath.Base(c.Path)+": entry")
			}
		}
		files, err := conflist.PluginDirFiles(c.Path, l.Name(), true)
		if err != nil {
			return nil, err
		}
		for _, f := range files {
			if b, err := os.ReadFile(f); err == nil && in.isOurs(b) {
				left = append(left, filepath.Join(filepath.Base(filepath.Dir(f)), filepath.Base(f)))
			}
		}
	}
	left = append(left, in.ownNetFiles()...)
	temps, err := in.tempFiles(0)
	if err != nil {
		return nil, err
	}
	for _, f := range temps {
		left = append(left, filepath.Base(f))
	}
	for _, f := range []string{cniconf.StagedBinaryName, cniconf.StateFileName} {
		if nodefile.Exists(filepath.Join(in.cfg.BinDir, f)) {
			left = append(left, f)
		}
	}
	if nodefile.Exists(filepath.Join(in.cfg.BinDir, cniconf.PluginType)) {
		_, foreign, err := in.entriesLeft()
		if err != nil {
			return nil, err
		}
		if len(foreign) == 0 {
			left = append(left, cniconf.PluginType)
		}
	}
	return left, nil
}

// KeepUninstalled runs Uninstall at once and then every Resync until ctx
// is cancelled, so the node stays clean (the uninstall overlay's
// DaemonSet); report, when not nil, receives each outcome.
func (in *Installer) KeepUninstalled(ctx context.Context, report func(UninstallResult, error)) {
	log := klog.FromContext(ctx)
	t := time.NewTicker(in.cfg.Resync)
	defer t.Stop()
	for {
		res, err := in.Uninstall(ctx)
		switch {
		case err != nil:
			log.Error(err, "Uninstall incomplete; will retry")
		case res.Found():
			log.Info("Removed consul-cni from the node", "removed", res.Removed, "keptBinary", res.KeptBinary)
		}
		if report != nil {
			report(res, err)
		}
		select {
		case <-ctx.Done():
			log.Info("Stopping; nothing of consul-cni is put back")
			return
		case <-t.C:
		}
	}
}
