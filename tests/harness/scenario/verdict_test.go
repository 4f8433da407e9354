package scenario

import (
	"strings"
	"testing"
)

func TestVerdict(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	plain := &PodResult{Name: PlainPod, Bypass: 40, ExternalConnections: 40}
	meshed := PodResult{Name: "web-1", Meshed: 40}
	bypassing := PodResult{Name: "web-1", Bypass: 40, ExternalConnections: 40}
	for _, tc := range []struct {
		name string
		mode Mode
		res  Result
		want []string // substrings, one per expected reason; none: valid
	}{
		{"a shown race is valid", NoRepair, Result{Pods: 1, EverBypassed: 1, BypassingAtEnd: 1, Plain: plain,
			Control: &PodResult{Meshed: 5}, PodResults: []PodResult{bypassing}}, nil},
		{"no plain pod report is a broken bypass path", NoRepair, Result{Pods: 1, EverBypassed: 1, BypassingAtEnd: 1,
			Control: &PodResult{Meshed: 5}, PodResults: []PodResult{bypassing}}, []string{"bypass path is broken"}},
		{"a plain pod that never reached the external service is a broken bypass path", Repair, Result{Pods: 1, EverBypassed: 1,
			SecondsToAllMeshed: f(3), Plain: &PodResult{Errors: 30}, PodResults: []PodResult{meshed}}, []string{"bypass path is broken"}},
		{"a plain pod seen meshed is a broken classification", Prevention, Result{Pods: 1, SecondsToAllMeshed: f(3),
			Plain: &PodResult{Bypass: 3, Meshed: 1, ExternalConnections: 3}, PodResults: []PodResult{meshed}}, []string{"bypass path is broken"}},
		{"the fresh machine's run: no answer at all, no race", NoRepair, Result{Pods: 1, Plain: &PodResult{Errors: 30},
			Control: &PodResult{Errors: 30}, PodResults: []PodResult{{Name: "web-1", Errors: 30}}},
			[]string{"bypass path is broken", "web-1: not one answered connection", "race was not shown", "was not meshed only"}},
		{"a repair run that saw no bypass repaired nothing", Repair, Result{Pods: 1, SecondsToAllMeshed: f(3), Plain: plain,
			PodResults: []PodResult{meshed}}, []string{"race was not shown"}},
		{"a repair run that left a pod bypassing failed", Repair, Result{Pods: 1, EverBypassed: 1, BypassingAtEnd: 1, Plain: plain,
			PodResults: []PodResult{bypassing}}, []string{"not every pod was meshed"}},
		{"prevention with a bypass failed", Prevention, Result{Pods: 1, EverBypassed: 1, SecondsToAllMeshed: f(3), Plain: plain,
			PodResults: []PodResult{meshed}}, []string{"bypassed the proxy although"}},
		{"a replaced pod that never ran is no problem", NodeReboot, Result{Pods: 1, EverBypassed: 1, SecondsToAllMeshed: f(3), Plain: plain,
			PodResults: []PodResult{meshed, {Name: "web-0", Deleted: true}}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Verdict(tc.mode, &tc.res)
			if len(got) != len(tc.want) {
				t.Fatalf("got %d reasons %q, want %d (%q)", len(got), got, len(tc.want), tc.want)
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("reason %d: %q, want it to say %q", i, got[i], w)
				}
			}
		})
	}
}
