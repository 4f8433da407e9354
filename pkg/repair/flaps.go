package repair

import (
	"sync"
	"time"
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
type nodeActions struct {
	mu     sync.Mutex
	byNode map[string][]nodeAction
}

// nodeAction is one action on a node: when, under which readiness.
type nodeAction struct {
	at, since time.Time
}

func newNodeActions() *nodeActions {
	return &nodeActions{byNode: map[string][]nodeAction{}}
}

// record remembers an action on node at now, its CNI ready since since.
func (a *nodeActions) record(node string, since, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.byNode[node] = append(a.prune(node, now), nodeAction{at: now, since: since})
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
