// Package nodefile writes the installer's files on the node so that a
// reader never sees half a file and no other writer's change is lost.
//
// The CNI net directory is shared: the runtime reads it at any moment, the
// primary CNI and other installers rewrite it, and a node may lose power
// mid-write. Every file is therefore written to a temporary file beside its
// target (named "." + target + "." + digits + ".tmp", which no runtime
// reads as a network configuration), synced, and renamed into place
// (WriteAtomic). A file that others also write is replaced only while it
// still holds what the caller read (ReplaceIfUnchanged: the new content is
// swapped in with renameat2 RENAME_EXCHANGE and what the swap displaced is
// compared, so a write landing in between is put back, not lost) and
// removed only while unchanged (RemoveIfUnchanged); a conflict is
// ErrConflict, and the caller reads again. The plugin binary is copied with
// its source's modification time, so that a readiness probe tells an
// identical copy by size and time without reading megabytes (SameBinary),
// and a staged copy beside it makes putting it back a rename
// (InstallBinary, StageBinary). TempTarget recognises the temporary files a
// killed writer left behind.
package nodefile

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/internal/racehook"
)

// ErrConflict means a file changed between the caller reading it and
// replacing it (another writer, usually the primary CNI): start over.
var ErrConflict = errors.New("file changed while being updated")

// WriteAtomic replaces path with data: a temporary file in the same
// directory is written, synced and renamed over path, so a reader (the
// runtime) sees either the old or the new content, never a partial file.
// The temporary file's extension is .tmp, which no runtime reads as a
// network configuration.
func WriteAtomic(path string, data []byte, perm fs.FileMode) error {
	tmp, err := writeTemp(path, data, perm)
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	syncDir(filepath.Dir(path))
	return nil
}

// writeTemp writes data, synced, into a new temporary file beside path and
// returns its name.
func writeTemp(path string, data []byte, perm fs.FileMode) (string, error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".*.tmp")
	if err != nil {
		return "", err
	}
	tmp := f.Name()
	err = func() error {
		if _, err := f.Write(data); err != nil {
			return err
		}
		if err := f.Chmod(perm); err != nil {
			return err
		}
		return f.Sync()
	}()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return "", err
	}
	return tmp, nil
}

// maxRestores bounds how often ReplaceIfUnchanged puts back content that
// other writers keep replacing while it restores.
const maxRestores = 100

// ReplaceIfUnchanged replaces path with data only when path still holds
// old; otherwise nothing of data stays and ErrConflict is returned (the
// caller reads again and starts over). The file keeps its mode.
//
// No write of another writer that replaces the file (write and rename, as
// CNI installers and the runtime's own tools do) is lost: the new content
// is written and synced first, then the file is compared with old, then the
// two are swapped atomically (renameat2 RENAME_EXCHANGE) and what the swap
// displaced is compared again. If another writer renamed its file in
// between, that file is what was displaced: it is swapped back, and so is
// any file written while doing so. Only where the file system cannot swap
// does a plain rename follow the compare, which leaves the instant between
// the two open.
func ReplaceIfUnchanged(path string, old, data []byte) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	tmp, err := writeTemp(path, data, st.Mode().Perm())
	if err != nil {
		return err
	}
	defer os.Remove(tmp) // after a swap it holds what was displaced
	if racehook.BeforeCompare != nil {
		racehook.BeforeCompare(path)
	}
	cur, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if !bytes.Equal(cur, old) {
		return ErrConflict
	}
	if racehook.AfterCompare != nil {
		racehook.AfterCompare(path)
	}
	swapped, err := exchange(tmp, path)
	if err != nil {
		return err
	}
	if !swapped {
		if err := os.Rename(tmp, path); err != nil {
			return err
		}
		syncDir(filepath.Dir(path))
		return nil
	}
	displaced, err := os.ReadFile(tmp)
	if err != nil {
		return err
	}
	if !bytes.Equal(displaced, old) {
		return restoreDisplaced(tmp, path, data)
	}
	syncDir(filepath.Dir(path))
	return nil
}

