package scenario

import (
	"testing"
	"time"
)

func TestTrackerLines(t *testing.T) {
	tr := newTracker(nil, "ns")
	p := tr.pod("u1", "web-1")
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s int) string { return t0.Add(time.Duration(s) * time.Second).Format(time.RFC3339Nano) }
	for _, l := range []string{
		at(0) + " bypass from 198.18.0.2:1234",
		at(1) + " bypass from 198.18.0.2:1235",
		"garbage",
		at(2) + " error dial tcp: connection refused",
		at(3) + " meshed via 198.18.0.2:1236",
		at(4) + " meshed via 198.18.0.2:1237",
	} {
		tr.line(p, l)
	}
	if p.Bypass != 2 || p.Meshed != 2 || p.Errors != 1 {
		t.Fatalf("counts bypass %d meshed %d errors %d", p.Bypass, p.Meshed, p.Errors)
	}
	if !p.MeshedSince.Equal(t0.Add(3*time.Second)) || !p.FirstBypassAt.Equal(t0) || p.Last != resultMeshed {
		t.Fatalf("meshed since %v, first bypass %v, last %q", p.MeshedSince, p.FirstBypassAt, p.Last)
	}
	tr.line(p, at(5)+" bypass from x")
	if !p.MeshedSince.IsZero() {
		t.Fatal("a bypass after meshed results must reset the meshed streak")
	}
}

func TestAllMeshed(t *testing.T) {
	now := time.Now()
	r := &runner{cfg: Config{Pods: 2}}
	a := &podTrack{Name: "a", MeshedSince: now.Add(-3 * time.Second), LastAt: now}
	b := &podTrack{Name: "b", MeshedSince: now.Add(-2 * time.Second), LastAt: now}
	if ok, at := r.allMeshed([]*podTrack{a, b}); !ok || !at.Equal(b.MeshedSince) {
		t.Fatalf("allMeshed = %v %v, want true at the latest streak start", ok, at)
	}
	if ok, _ := r.allMeshed([]*podTrack{a}); ok {
		t.Fatal("one live pod of two counted as all meshed")
	}
	b.LastAt = now.Add(-time.Minute)
	if ok, _ := r.allMeshed([]*podTrack{a, b}); ok {
		t.Fatal("a pod with a stale result counted as meshed")
	}
}

// A kubelet writes container output in the CRI logging format; the prober's
// words come after its prefix.
func TestTrackerCRILines(t *testing.T) {
	tr := newTracker(nil, "ns")
	p := tr.pod("u1", "web-1")
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Format(time.RFC3339Nano)
	tr.line(p, "2026-01-01T00:00:00.5Z stdout F "+at+" bypass from 198.18.0.2:1234")
	tr.line(p, "2026-01-01T00:00:01.5Z stdout F "+at+" meshed via 198.18.0.2:1235")
	tr.line(p, "not-a-time stdout F "+at+" meshed via x")
	if p.Bypass != 1 || p.Meshed != 1 || p.Errors != 0 {
		t.Fatalf("counts bypass %d meshed %d errors %d, want 1 1 0", p.Bypass, p.Meshed, p.Errors)
	}
	if got := criLine("plain line"); got != "plain line" {
		t.Fatalf("criLine changed a plain line: %q", got)
	}
}
