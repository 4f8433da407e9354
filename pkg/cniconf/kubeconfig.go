package cniconf

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// ErrNoKubeconfig means the configured kubeconfig does not exist at all:
// neither the file nor a versioned "<file>-*" is there (every lookup
// answered "no such file or directory"). The installer removes it only
// after its entries left every list (uninstall), so the plugin takes this,
// and only this, for a node it no longer runs on.
var ErrNoKubeconfig = errors.New("no kubeconfig found")

// ResolveKubeconfig returns the kubeconfig file the plugin uses, as
// consul-k8s's plugin finds it: dir/name when it is a regular file,
// otherwise the most recently modified regular file dir/name-* (installers
// that version the file write a new one and remove the old). An absolute
// name is used as it is.
//
// Only absence is ErrNoKubeconfig. Anything else that stands in the way
// (permission denied, an I/O error, a symbolic link loop or a dangling
// link, a directory or another non-regular file, an unreadable directory)
// is a different error: the file may be there, so the caller fails closed
// instead of taking the node for one the plugin left.
func ResolveKubeconfig(dir, name string) (string, error) {
	if name == "" {
		return "", errors.New("no kubeconfig is configured (key \"kubeconfig\" of the consul-cni entry in the conflist)")
	}
	path := name
	if !filepath.IsAbs(name) {
		path = filepath.Join(dir, name)
	}
	var problems []error
	if err := usableFile(path); err == nil {
		return path, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		problems = append(problems, err)
	}
	best, err := newestVersioned(path)
	if best != "" {
		return best, nil
	}
	if err != nil {
		problems = append(problems, err)
	}
	if len(problems) > 0 {
		return "", fmt.Errorf("the kubeconfig may be there but cannot be used: %w", errors.Join(problems...))
	}
	return "", fmt.Errorf("%w: neither %s nor %s-* exists (the consul-cni installer writes it)", ErrNoKubeconfig, path, path)
}

// usableFile returns nil for a regular file (through symbolic links), an
// error wrapping fs.ErrNotExist when nothing at all is at path, and any
// other error for what is there but unusable.
func usableFile(path string) error {
	if _, err := os.Lstat(path); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return fmt.Errorf("%s: %w", path, err)
	}
	st, err := os.Stat(path)
	if err != nil {
		// A dangling link (ENOENT behind an existing name) is not absence.
		return fmt.Errorf("%s: %s", path, strings.TrimPrefix(err.Error(), "stat "+path+": "))
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s: not a regular file (%s)", path, st.Mode().Type())
	}
	return nil
}

// newestVersioned returns the most recently modified regular file
// path-*; err reports what could not be judged (an unreadable directory,
// a candidate that is there but not usable).
func newestVersioned(path string) (string, error) {
	dir, base := filepath.Split(path)
	entries, err := os.ReadDir(filepath.Clean(dir))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", nil
		}
		return "", fmt.Errorf("listing %s: %w", dir, err)
	}
	best, bestTime := "", time.Time{}
	var problems []error
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), base+"-") {
			continue
		}
		m := filepath.Join(dir, e.Name())
		if err := usableFile(m); err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				problems = append(problems, err)
			}
			continue
		}
		st, err := os.Stat(m)
		if err != nil {
			continue
		}
		if best == "" || st.ModTime().After(bestTime) || (st.ModTime().Equal(bestTime) && m > best) {
			best, bestTime = m, st.ModTime()
		}
	}
	return best, errors.Join(problems...)
}
