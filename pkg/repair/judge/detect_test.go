package judge_test

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge/judgetest"
)

func TestDetectMatrix(t *testing.T) {
	for _, tc := range judgetest.DetectMatrix() {
		t.Run(tc.Name, func(t *testing.T) {
			v := tc.Detector().Detect(tc.Pod, judgetest.T0)
			if v.Broken != tc.Broken {
				t.Fatalf("broken = %v, want %v (verdict %+v)", v.Broken, tc.Broken, v)
			}
			if v.Broken {
				if v.Reason != tc.Reason {
					t.Errorf("reason = %s, want %s", v.Reason, tc.Reason)
				}
				if !v.Since.Equal(tc.Since) {
					t.Errorf("since = %s, want %s", v.Since, tc.Since)
				}
				if v.Detail == "" {
					t.Error("empty detail")
				}
			}
			if !v.RecheckAt.Equal(tc.Recheck) {
				t.Errorf("recheckAt = %s, want %s", v.RecheckAt, tc.Recheck)
			}
		})
	}
}

func TestMatchesInitContainer(t *testing.T) {
	names := []string{"consul-connect-inject-init", "consul-cni-check"}
	for name, want := range map[string]bool{
		"consul-connect-inject-init":      true,
		"consul-connect-inject-init-web":  true,
		"consul-cni-check":                true,
		"consul-cni-check-a":              true,
		"consul-connect-inject-init-":     false,
		"consul-connect-inject-initx":     false,
		"consul-connect-inject":           false,
		"x-consul-connect-inject-init":    false,
		"":                                false,
		"consul-connect-inject-init-a-b2": true,
	} {
		if got := judge.MatchesInitContainer(name, names); got != want {
			t.Errorf("%q: got %v want %v", name, got, want)
		}
	}
}

// The breaker counts a pod by its latest sandbox, not by its creation: a
// sandbox_recreated pod created long before the CNI became ready but whose
// sandbox was made after that tests the ready CNI like a new pod and counts;
// one whose sandbox was recreated before (a node reboot, the CNI not yet
// chained again) is of the race and does not, nor does one dated less than
// the sandbox slack after readiness (the kubelet dates a sandbox late, so it
// may have been made before).
func TestCountedByBreakerSandboxRecreated(t *testing.T) {
	d := judgetest.Detector()
	defaultSandboxSlack := judge.DefaultConfig().SandboxSlack
	ready := -5 * time.Minute
	since := judgetest.T0.Add(ready) // the CNI became ready
	recreated := func(opts ...judgetest.PodOpt) *corev1.Pod {
		return judgetest.Pod(append([]judgetest.PodOpt{judgetest.WithStatus(annotations.TProxyStatusComplete), judgetest.AppliedAt(-2 * time.Hour)}, opts...)...)
	}
	tests := []struct {
		name    string
		pod     *corev1.Pod
		counted bool
	}{
		{"created before, sandbox recreated before readiness (reboot race)", recreated(judgetest.SandboxAt(ready - 10*time.Second)), false},
		{"created before, sandbox recreated after readiness", recreated(judgetest.SandboxAt(-time.Minute)), true},
		{"sandbox dated the second of readiness", recreated(judgetest.SandboxAt(ready + 500*time.Millisecond)), false},
		{"sandbox dated within the slack after readiness", recreated(judgetest.SandboxAt(ready + defaultSandboxSlack - time.Second)), false},
		{"sandbox dated a whole slack after readiness", recreated(judgetest.SandboxAt(ready + defaultSandboxSlack)), true},
		{"created after, sandbox after", recreated(judgetest.SandboxAt(-time.Minute), func(p *corev1.Pod) { p.CreationTimestamp = judgetest.At(-2 * time.Minute) }), true},
		{"sandbox being recreated", recreated(judgetest.SandboxDown(-5 * time.Second)), false},
		{"complete, not recreated, sandbox after", judgetest.Pod(judgetest.WithStatus(annotations.TProxyStatusComplete), judgetest.AppliedAt(-time.Minute), judgetest.SandboxAt(-time.Minute)), true},
		{"finished", recreated(judgetest.SandboxAt(-time.Minute), judgetest.InPhase(corev1.PodFailed)), false},
		{"waiting written by an ADD after readiness, the condition still dating a sandbox before it", judgetest.Pod(judgetest.WithStatus(annotations.TProxyStatusWaiting), judgetest.SandboxAt(ready-time.Hour), judgetest.StatusWritten("consul-cni", -time.Minute)), true},
		{"waiting written before readiness, sandbox before it", judgetest.Pod(judgetest.WithStatus(annotations.TProxyStatusWaiting), judgetest.SandboxAt(ready-time.Minute), judgetest.StatusWritten("consul-cni", ready-2*time.Minute)), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := d.Detect(tc.pod, judgetest.T0)
			if got := d.CountedByBreaker(tc.pod, since); got != tc.counted {
				t.Fatalf("counted %v, want %v (verdict %+v)", got, tc.counted, v)
			}
		})
	}
}
