// Package limit bounds the repair controller's actions: a cluster-wide cap
// on actions in any minute, shared fairly between namespaces, and for pods
// not of the race token buckets, one cluster-wide and one per node.
//
// The controller asks Take before each action, with the lane the judgement
// put the pod in (pkg/repair/judge: race or not), and tries the pod again
// after the wait Take returns when refused.
package limit

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// capWindow is the window of the cluster-wide cap.
const capWindow = time.Minute

// Limiter bounds actions in two lanes. Every action counts against the
// cluster-wide cap: at most perMinute actions in any minute. The race lane
// (Take with race set: pods whose sandbox predates their node's dated CNI
// readiness, the expected and bounded set of the race) is bounded by that cap
// alone, so it is acted on at once. The other lane is also paced by token
// buckets refilled at N per minute with a burst of a tenth of N (at least 1):
// one cluster-wide and one per node (fairness: one bad node cannot use the
// whole budget; and a slow pace lets the circuit breaker see a
// misconfigured node's new pods break before many are acted on).
//
// The cap is shared fairly between namespaces (fairShare): one whose pods
// all look broken cannot hold back another's repairs for the window.
type Limiter struct {
	global  *rate.Limiter
	perNode rate.Limit
	burst   int
	cap     int

	mu      sync.Mutex
	nodes   map[string]*rate.Limiter
	recent  []capAction          // actions of the last capWindow, oldest first
	waiting map[string]time.Time // namespace -> its last refusal, since served no more
}

// capAction is one action counted by the cap: when, in which namespace.
type capAction struct {
	at        time.Time
	namespace string
}

// New returns a limiter of perMinute actions cluster-wide and
// perNodePerMinute on each node.
func New(perMinute, perNodePerMinute int) *Limiter {
	return &Limiter{
		global:  rate.NewLimiter(rate.Limit(float64(perMinute)/60), burstOf(perMinute)),
		perNode: rate.Limit(float64(perNodePerMinute) / 60),
		burst:   burstOf(perNodePerMinute),
		cap:     perMinute,
		nodes:   map[string]*rate.Limiter{},
		waiting: map[string]time.Time{},
	}
}

func burstOf(perMinute int) int {
	b := perMinute / 10
	if b < 1 {
		b = 1
	}
	return b
}

// Take takes one action's worth at now for a pod of namespace on node: from
// the cluster-wide cap within the namespace's fair share of it and, unless
// race, from the node's bucket and the global bucket. When any is exhausted
// nothing is taken, the namespace counts as waiting, and the wait until a
// retry may succeed is returned.
func (l *Limiter) Take(namespace, node string, race bool, now time.Time) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.prune(now)
	d := l.capWait(now)
	if d == 0 {
		d = l.shareWait(namespace, now)
	}
	if d == 0 && !race {
		if ok, wait := l.takeBuckets(node, now); !ok {
			d = wait
		}
	}
	if d > 0 {
		l.waiting[namespace] = now
		return false, d
	}
	delete(l.waiting, namespace)
	l.recent = append(l.recent, capAction{at: now, namespace: namespace})
	return true, 0
}

// prune drops the actions older than capWindow and the namespaces that have
// not asked again for as long (their pods were repaired by other means, or
// are gone).
func (l *Limiter) prune(now time.Time) {
	i := 0
	for i < len(l.recent) && now.Sub(l.recent[i].at) >= capWindow {
		i++
	}
	l.recent = l.recent[i:]
	for ns, t := range l.waiting {
		if now.Sub(t) >= capWindow {
			delete(l.waiting, ns)
		}
	}
}

// capWait returns how long until the cap has room (0: it has).
func (l *Limiter) capWait(now time.Time) time.Duration {
	if len(l.recent) < l.cap {
		return 0
	}
	return l.recent[len(l.recent)-l.cap].at.Add(capWindow).Sub(now)
}

// takeBuckets takes one token from the node's bucket and one from the global
// bucket, or none.
func (l *Limiter) takeBuckets(node string, now time.Time) (bool, time.Duration) {
	nl, ok := l.nodes[node]
	if !ok {
		nl = rate.NewLimiter(l.perNode, l.burst)
		l.nodes[node] = nl
	}
	nr := nl.ReserveN(now, 1)
	if d := nr.DelayFrom(now); d > 0 {
		nr.CancelAt(now)
		return false, d
	}
	gr := l.global.ReserveN(now, 1)
	if d := gr.DelayFrom(now); d > 0 {
		gr.CancelAt(now)
		nr.CancelAt(now)
		return false, d
	}
	return true, 0
}

// ForgetNode drops a deleted node's bucket.
func (l *Limiter) ForgetNode(node string) {
	l.mu.Lock()
	delete(l.nodes, node)
	l.mu.Unlock()
}
