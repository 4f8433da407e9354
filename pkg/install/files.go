package install

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// errConflict means a file changed between the installer reading it and
// replacing it (another writer, usually the primary CNI): start over.
var errConflict = errors.New("file changed while being updated")

// writeAtomic replaces path with data: a temporary file in the same
// directory is written, synced and renamed over path, so a reader (the
// runtime) sees either the old or the new content, never a partial file.
// The temporary file's extension is .tmp, which no runtime reads as a
// network configuration.
func writeAtomic(path string, data []byte, perm fs.FileMode) error {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".*.tmp")
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
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Chmod(perm); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	ok = true
	syncDir(dir)
	return nil
}

// replaceIfUnchanged is writeAtomic guarded by a compare: when the file no
// longer holds old (another writer got there first), nothing is written and
// errConflict is returned. The file keeps its mode.
func replaceIfUnchanged(path string, old, data []byte) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	cur, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if !bytes.Equal(cur, old) {
		return errConflict
	}
	return writeAtomic(path, data, st.Mode().Perm())
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// removeIfExists removes path; a missing file is not an error.
func removeIfExists(path string) error {
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

// sameContent reports whether two files hold the same bytes.
func sameContent(a, b string) (bool, error) {
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

// sameBinary reports whether dst holds the same bytes as src. The copy
// installBinary makes carries src's modification time, so equal size and
// time settle it without reading both files (the readiness probe runs every
// few seconds and the plugin is tens of megabytes); anything else is decided
// by comparing contents.
func sameBinary(src, dst string) (bool, error) {
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
	return sameContent(src, dst)
}

// installBinary copies src into dir under name unless an identical file is
// already there. The copy is written beside the target and renamed over
// it: a runtime executing the plugin at that moment runs either the old or
// the new binary, and a running old binary is not disturbed.
func installBinary(src, dir, name string) (changed bool, err error) {
	dst := filepath.Join(dir, name)
	if same, err := sameBinary(src, dst); err == nil && same {
		if st, err := os.Stat(dst); err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 == 0o111 {
			return false, nil
		}
	}
	in, err := os.Open(src)
	if err != nil {
		return false, fmt.Errorf("plugin binary: %w", err)
	}
	defer in.Close()
	srcStat, err := in.Stat()
	if err != nil {
		return false, fmt.Errorf("plugin binary: %w", err)
	}
	f, err := os.CreateTemp(dir, "."+name+".*.tmp")
	if err != nil {
		return false, fmt.Errorf("plugin binary: %w", err)
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
		return false, fmt.Errorf("copying plugin binary to %s: %w", dir, err)
	}
	if err := f.Chmod(0o755); err != nil {
		return false, err
	}
	if err := f.Sync(); err != nil {
		return false, err
	}
	if err := f.Close(); err != nil {
		return false, err
	}
	if err := os.Chtimes(tmp, srcStat.ModTime(), srcStat.ModTime()); err != nil {
		return false, err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return false, fmt.Errorf("installing plugin binary as %s: %w", dst, err)
	}
	ok = true
	syncDir(dir)
	return true, nil
}
