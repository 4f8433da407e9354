// Package audit is the one-shot audit of the repair command: it lists the
// injected pods, the nodes and the CNI pods once (paginated) and reports the
// pods that run outside the mesh now, judged by the controller's own
// detector, gate and circuit breaker (package judge), with what the
// controller would do about each.
package audit

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cmdutil"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
)

// Exit codes of the audit.
const (
	// ExitNoneOutside: no injected pod runs outside the mesh.
	ExitNoneOutside = 0
	// ExitError: the audit could not be completed.
	ExitError = 1
	// ExitUsage: the command line cannot be used.
	ExitUsage = cmdutil.ExitUsage
	// ExitOutside: some injected pods run outside the mesh.
	ExitOutside = 3
	// ExitUnhealthy: a check of the install failed (Checks).
	ExitUnhealthy = 4
)

// DefaultChunkSize is the default page size of the LISTs.
const DefaultChunkSize = 500

// Options are the audit's flags.
type Options struct {
	Kube          cmdutil.KubectlConfig
	Namespace     string
	AllNamespaces bool
	Selector      string
	Output        string
	NoHeaders     bool
	ChunkSize     int64
	Checks        Checks
	FailOutside   bool
	Config        judge.Config
	detection     *judge.Flags
}

// NewOptions returns the defaults: those of the controller for detection.
func NewOptions() *Options {
	o := &Options{Output: "table", ChunkSize: DefaultChunkSize, FailOutside: true, Config: judge.DefaultConfig()}
	o.detection = judge.NewFlags(&o.Config)
	return o
}

// AddFlags registers the audit's flags, the controller's detection flags
// among them.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	o.Kube.AddFlags(fs)
	fs.StringVarP(&o.Namespace, "namespace", "n", "", "Audit the pods of this namespace only (the circuit breaker is then judged on them only). Default: every namespace.")
	fs.BoolVarP(&o.AllNamespaces, "all-namespaces", "A", false, "Audit the pods of every namespace (the default).")
	fs.StringVarP(&o.Selector, "selector", "l", "", "Label selector added to --injected-pod-selector.")
	fs.StringVarP(&o.Output, "output", "o", o.Output, "Output format: table, wide (table with the detail and the action's reason), json, yaml, name (pod/NAME) or jsonpath=TEMPLATE (kubectl's JSONPath, over the JSON report).")
	fs.BoolVar(&o.NoHeaders, "no-headers", false, "Table and wide: print no header lines, and only the rows of the pods outside the mesh.")
	fs.Int64Var(&o.ChunkSize, "chunk-size", o.ChunkSize, "Page size of each LIST (limit/continue).")
	fs.BoolVar(&o.FailOutside, "fail-outside", o.FailOutside, "Exit 3 when some injected pods run outside the mesh; false: exit 0 for them (they are still listed).")
	fs.StringVar(&o.Checks.Lease, "controller-lease", "", "Check that the controller works: the Lease NAMESPACE/NAME (its --leader-election-namespace and -id) has a leader that renewed it within its duration; exit 4 when not.")
	fs.BoolVar(&o.Checks.NodeReadiness, "check-node-readiness", false, "Check that node readiness works: there is a Ready CNI pod (--cni-namespace, --cni-pod-selector) and every node with one is labelled consul.hashicorp.com/cni=ready; exit 4 when not. Only for a controller that acts (not --dry-run) with --node-readiness.")
	fs.DurationVar(&o.Checks.Timeout, "checks-timeout", 0, "Repeat the checks until they pass, for at most this long (0: once).")
	o.detection.AddFlags(fs, &o.Config)
}

// Validate checks the flags and names the first bad one.
func (o *Options) Validate() error {
	o.detection.Apply(&o.Config)
	if o.Namespace != "" && o.AllNamespaces {
		return errors.New("--namespace and --all-namespaces: give one of them")
	}
	if _, err := newPrinter(o.Output, o.NoHeaders); err != nil {
		return fmt.Errorf("--output: %w", err)
	}
	if err := o.Checks.validate(); err != nil {
		return err
	}
	if o.ChunkSize < 1 {
		return fmt.Errorf("--chunk-size: %d must be at least 1", o.ChunkSize)
	}
	if _, err := labels.Parse(o.Selector); err != nil {
		return fmt.Errorf("--selector: %q: %v", o.Selector, err)
	}
	// The CNI pod settings are the controller's, checked as it checks them
	// with node readiness (its default).
	return cmdutil.FlagError(o.Config.Validate(true), judge.FlagNames)
}

// podSelector is --injected-pod-selector and --selector together.
func (o *Options) podSelector() string {
	if strings.TrimSpace(o.Selector) == "" {
		return o.Config.InjectedPodSelector
	}
	return o.Config.InjectedPodSelector + "," + o.Selector
}

// newFlagSet returns the audit's flag set for command (its name in usage).
func (o *Options) newFlagSet(command string, stderr io.Writer) *pflag.FlagSet {
	fs := pflag.NewFlagSet(command, pflag.ContinueOnError)
	fs.SortFlags = false
	fs.SetOutput(stderr)
	o.AddFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: %s [flags]\n\n%s\n\nFlags:\n%s", command, strings.TrimSpace(usageText), fs.FlagUsages())
	}
	return fs
}

const usageText = `
Lists the injected pods, the nodes and the CNI pods once and prints the pods
that run outside the mesh now, judged as the controller judges them (same
detection flags and defaults), with why and what the controller would do.
Exit code: 0 when no pod is outside the mesh, 3 when some are, 4 when a check
of the install asked for (--controller-lease, --check-node-readiness) failed,
1 on errors, 2 on a bad command line. Read-only: needs get/list on pods and nodes
(ClusterRole consul-cni-repair-audit), and get on the Lease with
--controller-lease.`
