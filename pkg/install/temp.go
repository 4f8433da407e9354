package install

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/conflist"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/nodefile"
)

// Every file the installer writes is first written to a temporary file
// beside it, named "." + the target's name + "." + digits + ".tmp"
// (pkg/install/nodefile), and renamed into place. A writer killed between
// the two (SIGKILL, the OOM killer, a node losing power) leaves the
// temporary file: in the bin directory a copy of the plugin, about 10 MB
// each time. The installer removes such files when it starts and at every
// periodic pass once they are older than staleTempAge (a live write takes
// well under a second, and another installer may be writing during a
// rolling update); uninstall removes them at any age, and Leftovers lists
// them.

// staleTempAge is the age from which a temporary file of the installer's
// is taken for the remains of a killed writer.
const staleTempAge = time.Minute

// ownTarget reports whether the installer writes a file named target in
// the bin directory (bin) or in the net directory and its plugin
// directories: the plugin and its staged copy; the kubeconfig (also under
// the earlier name), the token, the owner file, and network configuration
// files.
func ownTarget(target string, bin bool) bool {
	if bin {
		// A binary's temporary file drops the leading dot of the
		// staged copy's name, other files keep it (nodefile.TempTarget).
		for _, f := range []string{cniconf.StagedBinaryName, cniconf.StateFileName} {
			if target == f || "."+target == f {
				return true
			}
		}
		return target == cniconf.PluginType
	}
	switch target {
	case cniconf.KubeconfigFileName, cniconf.LegacyKubeconfigFileName, cniconf.TokenFileName, cniconf.OwnerFileName:
		return true
	}
	return slices.Contains(conflist.Extensions, filepath.Ext(target))
}

// tempFiles lists the installer's temporary files in the bin directory, the
// net directory and the net directory's subdirectories (plugin
// directories) that are at least minAge old.
func (in *Installer) tempFiles(minAge time.Duration) ([]string, error) {
	dirs := []struct {
		path string
		bin  bool
	}{{in.cfg.BinDir, true}, {in.cfg.NetDir, false}}
	if ents, err := os.ReadDir(in.cfg.NetDir); err == nil {
		for _, e := range ents {
			if e.IsDir() {
				dirs = append(dirs, struct {
					path string
					bin  bool
				}{filepath.Join(in.cfg.NetDir, e.Name()), false})
			}
		}
	}
	var out []string
	var errs []error
	now := time.Now()
	for _, d := range dirs {
		ents, err := os.ReadDir(d.path)
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
			continue
		}
		for _, e := range ents {
			target, ok := nodefile.TempTarget(e.Name())
			if !ok || e.IsDir() || !ownTarget(target, d.bin) {
				continue
			}
			if info, err := e.Info(); err == nil && now.Sub(info.ModTime()) >= minAge {
				out = append(out, filepath.Join(d.path, e.Name()))
			}
		}
	}
	return out, errors.Join(errs...)
}

// removeTempFiles removes the installer's temporary files at least minAge
// old and returns their names.
func (in *Installer) removeTempFiles(minAge time.Duration) ([]string, error) {
	files, err := in.tempFiles(minAge)
	var removed []string
	errs := []error{err}
	for _, f := range files {
		if err := nodefile.RemoveIfExists(f); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, f)
	}
	return removed, errors.Join(errs...)
}
