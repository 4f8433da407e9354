package audit

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
)

// verifierOn gives a node the verifier's Node condition, heartbeat d ago.
func verifierOn(n *corev1.Node, d time.Duration) *corev1.Node {
	n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: annotations.NodeConditionCNIVerified,
		Status: corev1.ConditionFalse, Reason: annotations.ReasonPodsUnredirected, LastHeartbeatTime: ago(d)})
	return n
}

// verifiedPod gives a pod the verifier's condition, probed d ago.
func verifiedPod(st corev1.ConditionStatus, reason string, d time.Duration) podOpt {
	return func(p *corev1.Pod) {
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: annotations.ConditionRedirectVerified,
			Status: st, Reason: reason, Message: "sandbox 0123456789abc", LastProbeTime: ago(d), LastTransitionTime: ago(d)})
	}
}

// The audit judges with the verifier's evidence as the controller does and
// says, in every format, what each verdict rests on: verified where a
// verifier reports for the node and spoke for the pod's current sandbox,
// inferred (and why) elsewhere.
func TestAuditShowsVerifiedEvidenceAndWhenItInfers(t *testing.T) {
	objs := clientOf(verifierOn(readyNode("n1"), 30*time.Second), readyNode("n2"),
		// meshed by every timing, but verified without rules
		injected("unredirected", "n1", verifiedPod(corev1.ConditionFalse, annotations.ReasonRulesMissing, 10*time.Second)),
		// signal C by timing, but verified with rules: not outside
		injected("protected", "n1", recreated, verifiedPod(corev1.ConditionTrue, annotations.ReasonRulesInPlace, 2*time.Hour)),
		// no verifier on n2: signal A
		injected("stuck", "n2", stuck))
	code, out, stderr := main(t, []string{"-o", "json"}, objs)
	var r Report
	if err := json.Unmarshal([]byte(out), &r); err != nil || code != ExitOutside {
		t.Fatalf("exit %d, %v: %s", code, err, out)
	}
	pods := byName(&r)
	if len(pods) != 2 {
		t.Fatalf("outside: %+v, want unredirected and stuck", r.Outside)
	}
	if p := pods["unredirected"]; p.Reason != judge.ReasonVerifiedUnredirected || p.Evidence != judge.EvidenceVerified || p.Action != "evict" {
		t.Errorf("unredirected: %+v", p)
	}
	if p := pods["stuck"]; p.Reason != judge.ReasonTProxyStatusStuck || p.Evidence != judge.EvidenceInferred || !strings.Contains(p.Inferred, `no verifier reports for node "n2"`) {
		t.Errorf("stuck: %+v", p)
	}
	if want := (Verification{VerifiedRedirected: 1, VerifiedUnredirected: 1, Inferred: 1}); r.Verification != want {
		t.Errorf("verification %+v, want %+v", r.Verification, want)
	}
	if !strings.Contains(stderr, "1 with their redirect rules, 1 without; inferred") {
		t.Errorf("stderr summary: %q", stderr)
	}
	_, y, _ := main(t, []string{"-o", "yaml"}, objs)
	if err := yaml.Unmarshal([]byte(y), &r); err != nil || byName(&r)["unredirected"].Evidence != judge.EvidenceVerified {
		t.Errorf("-o yaml: %v %s", err, y)
	}
	_, jp, _ := main(t, []string{"-o", `jsonpath={range .outside[*]}{.name}={.evidence} {end}`}, objs)
	if jp != "stuck=inferred unredirected=verified " {
		t.Errorf("-o jsonpath: %q", jp)
	}
	_, table, _ := main(t, nil, objs)
	if !regexp.MustCompile(`(?m)^NAMESPACE +POD +NODE +OWNER +REASON +EVIDENCE +SINCE +ACTION$`).MatchString(table) ||
		!regexp.MustCompile(`(?m)^app +unredirected +n1 +ReplicaSet/web-5d8f +verified_unredirected +verified `).MatchString(table) ||
		!regexp.MustCompile(`(?m)^app +stuck +n2 +ReplicaSet/web-5d8f +tproxy_status_stuck +inferred `).MatchString(table) {
		t.Errorf("table:\n%s", table)
	}
	_, wide, _ := main(t, []string{"-o", "wide"}, objs)
	if !regexp.MustCompile(`(?m)INFERRED$`).MatchString(wide) || !strings.Contains(wide, `no verifier reports for node "n2"`) {
		t.Errorf("wide:\n%s", wide)
	}
}

// A verifier whose heartbeat is stale is no evidence: the audit infers, and
// says why.
func TestAuditInfersWhereTheVerifierIsStale(t *testing.T) {
	r := run(t, NewOptions(),
		verifierOn(readyNode("n1"), 10*time.Minute),
		injected("unredirected", "n1", verifiedPod(corev1.ConditionFalse, annotations.ReasonRulesMissing, 10*time.Second)))
	if len(r.Outside) != 0 || r.Verification != (Verification{Inferred: 1}) {
		t.Fatalf("outside %+v, verification %+v", r.Outside, r.Verification)
	}
}
