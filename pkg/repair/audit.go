package repair

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// This file exports what a one-shot audit needs to judge pods exactly as the
// controller does, without informers.

// DefaultConfig returns the documented defaults of the controller's settings.
func DefaultConfig() Config { return defaultConfig() }

// Detector returns the detector the controller builds from c.
func (c *Config) Detector() Detector { return c.detector() }

// PodNodeIndexers index pods by spec.nodeName, as NewGate's CNI pod indexer
// must be.
func PodNodeIndexers() cache.Indexers { return podNodeIndexer() }

// NewGate builds the controller's gate of mode from a node lister and an
// indexer of CNI pods built with PodNodeIndexers; start dates the readiness
// of nodes whose readiness the gate cannot date.
func NewGate(mode GateMode, nodes corelisters.NodeLister, cniPods cache.Indexer, start time.Time) Gate {
	return newGate(mode, nodes, cniPods, start)
}

// NewBreaker returns a breaker with every node closed.
func NewBreaker(threshold float64, minPods int) *Breaker { return newBreaker(threshold, minPods) }

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
