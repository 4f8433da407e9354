package poll

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

type recorder struct{ failed string }

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
}

func TestEventuallyEachConditionKind(t *testing.T) {
	n := 0
	Eventually(t, time.Minute, "third call", func() bool { n++; return n == 3 })
	if n != 3 {
		t.Fatalf("polled %d times, want 3", n)
	}
	n = 0
	Eventually(t, time.Minute, "no error", func() error {
		if n++; n < 2 {
			return errors.New("not yet")
		}
		return nil
	})
	n = 0
	Eventually(t, time.Minute, "true", func() (bool, error) { n++; return n == 2, nil })
}

// A condition never true fails with what was awaited and the last error;
// Fatalf of a real testing.T ends the goroutine, the recorder's returns, so
// the polling loop is left by a condition that panics once recorded.
func TestEventuallyFailsWithLastError(t *testing.T) {
	r := &recorder{}
	func() {
		defer func() { _ = recover() }()
		Eventually(r, time.Nanosecond, "the thing", func() error {
			if r.failed != "" {
				panic("done")
			}
			return errors.New("still broken")
		})
	}()
	if !strings.Contains(r.failed, "the thing") || !strings.Contains(r.failed, "still broken") {
		t.Fatalf("failure %q", r.failed)
	}
}

func TestUntil(t *testing.T) {
	ctx := context.Background()
	n := 0
	if err := Until(ctx, time.Minute, time.Millisecond, func() (bool, error) { n++; return n == 3, nil }); err != nil || n != 3 {
		t.Fatalf("err %v after %d calls", err, n)
	}
	if err := Until(ctx, 0, time.Millisecond, func() (bool, error) { return false, nil }); !errors.Is(err, ErrTimeout) {
		t.Fatalf("err %v, want ErrTimeout", err)
	}
	boom := errors.New("boom")
	if err := Until(ctx, time.Minute, time.Millisecond, func() (bool, error) { return false, boom }); !errors.Is(err, boom) {
		t.Fatalf("err %v, want the condition's", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := Until(cctx, time.Minute, time.Hour, func() (bool, error) { return false, nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
}
