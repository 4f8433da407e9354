package version

import (
	"strings"
	"testing"
)

func TestStringNamesCommandAndVersion(t *testing.T) {
	old := Version
	t.Cleanup(func() { Version = old })
	Version = "v1.2.3"
	got := String("repair")
	if !strings.HasPrefix(got, "repair v1.2.3 (") {
		t.Fatalf("String(repair) = %q, want it to start with %q", got, "repair v1.2.3 (")
	}
}
