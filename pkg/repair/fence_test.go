package repair

import (
	"context"
	"testing"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/leader"
)

// An action is never started once the leader's fence has passed (its last
// renewal is too old for it to be sure no other replica leads), and one is
// started before it.
func TestNoActionAfterTheLeadersFence(t *testing.T) {
	h := newHarness(t, nil)
	h.addNode(readyNode("n1"))
	key := h.addPod(brokenB())
	past := leader.WithFence(context.Background(), func() time.Time { return time.Now().Add(-time.Millisecond) })
	if err := h.c.sync(past, key); err != nil {
		t.Fatal(err)
	}
	if acts := h.mutations(); len(acts) != 0 {
		t.Fatalf("acted after the fence: %v", acts)
	}
	soon := time.Now().Add(2 * time.Second)
	if err := h.c.sync(leader.WithFence(context.Background(), func() time.Time { return soon }), key); err != nil {
		t.Fatal(err)
	}
	if acts := h.mutations(); len(acts) != 1 {
		t.Fatalf("want one action before the fence, got %v", acts)
	}
}
