package repair

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Limiter bounds actions globally and per node (fairness: one bad node cannot
// use the whole budget). Both are token buckets refilled at N per minute with
// a burst of a tenth of N (at least 1).
type Limiter struct {
	global  *rate.Limiter
	perNode rate.Limit
	burst   int

	mu    sync.Mutex
	nodes map[string]*rate.Limiter
}

// newLimiter returns a limiter of perMinute actions cluster-wide and
// perNodePerMinute on each node.
func newLimiter(perMinute, perNodePerMinute int) *Limiter {
	return &Limiter{
		global:  rate.NewLimiter(rate.Limit(float64(perMinute)/60), burstOf(perMinute)),
		perNode: rate.Limit(float64(perNodePerMinute) / 60),
		burst:   burstOf(perNodePerMinute),
		nodes:   map[string]*rate.Limiter{},
	}
}

func burstOf(perMinute int) int {
	b := perMinute / 10
	if b < 1 {
		b = 1
	}
	return b
}

// Take takes one token from the node's bucket and one from the global bucket
// at now. When either is empty nothing is taken and the wait until a retry
// may succeed is returned.
func (l *Limiter) Take(node string, now time.Time) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
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
