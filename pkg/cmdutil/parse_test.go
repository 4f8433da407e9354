package cmdutil

import (
	"bytes"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/version"
)

func TestParse(t *testing.T) {
	old := version.Version
	t.Cleanup(func() { version.Version = old })
	version.Version = "v9.8.7"
	for _, tc := range []struct {
		args       []string
		code       int
		done       bool
		out, errIn string
	}{
		{[]string{"--name=x"}, 0, false, "", ""},
		{[]string{"--version"}, 0, true, "cmd v9.8.7 (", ""},
		{[]string{"--bogus"}, ExitUsage, true, "", "cmd: unknown flag: --bogus"},
		{[]string{"--name"}, ExitUsage, true, "", "--name"},
		{[]string{"--help"}, 0, true, "", "Usage"},
	} {
		fs := pflag.NewFlagSet("cmd", pflag.ContinueOnError)
		fs.String("name", "", "a name")
		var stdout, stderr bytes.Buffer
		fs.SetOutput(&stderr)
		fs.Usage = func() { stderr.WriteString("Usage: cmd\n") }
		code, done := parse(fs, "cmd", tc.args, nil, &stdout, &stderr)
		if code != tc.code || done != tc.done {
			t.Errorf("%v: code %d done %v, want %d %v", tc.args, code, done, tc.code, tc.done)
		}
		if !strings.HasPrefix(stdout.String(), tc.out) || (tc.out == "" && stdout.Len() != 0) {
			t.Errorf("%v: stdout %q, want prefix %q", tc.args, stdout.String(), tc.out)
		}
		if !strings.Contains(stderr.String(), tc.errIn) || (tc.errIn == "" && stderr.Len() != 0) {
			t.Errorf("%v: stderr %q, want it to contain %q", tc.args, stderr.String(), tc.errIn)
		}
	}
}

func TestParseAppliesLogging(t *testing.T) {
	fs := pflag.NewFlagSet("cmd", pflag.ContinueOnError)
	var stdout, stderr bytes.Buffer
	code, done := parse(fs, "cmd", []string{"--logging-format=xml"}, NewLogging(), &stdout, &stderr)
	if code != ExitUsage || !done || !strings.Contains(stderr.String(), "--logging-format=xml") {
		t.Fatalf("code %d done %v stderr %q: want a usage error naming --logging-format", code, done, stderr.String())
	}
}
