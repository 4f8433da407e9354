package limit

import (
	"testing"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge/judgetest"
)

// The paced lane: a cluster-wide bucket and one per node, a refusal by
// one consuming nothing of the other.
func TestTakePacesByClusterAndNodeBuckets(t *testing.T) {
	l := New(60, 10) // global burst 6, per-node burst 1
	now := judgetest.T0
	for i := 0; i < 6; i++ {
		if ok, _ := l.Take("app", "n"+string(rune('a'+i)), false, now); !ok {
			t.Fatalf("take %d refused", i)
		}
	}
	ok, wait := l.Take("app", "ng", false, now)
	if ok || wait <= 0 || wait > time.Second {
		t.Fatalf("7th take: ok=%v wait=%v (want refused, ~1s)", ok, wait)
	}
	now = now.Add(time.Second)
	if ok, _ := l.Take("app", "ng", false, now); !ok {
		t.Fatal("refill refused")
	}
	// Per node: na used its single token; it refills at 10/min (6 s).
	ok, wait = l.Take("app", "na", false, now)
	if ok || wait < 4*time.Second || wait > 6*time.Second {
		t.Fatalf("per-node: ok=%v wait=%v", ok, wait)
	}
	// A refused per-node take does not consume a global token.
	now = now.Add(time.Second)
	if ok, _ := l.Take("app", "nh", false, now); !ok {
		t.Fatal("global token lost to a per-node refusal")
	}
}

// The cap counts every action of both lanes in a sliding minute and tells
// how long until the oldest leaves it.
func TestTakeCountsBothLanesAgainstTheCap(t *testing.T) {
	l := New(4, 60) // cap 4 a minute, global burst 1, per-node burst 6
	now := judgetest.T0
	if ok, _ := l.Take("a", "n1", false, now); !ok {
		t.Fatal("paced take refused")
	}
	for i := 0; i < 3; i++ {
		now = now.Add(10 * time.Second)
		if ok, _ := l.Take(string(rune('b'+i)), "n1", true, now); !ok {
			t.Fatalf("race take %d refused under the cap", i)
		}
	}
	now = now.Add(10 * time.Second) // T0+40s: 4 actions in the last minute
	ok, wait := l.Take("e", "n2", true, now)
	if ok || wait != 20*time.Second {
		t.Fatalf("over the cap: ok=%v wait=%v, want refused for 20s", ok, wait)
	}
	now = now.Add(wait)
	if ok, _ := l.Take("e", "n2", true, now); !ok {
		t.Fatal("refused once the first action left the window")
	}
}
