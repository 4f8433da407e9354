package cmdutil

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func TestLoggingFlags(t *testing.T) {
	fs := pflag.NewFlagSet("cmd", pflag.ContinueOnError)
	l := NewLogging()
	l.AddFlags(fs)
	for _, name := range []string{"logging-format", "v", "vmodule"} {
		if fs.Lookup(name) == nil {
			t.Errorf("no --%s", name)
		}
	}
	if u := fs.Lookup("logging-format").Usage; !strings.Contains(u, "json") || !strings.Contains(u, "text") {
		t.Errorf("--logging-format offers %q, want text and json", u)
	}
	if err := fs.Parse([]string{"--logging-format=xml"}); err != nil {
		t.Fatal(err)
	}
	// Validation fails before anything is applied.
	if err := l.Apply(); err == nil || !strings.Contains(err.Error(), "format") || !strings.Contains(err.Error(), "xml") {
		t.Fatalf("Apply with format xml: %v", err)
	}
}
