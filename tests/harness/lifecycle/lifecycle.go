// Package lifecycle lets the commands under tests/cmd (the demo, the
// foreground cluster) use the test helpers outside "go test": Env provides
// Helper, Fatalf and Cleanup like testing.T, runs the cleanups in reverse
// order on Close, and turns Fatalf into an error returned by Run.
package lifecycle

import (
	"fmt"
	"sync"
)

// Env collects cleanups. The zero value is ready to use.
type Env struct {
	mu       sync.Mutex
	cleanups []func()
}

type fatal struct{ msg string }

// Helper does nothing; it exists to satisfy the helpers' TB interfaces.
func (e *Env) Helper() {}

// Fatalf stops the current Run with an error.
func (e *Env) Fatalf(format string, args ...any) {
	panic(fatal{fmt.Sprintf(format, args...)})
}

// Cleanup registers f to run on Close, after every cleanup registered later.
func (e *Env) Cleanup(f func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.cleanups = append(e.cleanups, f)
}

// Run calls fn and returns its error, or the message of a Fatalf called
// inside it (on the calling goroutine).
func (e *Env) Run(fn func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			f, ok := r.(fatal)
			if !ok {
				panic(r)
			}
			err = fmt.Errorf("%s", f.msg)
		}
	}()
	return fn()
}

// Close runs the registered cleanups, last registered first. A cleanup that
// calls Fatalf does not stop the others.
func (e *Env) Close() {
	for {
		e.mu.Lock()
		n := len(e.cleanups)
		if n == 0 {
			e.mu.Unlock()
			return
		}
		f := e.cleanups[n-1]
		e.cleanups = e.cleanups[:n-1]
		e.mu.Unlock()
		_ = e.Run(func() error { f(); return nil })
	}
}
