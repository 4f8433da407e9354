package limit

import (
	"testing"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge/judgetest"
)

// A namespace whose pods all look broken cannot take the whole cap: it
// leaves a tenth of it, so the first race pod of another namespace is acted
// on at once instead of after the window.
func TestOneNamespaceLeavesRoomForAnother(t *testing.T) {
	l := New(30, 30)
	now := judgetest.T0
	took := 0
	for i := 0; i < 200; i++ {
		if ok, _ := l.Take("flood", "n1", true, now.Add(time.Duration(i)*time.Millisecond)); ok {
			took++
		}
	}
	if took != 27 {
		t.Fatalf("the flooding namespace took %d of the cap of 30, want 27 (the cap less a tenth)", took)
	}
	if ok, wait := l.Take("shop", "n2", true, now.Add(time.Second)); !ok {
		t.Fatalf("another namespace's race pod refused for %s", wait)
	}
}

// While another namespace waits, each takes at most an even share of the
// cap: the flooding namespace is refused at its share although the cap has
// room, and the waiting one gets the rest.
func TestNamespacesWaitingShareTheCap(t *testing.T) {
	l := New(10, 10)
	now := judgetest.T0
	for i := 0; i < 9; i++ {
		if ok, _ := l.Take("flood", "n1", true, now); !ok {
			t.Fatalf("take %d refused", i)
		}
	}
	if ok, _ := l.Take("shop", "n2", true, now); !ok {
		t.Fatal("the headroom was not left")
	}
	// shop has more broken pods: refused at the full cap, it waits.
	if ok, _ := l.Take("shop", "n2", true, now.Add(30*time.Second)); ok {
		t.Fatal("took beyond the cap")
	}
	// The window has passed: shop waits, so flood may hold 5 of 10.
	now = now.Add(61 * time.Second)
	flood, shop := 0, 0
	for i := 0; i < 20; i++ {
		if ok, _ := l.Take("flood", "n1", true, now); ok {
			flood++
		}
		if ok, _ := l.Take("shop", "n2", true, now); ok {
			shop++
		}
	}
	if flood != 5 || shop != 5 {
		t.Fatalf("flood took %d, shop %d of the cap of 10 while both waited, want 5 each", flood, shop)
	}
	// A refusal for its share says when flood's oldest action leaves the window.
	if ok, wait := l.Take("flood", "n1", true, now.Add(10*time.Second)); ok || wait != 50*time.Second {
		t.Fatalf("flood over its share: ok=%v wait=%s, want refused for 50s", ok, wait)
	}
}

// A namespace that stops asking for a window no longer counts as waiting:
// the other gets the cap less the headroom again.
func TestANamespaceNoLongerWaitingGivesItsShareBack(t *testing.T) {
	l := New(10, 10)
	now := judgetest.T0
	l.Take("shop", "n2", true, now)
	for i := 0; i < 10; i++ {
		l.Take("flood", "n1", true, now)
	}
	l.Take("shop", "n2", true, now) // refused: the cap is full
	now = now.Add(2 * capWindow)
	took := 0
	for i := 0; i < 20; i++ {
		if ok, _ := l.Take("flood", "n1", true, now); ok {
			took++
		}
	}
	if took != 9 {
		t.Fatalf("flood took %d once shop stopped asking, want 9", took)
	}
}

// The paced lane shares the cap the same way: its buckets are asked only
// within the namespace's share, so a refusal for the share takes no token.
func TestPacedLaneWithinTheShare(t *testing.T) {
	l := New(10, 60) // headroom 1; global bucket burst 1
	now := judgetest.T0
	for i := 0; i < 9; i++ {
		if ok, _ := l.Take("flood", "n1", true, now); !ok {
			t.Fatalf("race take %d refused", i)
		}
	}
	if ok, _ := l.Take("flood", "n1", false, now); ok {
		t.Fatal("a paced take of one namespace beyond the cap less the headroom allowed")
	}
	if ok, wait := l.Take("shop", "n2", false, now); !ok {
		t.Fatalf("the global bucket's token went to a take refused for its share: shop waits %s", wait)
	}
}

// A cap under 10 is a deliberate slow pace: one namespace alone may use all
// of it.
func TestSmallCapHasNoHeadroom(t *testing.T) {
	l := New(2, 60)
	now := judgetest.T0
	for i := 0; i < 2; i++ {
		if ok, _ := l.Take("app", "n1", true, now); !ok {
			t.Fatalf("take %d of a cap of 2 refused", i)
		}
	}
}
