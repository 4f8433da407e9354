package configkey

import (
	"errors"
	"fmt"
	"testing"
)

func TestError(t *testing.T) {
	for _, tc := range []struct {
		err  *Error
		want string
	}{
		{New("Action", "x", "is not one of evict, delete, label"), `Action: "x" is not one of evict, delete, label`},
		{New("Workers", 0, "must be at least 1"), `Workers: 0 must be at least 1`},
		{Errorf("BackoffBase/BackoffMax", "%s/%s: want 0 < base <= max", "2s", "1s"), `BackoffBase/BackoffMax: 2s/1s: want 0 < base <= max`},
		{&Error{Key: "MetricsAddr", Value: ":x", Reason: "cannot listen", Err: errors.New("boom")}, `MetricsAddr: ":x" cannot listen: boom`},
	} {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("got %q, want %q", got, tc.want)
		}
	}
}

func TestWithKeys(t *testing.T) {
	inner := errors.New("boom")
	e := &Error{Key: "BackoffBase/BackoffMax/Other", Reason: "r", Err: inner}
	got := e.WithKeys(func(k string) (string, bool) {
		f, ok := map[string]string{"BackoffBase": "--backoff-base", "BackoffMax": "--backoff-max"}[k]
		return f, ok
	})
	if got.Key != "--backoff-base/--backoff-max/Other" || e.Key != "BackoffBase/BackoffMax/Other" {
		t.Errorf("renamed %q, original %q", got.Key, e.Key)
	}
	if !errors.Is(fmt.Errorf("wrapped: %w", got), inner) {
		t.Error("the underlying error is lost")
	}
}
