package nodefile

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/internal/racehook"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/nodefile/nodefiletest"
)

func assertNoTemp(t *testing.T, dir string) {
	t.Helper()
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if _, ok := TempTarget(e.Name()); ok {
			t.Errorf("temporary file %s left behind", e.Name())
		}
	}
}

// A write landing after our file is written and synced, before the
// compare, is seen by the compare.
func TestReplaceIfUnchangedWriteBeforeCompare(t *testing.T) {
	p := filepath.Join(t.TempDir(), "10-a.conflist")
	os.WriteFile(p, []byte("v1"), 0o644)
	calls := 0
	nodefiletest.BeforeCompare(t, func(path string) {
		calls++
		nodefiletest.ForeignWrite(t, path, []byte("foreign"))
	})
	if err := ReplaceIfUnchanged(p, []byte("v1"), []byte("mine")); !errors.Is(err, ErrConflict) {
		t.Fatalf("err = %v, want conflict", err)
	}
	if b, _ := os.ReadFile(p); string(b) != "foreign" || calls != 1 {
		t.Fatalf("content %q after %d hook calls, want the foreign write", b, calls)
	}
	assertNoTemp(t, filepath.Dir(p))
}

// A write landing between the compare and the swap is what the swap
// displaces: it is put back.
func TestReplaceIfUnchangedWriteAfterCompare(t *testing.T) {
	p := filepath.Join(t.TempDir(), "10-a.conflist")
	os.WriteFile(p, []byte("v1"), 0o644)
	nodefiletest.AfterCompare(t, func(path string) { nodefiletest.ForeignWrite(t, path, []byte("foreign")) })
	if err := ReplaceIfUnchanged(p, []byte("v1"), []byte("mine")); !errors.Is(err, ErrConflict) {
		t.Fatalf("err = %v, want conflict", err)
	}
	if b, _ := os.ReadFile(p); string(b) != "foreign" {
		t.Fatalf("content %q, want the foreign write", b)
	}
	assertNoTemp(t, filepath.Dir(p))
	// Without a foreign write the replacement goes through.
	racehook.AfterCompare = nil
	if err := ReplaceIfUnchanged(p, []byte("foreign"), []byte("mine")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); string(b) != "mine" {
		t.Fatalf("content %q", b)
	}
}

// A foreign writer racing the installer's rewrites never loses a write:
// after its last write the file holds that content, chained or not, never a
// rewrite of an older one.
func TestReplaceIfUnchangedRace(t *testing.T) {
	const rounds, writes = 100, 10
	dir := t.TempDir()
	p := filepath.Join(dir, "10-a.conflist")
	const ours = " +consul-cni"
	rng := rand.New(rand.NewSource(1))
	var rewrites, conflicts int
	for r := 0; r < rounds; r++ {
		os.WriteFile(p, []byte("round"), 0o644)
		jitter := make([]time.Duration, writes)
		for i := range jitter {
			jitter[i] = time.Duration(rng.Intn(1500)) * time.Microsecond
		}
		var wg sync.WaitGroup
		done := make(chan struct{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(done)
			for i := 0; i < writes; i++ {
				time.Sleep(jitter[i])
				nodefiletest.ForeignWrite(t, p, []byte(fmt.Sprintf("r%d-w%d", r, i)))
			}
		}()
		for stop := false; !stop; {
			select {
			case <-done:
				stop = true
			default:
			}
			cur, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if bytes.HasSuffix(cur, []byte(ours)) {
				continue
			}
			err = ReplaceIfUnchanged(p, cur, append(cur, ours...))
			switch {
			case errors.Is(err, ErrConflict):
				conflicts++
			case err != nil:
				t.Fatal(err)
			default:
				rewrites++
			}
		}
		wg.Wait()
		last := fmt.Sprintf("r%d-w%d", r, writes-1)
		if b, _ := os.ReadFile(p); strings.TrimSuffix(string(b), ours) != last {
			t.Fatalf("round %d: file holds %q after the foreign writer's last write %q", r, b, last)
		}
	}
	assertNoTemp(t, dir)
	t.Logf("%d rounds: %d rewrites, %d conflicts", rounds, rewrites, conflicts)
}
