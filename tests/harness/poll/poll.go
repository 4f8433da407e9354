// Package poll waits in tests for a condition to become true, polling it:
// the one copy of the "eventually" and "wait for" helpers of the test tiers.
// Timeouts only bound a wait; no test asserts how long something took.
package poll

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Interval is how often Eventually polls.
const Interval = 100 * time.Millisecond

// ErrTimeout is returned by Until when the condition is not true in time.
var ErrTimeout = errors.New("timed out")

// TB is the part of testing.TB Eventually uses.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// Condition is what Eventually polls: a func() error is true when it
// returns nil, a func() (bool, error) when it returns true (its error is
// kept for the failure message), a func() bool when it returns true.
type Condition interface {
	func() error | func() (bool, error) | func() bool
}

// check evaluates a Condition once.
func check[C Condition](c C) (bool, error) {
	switch f := any(c).(type) {
	case func() error:
		err := f()
		return err == nil, err
	case func() (bool, error):
		return f()
	case func() bool:
		return f(), nil
	}
	panic(fmt.Sprintf("poll: unsupported condition %T", c))
}

// Eventually polls cond until it is true and fails tb when it is still not
// true after timeout, naming what was awaited and the last error.
func Eventually[C Condition](tb TB, timeout time.Duration, what string, cond C) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for {
		ok, err := check(cond)
		if ok {
			return
		}
		if err != nil {
			last = err
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s: still not true after %s (last error: %v)", what, timeout, last)
		}
		time.Sleep(Interval)
	}
}

// Until calls cond every interval until it returns true or an error, ctx
// ends (ctx.Err()) or timeout passes (ErrTimeout).
func Until(ctx context.Context, timeout, interval time.Duration, cond func() (bool, error)) error {
	end := time.Now().Add(timeout)
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(end) {
			return ErrTimeout
		}
		t.Reset(interval)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
