package judge_test

import (
	"testing"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge/judgetest"
)

func TestVerifiedEvidenceDecidesBeforeTheSignals(t *testing.T) {
	for _, tc := range judgetest.VerifiedMatrix() {
		t.Run(tc.Name, func(t *testing.T) {
			d := judgetest.Detector()
			d.VerifierHeartbeat = tc.Heartbeat
			v := d.Detect(tc.Pod, judgetest.T0)
			if v.Broken != tc.Broken {
				t.Fatalf("broken = %v, want %v (verdict %+v)", v.Broken, tc.Broken, v)
			}
			if v.Evidence != tc.Evidence {
				t.Errorf("evidence = %q, want %q (verdict %+v)", v.Evidence, tc.Evidence, v)
			}
			if v.Evidence == "inferred" && v.Inferred == "" {
				t.Errorf("inferred verdict does not say why: %+v", v)
			}
			if !v.Broken {
				return
			}
			if v.Reason != tc.Reason {
				t.Errorf("reason = %s, want %s", v.Reason, tc.Reason)
			}
			if !v.Since.Equal(tc.Since) {
				t.Errorf("since = %s, want %s", v.Since, tc.Since)
			}
			if v.Detail == "" {
				t.Error("empty detail")
			}
		})
	}
}
