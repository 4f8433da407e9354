package main

import (
	"context"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cmdutil"
)

func defaults(t *testing.T, args ...string) *options {
	t.Helper()
	o := &options{}
	fs := pflag.NewFlagSet(command, pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return o
}

func TestTheDefaultsAreValidOnceTheNodeIsNamed(t *testing.T) {
	o := defaults(t, "--node-name=node-a")
	if err := o.Validate(nil); err != nil {
		t.Fatal(err)
	}
}

func TestValidateNamesTheFlagAndValueItRefuses(t *testing.T) {
	for _, tc := range []struct {
		args []string
		rest []string
		want string
	}{
		{args: []string{"--node-name="}, want: "--node-name: empty"},
		{args: []string{"--node-name=Node_A"}, want: `--node-name: "Node_A"`},
		{args: []string{"--node-name=a", "--cri-socket=run/containerd.sock"}, want: `--cri-socket: "run/containerd.sock"`},
		{args: []string{"--node-name=a", "--host-root=host"}, want: `--host-root: "host"`},
		{args: []string{"--node-name=a", "--interval=10ms"}, want: "--interval: 10ms"},
		{args: []string{"--node-name=a", "--interval=10s", "--resync=5s"}, want: "--resync: 5s is shorter than --interval 10s"},
		{args: []string{"--node-name=a", "--metrics-bind-address=9100"}, want: `--metrics-bind-address: "9100"`},
		{args: []string{"--node-name=a"}, rest: []string{"run"}, want: `no arguments expected, got "run"`},
	} {
		t.Run(strings.Join(append(tc.args, tc.rest...), " "), func(t *testing.T) {
			err := defaults(t, tc.args...).Validate(tc.rest)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v; want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestABadFlagIsAUsageErrorBeforeAnythingIsDialled(t *testing.T) {
	if code := run(context.Background(), []string{"--node-name=a", "--interval=1ms", "--cri-socket=/nonexistent/cri.sock"}); code != cmdutil.ExitUsage {
		t.Fatalf("run = %d; want %d", code, cmdutil.ExitUsage)
	}
}
