package cluster

import (
	"errors"
	"sync/atomic"
	"testing"
)

func TestParallelRunsEveryIndexAndJoinsErrors(t *testing.T) {
	var sum atomic.Int64
	if err := Parallel(100, 7, func(i int) error { sum.Add(int64(i)); return nil }); err != nil || sum.Load() != 4950 {
		t.Fatalf("sum %d err %v, want 4950 and no error", sum.Load(), err)
	}
	boom := errors.New("boom")
	err := Parallel(10, 3, func(i int) error {
		if i%5 == 0 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err %v, want it to wrap the failures", err)
	}
}