// restoreDisplaced puts back the file another writer renamed over path just
// before ReplaceIfUnchanged swapped its own in: tmp holds it, path holds
// ours. When yet another file replaced ours meanwhile, the newest one is
// put back in turn, until the swap displaces what it was expected to.
func restoreDisplaced(tmp, path string, ours []byte) error {
	expect := ours
	for i := 0; i < maxRestores; i++ {
		putBack, err := os.ReadFile(tmp)
		if err != nil {
			return err
		}
		if _, err := exchange(tmp, path); err != nil {
			return err
		}
		got, err := os.ReadFile(tmp)
		if err != nil {
			return err
		}
		if bytes.Equal(got, expect) {
			syncDir(filepath.Dir(path))
			return ErrConflict
		}
		expect = putBack
	}
	return fmt.Errorf("%s: other writers kept replacing it while their content was being put back", path)
}

// exchange swaps the two paths atomically. swapped is false, with no error,
// when the file system cannot swap (the caller then renames).
func exchange(a, b string) (swapped bool, err error) {
	err = unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EOPNOTSUPP):
		return false, nil
	}
	return false, &os.LinkError{Op: "exchange", Old: a, New: b, Err: err}
}

// RenameNoReplace renames from to to unless to exists (RENAME_NOREPLACE);
// renamed is false, with no error, when it does. Where the file system
// cannot refuse atomically, an existence check precedes the rename.
func RenameNoReplace(from, to string) (renamed bool, err error) {
	err = unix.Renameat2(unix.AT_FDCWD, from, unix.AT_FDCWD, to, unix.RENAME_NOREPLACE)
	switch {
	case err == nil:
		syncDir(filepath.Dir(to))
		return true, nil
	case errors.Is(err, unix.EEXIST):
		return false, nil
	case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EOPNOTSUPP):
		if Exists(to) {
			return false, nil
		}
		return true, os.Rename(from, to)
	}
	return false, &os.LinkError{Op: "rename (no replace)", Old: from, New: to, Err: err}
}

