package repair

import (
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
)

// verifierRecheck is how often the controller looks whether a node's
// verifier started or stopped reporting (its heartbeat went stale): the
// node's pods are judged again then, by the verifier's evidence or by the
// signals.
const verifierRecheck = 10 * time.Second

// verifierHeartbeat is the detector's judge.VerifierHeartbeat: the
// verifier's Node condition as the node cache holds it.
func (c *Controller) verifierHeartbeat(node string) (time.Time, bool) {
	n, err := c.nodes.Get(node)
	if err != nil {
		return time.Time{}, false
	}
	return judge.NodeVerifierHeartbeat(n)
}

// recheckVerifiers requeues the pods of every node whose verifier started
// or stopped reporting since the last call. A pod's own condition changes
// reach the controller as pod updates; a heartbeat going stale is no event.
func (c *Controller) recheckVerifiers() {
	nodes, err := c.nodes.List(everything)
	if err != nil {
		return
	}
	now := c.now()
	reporting := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		hb, ok := judge.NodeVerifierHeartbeat(n)
		if ok && now.Sub(hb) <= annotations.NodeConditionStaleAfter {
			reporting[n.Name] = true
		}
	}
	c.mu.Lock()
	var changed []string
	for name := range reporting {
		if !c.verifying[name] {
			changed = append(changed, name)
		}
	}
	for name := range c.verifying {
		if !reporting[name] {
			changed = append(changed, name)
		}
	}
	c.verifying = reporting
	c.mu.Unlock()
	for _, name := range changed {
		c.enqueueNode(name)
	}
}
