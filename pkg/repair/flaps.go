package repair

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// flapWindow is how long the controller remembers its actions on a node to
// see the node's CNI readiness dated again while it repairs there.
const flapWindow = 10 * time.Minute

// nodeActions remembers, per node, the actions of the last flapWindow and
// the node's CNI readiness ("ready since") each was taken under. The breaker
// counts pods whose sandbox is newer than that readiness; the race lane
// takes the older ones. A node whose installer readiness flaps dates its
// readiness again at each flap, so after each one every broken pod there,
// replacements included, is older than it: of the race, never counted, and
// a misconfigured node is repaired in a loop. The actions taken under a
// later readiness than the node's first action in the window are what such
// a node does: redated counts them, and the breaker opens once they reach
// --breaker-min-pods. On a misconfigured node whose installer flaps, the
// breaker thus opens after at most the actions of its first readiness plus
// --breaker-min-pods actions (3 with the defaults) within flapWindow. The
// price: a node rebooted within flapWindow of repairs there opens it after
// as many actions, and repairs resume once those leave the window.
//
// A readiness flap shorter than the flap bound no longer dates the
// readiness again (judge.FlapBound, under either gate), so the pods such a node
// breaks after its readiness are counted by the breaker instead. But an
// action removes the pod it counted: pods that break one at a time, each
// acted on at the per-node pace before the next breaks, would never show
// --breaker-min-pods broken at once. countedUnder therefore keeps the
// actions on pods the breaker counted, under the node's current readiness,
// as broken pods of the window, and the bound above holds for short flaps
// too.
type nodeActions struct {
	mu     sync.Mutex
	byNode map[string][]nodeAction
}

// nodeAction is one action on a node: when, under which readiness, on
// which pod, and whether the breaker counted that pod (its sandbox dated
// after that readiness).
type nodeAction struct {
	at, since time.Time
	uid       types.UID
	counted   bool
}

func newNodeActions() *nodeActions {
	return &nodeActions{byNode: map[string][]nodeAction{}}
}

// record remembers an action on pod uid on node at now, its CNI ready since
// since, counted by the breaker or not.
func (a *nodeActions) record(node string, uid types.UID, counted bool, since, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.byNode[node] = append(a.prune(node, now), nodeAction{at: now, since: since, uid: uid, counted: counted})
}

// countedUnder counts node's actions in the window on pods the breaker
// counted under the readiness since, leaving out the pods still there
// (present: a labelled pod stays, and is counted as it is).
func (a *nodeActions) countedUnder(node string, since, now time.Time, present map[types.UID]bool) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, x := range a.prune(node, now) {
		if x.counted && x.since.Equal(since) && !present[x.uid] {
			n++
		}
	}
	return n
}

// redated counts node's actions in the window taken under a later readiness
// than its first action there.
func (a *nodeActions) redated(node string, now time.Time) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	acts := a.prune(node, now)
	n := 0
	for _, x := range acts {
		if x.since.After(acts[0].since) {
			n++
		}
	}
	return n
}

// prune drops node's actions older than flapWindow and returns the rest.
func (a *nodeActions) prune(node string, now time.Time) []nodeAction {
	acts := a.byNode[node]
	i := 0
	for i < len(acts) && now.Sub(acts[i].at) >= flapWindow {
		i++
	}
	acts = acts[i:]
	if len(acts) == 0 {
		delete(a.byNode, node)
		return nil
	}
	a.byNode[node] = acts
	return acts
}

// forget drops a deleted node.
func (a *nodeActions) forget(node string) {
	a.mu.Lock()
	delete(a.byNode, node)
	a.mu.Unlock()
}
