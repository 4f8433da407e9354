package audit

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
)

// Verification counts the judged pods (those the detector examines) by
// what their verdict rests on: the node verifier's condition, with or
// without the rules, or inference from the signals where no verifier
// reports for the node or none spoke for the pod's current sandbox.
type Verification struct {
	VerifiedRedirected   int `json:"verifiedRedirected"`
	VerifiedUnredirected int `json:"verifiedUnredirected"`
	Inferred             int `json:"inferred"`
}

func (c *Verification) count(v judge.Verdict) {
	switch {
	case v.Evidence == judge.EvidenceVerified && v.Broken:
		c.VerifiedUnredirected++
	case v.Evidence == judge.EvidenceVerified:
		c.VerifiedRedirected++
	case v.Evidence == judge.EvidenceInferred:
		c.Inferred++
	}
}

// String is the summary line of the table output.
func (c Verification) String() string {
	return fmt.Sprintf("verified on their node: %d with their redirect rules, %d without; inferred from status and timing (no verifier reports for the node, or none for the pod's current sandbox): %d",
		c.VerifiedRedirected, c.VerifiedUnredirected, c.Inferred)
}

// detector is the controller's detector reading the verifier's heartbeat
// from the listed nodes, as the controller reads its node cache.
func detector(cfg judge.Config, nodes cache.Indexer) judge.Detector {
	d := cfg.Detector()
	d.VerifierHeartbeat = func(name string) (time.Time, bool) {
		obj, exists, err := nodes.GetByKey(name)
		if err != nil || !exists {
			return time.Time{}, false
		}
		n, _ := obj.(*corev1.Node)
		return judge.NodeVerifierHeartbeat(n)
	}
	return d
}
