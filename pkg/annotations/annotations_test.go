package annotations

import (
	"strings"
	"testing"
	"time"
)

func TestTimeAnnotationRoundTrip(t *testing.T) {
	in := time.Date(2026, 11, 30, 13, 4, 5, 600e6, time.FixedZone("x", 3600))
	s := FormatTime(in)
	if s != "2026-11-30T12:04:05Z" {
		t.Fatalf("FormatTime = %q", s)
	}
	got, err := ParseTime(KeyCNIAppliedAt, s)
	if err != nil || !got.Equal(in.Truncate(time.Second)) {
		t.Fatalf("ParseTime = %v, %v", got, err)
	}
	if _, err := ParseTime(KeyCNIAppliedAt, "yesterday"); err == nil || !strings.Contains(err.Error(), KeyCNIAppliedAt) || !strings.Contains(err.Error(), "yesterday") {
		t.Fatalf("bad value: %v", err)
	}
}
