package audit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cmdutil"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/version"
)

// ClientFunc builds the client from the parsed options.
type ClientFunc func(o *Options) (kubernetes.Interface, error)

// DefaultClient finds the cluster as kubectl does (cmdutil.KubectlConfig).
func DefaultClient(o *Options) (kubernetes.Interface, error) {
	cfg, err := o.Kube.RESTConfig()
	if err != nil {
		return nil, err
	}
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cfg.UserAgent = "consul-cni-repair-audit/" + version.Version
	return kubernetes.NewForConfig(cfg)
}

// Main runs the audit command named command with args and returns its exit
// code.
func Main(ctx context.Context, command string, args []string, stdout, stderr io.Writer, newClient ClientFunc) int {
	o := NewOptions()
	fs := o.newFlagSet(command, stderr)
	showVersion := fs.Bool("version", false, "Print the version and exit.")
	err := fs.Parse(args)
	switch {
	case errors.Is(err, pflag.ErrHelp):
		return 0
	case err == nil && *showVersion:
		fmt.Fprintln(stdout, version.String(command))
		return 0
	case err != nil:
		cmdutil.UsageError(stderr, command, err)
		return ExitUsage
	case fs.NArg() != 0:
		cmdutil.UsageError(stderr, command, fmt.Errorf("unexpected arguments %q", fs.Args()))
		return ExitUsage
	}
	if err := o.Validate(); err != nil {
		cmdutil.UsageError(stderr, command, err)
		return ExitUsage
	}
	client, err := newClient(o)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", command, err)
		return ExitError
	}
	return checkAndAudit(ctx, command, client, o, stdout, stderr)
}

// checkAndAudit runs the checks asked for, then the audit, and returns the exit code:
// ExitError before ExitUnhealthy before ExitOutside.
func checkAndAudit(ctx context.Context, command string, client kubernetes.Interface, o *Options, stdout, stderr io.Writer) int {
	p, err := newPrinter(o.Output, o.NoHeaders)
	if err != nil { // Validate parsed it already
		fmt.Fprintf(stderr, "%s: %v\n", command, err)
		return ExitError
	}
	var failed []string
	if o.Checks.enabled() {
		if failed, err = runChecks(ctx, client, o, stderr); err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", command, err)
			return ExitError
		}
	}
	r, err := Run(ctx, client, o, time.Now())
	if err == nil {
		err = p.print(stdout, r)
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", command, err)
		return ExitError
	}
	fmt.Fprintf(stderr, "%d of %d injected pods outside the mesh\n", len(r.Outside), r.Examined)
	fmt.Fprintln(stderr, r.Verification)
	switch {
	case len(failed) > 0:
		return ExitUnhealthy
	case len(r.Outside) > 0 && o.FailOutside:
		return ExitOutside
	}
	return ExitNoneOutside
}