// RemoveIfUnchanged removes path only while it holds old: it is renamed
// aside (atomically), compared, and deleted, or, when another writer
// replaced it in between, renamed back unless yet another file took its
// place (then the displaced older content goes), and ErrConflict is
// returned. A missing file is not an error.
func RemoveIfUnchanged(path string, old []byte) error {
	if racehook.BeforeRemoveIfUnchanged != nil {
		racehook.BeforeRemoveIfUnchanged(path)
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	aside := f.Name()
	f.Close()
	if err := os.Rename(path, aside); err != nil {
		os.Remove(aside)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	cur, err := os.ReadFile(aside)
	if err == nil && bytes.Equal(cur, old) {
		syncDir(filepath.Dir(path))
		return os.Remove(aside)
	}
	if _, rerr := RenameNoReplace(aside, path); rerr != nil {
		return errors.Join(err, rerr)
	}
	os.Remove(aside) // still there only when a newer file took the name
	if err != nil {
		return err
	}
	return ErrConflict
}

// tempName matches the temporary files of writeTemp and copyBinary.
var tempName = regexp.MustCompile(`^\.(.+)\.[0-9]+\.tmp$`)

// TempTarget tells whether name is the name of a temporary file this
// package writes (writeTemp and copyBinary) and, if so, the name of its
// target. copyBinary drops a leading dot of the target's name, writeTemp
// keeps it: ".x.1.tmp" stands for "x" or ".x".
func TempTarget(name string) (target string, ok bool) {
	m := tempName.FindStringSubmatch(name)
	if m == nil {
		return "", false
	}
	return m[1], true
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}

func Exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// ModifiedWithin reports whether path was modified less than d ago.
func ModifiedWithin(path string, d time.Duration) bool {
	st, err := os.Stat(path)
	return err == nil && time.Since(st.ModTime()) < d
}

// RemoveIfExists removes path; a missing file is not an error.
func RemoveIfExists(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

func fileHash(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return nil, err
	}
	return h.Sum(nil), nil
}

// SameContent reports whether two files hold the same bytes.
func SameContent(a, b string) (bool, error) {
	ha, err := fileHash(a)
	if err != nil {
		return false, err
	}
	hb, err := fileHash(b)
	if err != nil {
		return false, err
	}
	return bytes.Equal(ha, hb), nil
}

// SameBinary reports whether dst holds the same bytes as src. The copy
// InstallBinary makes carries src's modification time, so equal size and
// time settle it without reading both files (the readiness probe runs every
// few seconds and the plugin is tens of megabytes); anything else is decided
// by comparing contents.
func SameBinary(src, dst string) (bool, error) {
	ss, err := os.Stat(src)
	if err != nil {
		return false, err
	}
	ds, err := os.Stat(dst)
	if err != nil {
		return false, err
	}
	if ss.Size() != ds.Size() {
		return false, nil
	}
	if ss.ModTime().Equal(ds.ModTime()) {
		return true, nil
	}
	return SameContent(src, dst)
}

// InstallBinary puts src into dir under name unless an identical file is
// already there. When the staged copy (StageBinary) is identical to src it
// is renamed into place: putting the plugin back after another installer
// removed it is then a metadata operation, not a copy of megabytes.
// Otherwise src is copied beside the target and renamed over it. Either
// way a runtime executing the plugin at that moment runs either the old or
// the new binary, and a running old binary is not disturbed.
func InstallBinary(src, dir, name string) (changed bool, err error) {
	dst := filepath.Join(dir, name)
	if same, err := SameBinary(src, dst); err == nil && same {
		if st, err := os.Stat(dst); err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 == 0o111 {
			return false, nil
		}
	}
	staged := filepath.Join(dir, cniconf.StagedBinaryName)
	if isStaged(src, staged) {
		if err := os.Rename(staged, dst); err == nil {
			syncDir(dir)
			return true, nil
		}
	}
	if err := copyBinary(src, dst); err != nil {
		return false, fmt.Errorf("installing plugin binary as %s: %w", dst, err)
	}
	return true, nil
}

// isStaged reports whether staged is an executable regular file identical
// to src.
func isStaged(src, staged string) bool {
	st, err := os.Lstat(staged)
	if err != nil || !st.Mode().IsRegular() || st.Mode().Perm()&0o111 != 0o111 {
		return false
	}
	same, err := SameBinary(src, staged)
	return err == nil && same
}

// StageBinary keeps a copy of src in dir under cniconf.StagedBinaryName,
// for InstallBinary to rename into place; changed tells whether it wrote.
func StageBinary(src, dir string) (changed bool, err error) {
	staged := filepath.Join(dir, cniconf.StagedBinaryName)
	if isStaged(src, staged) {
		return false, nil
	}
	if err := copyBinary(src, staged); err != nil {
		return false, fmt.Errorf("staging the plugin binary as %s: %w", staged, err)
	}
	return true, nil
}

// copyBinary copies src to dst, executable, with src's modification time
// (which SameBinary relies on): written and synced beside dst, then
// renamed over it.
func copyBinary(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("plugin binary: %w", err)
	}
	defer in.Close()
	srcStat, err := in.Stat()
	if err != nil {
		return fmt.Errorf("plugin binary: %w", err)
	}
	dir, name := filepath.Split(dst)
	f, err := os.CreateTemp(dir, "."+strings.TrimPrefix(name, ".")+".*.tmp")
	if err != nil {
		return err
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if _, err := io.Copy(f, in); err != nil {
		return fmt.Errorf("copying %s: %w", src, err)
	}
	if err := f.Chmod(0o755); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Chtimes(tmp, srcStat.ModTime(), srcStat.ModTime()); err != nil {
		return err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return err
	}
	ok = true
	syncDir(filepath.Clean(dir))
	return nil
}
