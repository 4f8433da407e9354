package testbin

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestEnterableByAll(t *testing.T) {
	top := t.TempDir()
	// t.TempDir's directories are 0700; open the chain down to top.
	for d := top; d != os.TempDir() && d != filepath.Dir(d); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if !enterableByAll(filepath.Join(top, "not-yet", "created")) {
		t.Fatalf("%s and its parents are 0755: want enterable", top)
	}
	if err := os.Mkdir(filepath.Join(top, "private"), 0o700); err != nil {
		t.Fatal(err)
	}
	if enterableByAll(filepath.Join(top, "private", ".cache")) {
		t.Fatal("below a 0700 directory: want not enterable")
	}
}

func TestFallbackDir(t *testing.T) {
	d := FallbackDir()
	if filepath.Dir(d) != os.TempDir() || !strings.HasPrefix(filepath.Base(d), "ccr-testbin-") {
		t.Fatalf("fallback %s: want <tmp>/ccr-testbin-<hash>", d)
	}
	own := filepath.Join(t.TempDir(), "own")
	if err := os.Mkdir(own, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := checkOwnDir(own); err != nil {
		t.Fatalf("own 0755 directory refused: %v", err)
	}
	if err := os.Chmod(own, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := checkOwnDir(own); err == nil {
		t.Fatal("a world-writable directory must be refused")
	}
}
