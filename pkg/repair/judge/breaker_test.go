package judge_test

import (
	"testing"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
)

func TestBreaker(t *testing.T) {
	b := judge.NewBreaker(0.5, 3)
	for _, tc := range []struct {
		broken, total int
		open          bool
	}{{0, 0, false}, {2, 2, false}, {3, 3, true}, {3, 6, true}, {3, 7, false}, {10, 100, false}, {50, 100, true}} {
		if got := b.Trips(tc.broken, tc.total); got != tc.open {
			t.Errorf("Trips(%d, %d) = %v", tc.broken, tc.total, got)
		}
	}
	if open, changed := b.Update("n", 3, 3); !open || !changed || b.OpenNodes() != 1 {
		t.Fatal("did not open")
	}
	if open, changed := b.Update("n", 4, 4); !open || changed {
		t.Fatal("changed while open")
	}
	if open, changed := b.Update("n", 0, 4); open || !changed || b.OpenNodes() != 0 {
		t.Fatal("did not close")
	}
}
