package judge

import (
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Breaker is the per-node circuit breaker. The race this controller repairs
// only hits pods whose latest sandbox was created before the node's CNI
// became ready; when pods whose sandbox was created after that are broken
// too, the node's CNI is misconfigured and deleting its pods would only loop
// (Linkerd's and Istio's delete loops). The breaker is judged on the pods
// whose latest sandbox is at or after the node's readiness (not the pod's
// creation: a pod created earlier whose sandbox is recreated after the CNI
// was ready, the sandbox_recreated signal, tests the ready CNI as much as a
// new pod; and one whose sandbox was recreated before it, by a node reboot,
// is the race): it opens when at least MinPods of them are broken and they
// are at least Threshold of them, and closes when that no longer holds (for
// example after the CNI pod restarts with a fixed configuration, which
// moves the node's ready time).
type Breaker struct {
	Threshold float64
	MinPods   int

	mu   sync.Mutex
	open map[string]bool
}

// NewBreaker returns a breaker with every node closed.
func NewBreaker(threshold float64, minPods int) *Breaker {
	return &Breaker{Threshold: threshold, MinPods: minPods, open: map[string]bool{}}
}

// Trips reports whether broken out of total counted pods trips the breaker.
func (b *Breaker) Trips(broken, total int) bool {
	if total == 0 || broken < b.MinPods {
		return false
	}
	return float64(broken) >= b.Threshold*float64(total)
}

// Update records the node's new counts; it returns the breaker state and
// whether it changed.
func (b *Breaker) Update(node string, broken, total int) (open, changed bool) {
	open = b.Trips(broken, total)
	b.mu.Lock()
	defer b.mu.Unlock()
	was := b.open[node]
	if open {
		b.open[node] = true
	} else {
		delete(b.open, node)
	}
	return open, open != was
}

// IsOpen reports the node's last state.
func (b *Breaker) IsOpen(node string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.open[node]
}

// Open lists the nodes whose breaker is open.
func (b *Breaker) Open() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	nodes := make([]string, 0, len(b.open))
	for n := range b.open {
		nodes = append(nodes, n)
	}
	return nodes
}

// OpenNodes counts nodes whose breaker is open.
func (b *Breaker) OpenNodes() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.open)
}

// Forget drops a deleted node.
func (b *Breaker) Forget(node string) (wasOpen bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	wasOpen = b.open[node]
	delete(b.open, node)
	return wasOpen
}

// CountedByBreaker reports whether a node's breaker counts pod, given when
// the node's CNI became ready: a pod a signal can judge, not finished, whose
// sandbox was certainly made after since (dated at least SandboxSlack after
// it, see dateSandbox).
func (d Detector) CountedByBreaker(pod *corev1.Pod, since time.Time) bool {
	if ok, _ := examinable(pod); !ok || d.Finished(pod) {
		return false
	}
	return dateSandbox(pod, since, d.SandboxSlack) == sandboxAfterReady
}

// sandboxDating places a pod's latest sandbox against its node's CNI
// readiness.
type sandboxDating int

const (
	// sandboxUndated: the pod has no datable sandbox.
	sandboxUndated sandboxDating = iota
	// sandboxBeforeReady: made before the CNI was ready (the race). The
	// rate limiter's race lane takes these.
	sandboxBeforeReady
	// sandboxNearReady: dated less than the sandbox slack after the CNI
	// was ready, so it may have been made before: neither lane's race
	// nor counted by the breaker.
	sandboxNearReady
	// sandboxAfterReady: made after the CNI was ready even if the kubelet
	// dated it a whole slack late. The breaker counts these.
	sandboxAfterReady
)

// dateSandbox dates pod's latest sandbox against since, the moment its
// node's CNI became ready. API times have second precision, so since is
// truncated to the second. The kubelet dates a sandbox (SandboxTime) only
// in the sync after the one that made it, which also starts the first init
// container, so the date can be later than the sandbox by as much as
// signal C's slack allows for (Detector.SandboxSlack). A sandbox dated
// within slack after since may thus have been made before it: after a node
// reboot every sandbox is made again while the installer is starting, and
// the ones made before it chained consul-cni are dated just after its
// readiness. Counting those would open the breaker on the race itself.
func dateSandbox(pod *corev1.Pod, since time.Time, slack time.Duration) sandboxDating {
	t, ok := currentSandboxTime(pod)
	switch {
	case !ok:
		return sandboxUndated
	case t.Before(since.Truncate(time.Second)):
		return sandboxBeforeReady
	case t.Before(since.Truncate(time.Second).Add(slack)):
		return sandboxNearReady
	default:
		return sandboxAfterReady
	}
}
