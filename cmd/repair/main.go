// Command repair is the consul-cni-repair controller: it finds Consul
// transparent-proxy pods whose sandbox was created without the consul-cni
// plugin and gets them recreated (evict, delete or label, or only report in
// dry-run), and it marks nodes ready for injected pods when the CNI
// DaemonSet pod on them is Ready.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/audit"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/cmdutil"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/version"
)

// options are the command's flags.
type options struct {
	kubeconfig string
	qps        float32
	burst      int
	detection  *judge.Flags
	effect     string
	cfg        repair.ManagerConfig
}

func newOptions() *options {
	o := &options{qps: 50, burst: 100, cfg: repair.DefaultManagerConfig()}
	o.detection = judge.NewFlags(&o.cfg.Config.Config)
	o.effect = string(o.cfg.StartupTaintEffect)
	if ns := ownNamespace(); ns != "" {
		o.cfg.LeaseNamespace = ns
		o.cfg.CNINamespace = ns
	}
	return o
}

// serviceAccountNamespaceFile is where a pod's service-account volume
// holds its namespace.
var serviceAccountNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// ownNamespace is the namespace the controller runs in: $POD_NAMESPACE (the
// downward API), else its service account's, else "" outside a pod. It is
// the default of --leader-election-namespace and --cni-namespace, so the
// manifests name no namespace and any install namespace works.
func ownNamespace() string {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	if b, err := os.ReadFile(serviceAccountNamespaceFile); err == nil {
		return strings.TrimSpace(string(b))
	}
	return ""
}

// AddFlags registers every flag; --help prints each with its default.
func (o *options) AddFlags(fs *pflag.FlagSet) {
	c := &o.cfg
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "Path of a kubeconfig file. When empty, the KUBECONFIG environment variable, else the in-cluster configuration.")
	fs.Float32Var(&o.qps, "kube-api-qps", o.qps, "Queries per second to the Kubernetes API.")
	fs.IntVar(&o.burst, "kube-api-burst", o.burst, "Burst of queries to the Kubernetes API.")

	o.detection.AddFlags(fs, &c.Config.Config)
	fs.BoolVar(&c.DryRun, "dry-run", c.DryRun, "Audit mode: mutate no pod; log the decision, emit a Normal WouldRepair Event and count it in consul_cni_repair_dry_run_pod_repairs_total.")
	fs.IntVar(&c.MaxRepairsPerMinute, "max-repairs-per-minute", c.MaxRepairsPerMinute, "Cap on actions in any minute, cluster-wide; pods not of the race are also paced by a token bucket of this rate (burst a tenth of it). Shared between namespaces: while broken pods of other namespaces wait, each namespace takes at most an even share of it (at least 1); a namespace alone takes at most the cap less a tenth (the whole of a cap under 10), so the first pods of another find room at once.")
	fs.IntVar(&c.MaxRepairsPerNodePerMinute, "max-repairs-per-node-per-minute", c.MaxRepairsPerNodePerMinute, "Actions per minute on any one node (fairness) for pods not of the race (sandbox not older than the node's dated CNI readiness).")
	fs.DurationVar(&c.BackoffBase, "backoff-base", c.BackoffBase, "First retry delay of a pod whose action failed or was blocked by a PodDisruptionBudget (doubles each time).")
	fs.DurationVar(&c.BackoffMax, "backoff-max", c.BackoffMax, "Longest retry delay of a pod.")
	fs.IntVar(&c.Workers, "workers", c.Workers, "Concurrent pod workers.")
	fs.DurationVar(&c.Resync, "resync-period", c.Resync, "Informer resync period (a safety net; changes are handled as they happen).")

	fs.BoolVar(&c.NodeReadiness, "node-readiness", c.NodeReadiness, "Label nodes consul.hashicorp.com/cni=ready and remove the startup taint when the CNI DaemonSet pod on them is Ready; remove the label when it is not.")
	fs.StringVar(&c.StartupTaintKey, "startup-taint-key", c.StartupTaintKey, "Key of the startup taint removed (any effect) once the node's CNI is ready.")
	fs.BoolVar(&c.ReaddStartupTaint, "readd-startup-taint", c.ReaddStartupTaint, "Re-add the startup taint when the node's CNI pod is gone or not Ready.")
	fs.StringVar(&o.effect, "startup-taint-effect", o.effect, "Effect of a re-added startup taint: NoSchedule, PreferNoSchedule or NoExecute.")

	fs.BoolVar(&c.LeaderElect, "leader-elect", c.LeaderElect, "Elect a leader with a coordination.k8s.io Lease; only the leader acts.")
	fs.StringVar(&c.LeaseNamespace, "leader-election-namespace", c.LeaseNamespace, "Namespace of the Lease (default: the controller's own, $POD_NAMESPACE or its service account's).")
	fs.StringVar(&c.LeaseName, "leader-election-id", c.LeaseName, "Name of the Lease.")
	fs.DurationVar(&c.LeaseDuration, "leader-election-lease-duration", c.LeaseDuration, "How long a lease is valid without renewal.")
	fs.DurationVar(&c.RenewDeadline, "leader-election-renew-deadline", c.RenewDeadline, "How long the leader retries renewing before giving up.")
	fs.DurationVar(&c.RetryPeriod, "leader-election-retry-period", c.RetryPeriod, "Interval between lease attempts.")
	fs.StringVar(&c.MetricsAddr, "metrics-bind-address", c.MetricsAddr, "Listen address of /metrics (Prometheus); 0 disables.")
	fs.StringVar(&c.HealthAddr, "health-probe-bind-address", c.HealthAddr, "Listen address of /healthz and /readyz; 0 disables.")
	fs.BoolVar(&c.Profiling, "profiling", c.Profiling, "Serve Go profiles (net/http/pprof) under /debug/pprof/ on the metrics address.")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", c.ShutdownTimeout, "Time allowed to stop the HTTP servers on shutdown.")
}

// configFlags maps the keys of repair.ManagerConfig (its field names, as
// the library's errors name them) to the flags that set them: the detection
// flags the audit shares, and the controller's own.
var configFlags = func() map[string]string {
	m := maps.Clone(judge.FlagNames)
	maps.Copy(m, map[string]string{
		"DryRun":                     "dry-run",
		"MaxRepairsPerMinute":        "max-repairs-per-minute",
		"MaxRepairsPerNodePerMinute": "max-repairs-per-node-per-minute",
		"BackoffBase":                "backoff-base", "BackoffMax": "backoff-max",
		"Workers": "workers", "Resync": "resync-period",
		"NodeReadiness": "node-readiness", "StartupTaintKey": "startup-taint-key",
		"ReaddStartupTaint": "readd-startup-taint", "StartupTaintEffect": "startup-taint-effect",
		"LeaderElect": "leader-elect", "LeaseNamespace": "leader-election-namespace", "LeaseName": "leader-election-id",
		"LeaseDuration": "leader-election-lease-duration", "RenewDeadline": "leader-election-renew-deadline",
		"RetryPeriod": "leader-election-retry-period",
		"MetricsAddr": "metrics-bind-address", "HealthAddr": "health-probe-bind-address",
		"ShutdownTimeout": "shutdown-timeout", "Profiling": "profiling",
	})
	return m
}()

// Validate copies the string flags into the config and validates it; the
// error names the flag.
func (o *options) Validate() error {
	o.detection.Apply(&o.cfg.Config.Config)
	o.cfg.StartupTaintEffect = corev1.TaintEffect(o.effect)
	if o.qps <= 0 || o.burst < 1 {
		return fmt.Errorf("--kube-api-qps/--kube-api-burst: %v/%d must be positive", o.qps, o.burst)
	}
	return cmdutil.FlagError(o.cfg.Validate(), configFlags)
}

// restConfig: --kubeconfig, else $KUBECONFIG, else in-cluster.
func (o *options) restConfig() (*rest.Config, error) {
	cfg, err := cmdutil.RESTConfig(o.kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = o.qps, o.burst
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cfg.UserAgent = repair.Component + "/" + version.Version
	return cfg, nil
}

// pluginName is the name under which kubectl finds the command as the plugin
// "kubectl consul-cni" (a link to or copy of repair).
const pluginName = "kubectl-consul_cni"

// subcommand tells whether argv runs the audit, with the name to print and
// its arguments; invoked as pluginName, audit is the only subcommand.
func subcommand(argv []string) (audit bool, name string, args []string, err error) {
	plugin := strings.TrimSuffix(filepath.Base(argv[0]), ".exe") == pluginName
	args = argv[1:]
	if len(args) > 0 && args[0] == "audit" {
		if plugin {
			return true, "kubectl consul-cni audit", args[1:], nil
		}
		return true, "repair audit", args[1:], nil
	}
	if plugin {
		return false, "kubectl consul-cni", args, errors.New("usage: kubectl consul-cni audit [flags]")
	}
	return false, "repair", args, nil
}

// pluginHelp answers the plugin's own --help and --version (exit 0, as
// kubectl plugins do); done is false for anything else.
func pluginHelp(argv []string, stdout, stderr io.Writer) (done bool) {
	if strings.TrimSuffix(filepath.Base(argv[0]), ".exe") != pluginName || len(argv) != 2 {
		return false
	}
	switch argv[1] {
	case "-h", "--help", "help":
		fmt.Fprint(stderr, pluginUsage)
		return true
	case "--version":
		fmt.Fprintln(stdout, version.String("kubectl consul-cni"))
		return true
	}
	return false
}

const pluginUsage = `Usage: kubectl consul-cni audit [flags]

Commands:
  audit       Print the injected pods that run outside the mesh now, judged as
              the controller judges them (kubectl consul-cni audit --help).

Flags:
  -h, --help      Print this help.
      --version   Print the version and exit.
`

func main() {
	if pluginHelp(os.Args, os.Stdout, os.Stderr) {
		os.Exit(0)
	}
	isAudit, name, args, err := subcommand(os.Args)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(cmdutil.ExitUsage)
	}
	if isAudit {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
		code := audit.Main(ctx, name, args, os.Stdout, os.Stderr, audit.DefaultClient)
		stop()
		os.Exit(code)
	}
	if err := run(args); err != nil {
		var u usageError
		if errors.As(err, &u) {
			os.Exit(u.code)
		}
		fmt.Fprintln(os.Stderr, "repair:", err)
		os.Exit(1)
	}
}

// usageError ends the command before it starts with code: 0 after --help
// or --version, cmdutil.ExitUsage after a bad command line (already printed).
type usageError struct{ code int }

func (e usageError) Error() string { return fmt.Sprintf("exit %d", e.code) }

// defaultGCPercent replaces Go's 100 when GOGC is not set: the controller
// allocates little once its caches are filled, so a tighter heap goal costs
// little CPU and keeps the resident set close to what the caches hold.
const defaultGCPercent = 50

func run(args []string) error {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(defaultGCPercent)
	}
	fs := pflag.NewFlagSet("repair", pflag.ContinueOnError)
	fs.SortFlags = false
	o := newOptions()
	o.AddFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(os.Stderr, "Usage: repair [flags]\n       repair audit [flags]   (repair audit --help)\n\n%s\n\nFlags:\n%s", strings.TrimSpace(usageText), fs.FlagUsages())
	}
	if code, done := cmdutil.Parse(fs, "repair", args, cmdutil.NewLogging()); done {
		return usageError{code}
	}
	if fs.NArg() != 0 {
		cmdutil.UsageError(os.Stderr, "repair", fmt.Errorf("unexpected arguments %q", fs.Args()))
		return usageError{cmdutil.ExitUsage}
	}
	if err := o.Validate(); err != nil {
		cmdutil.UsageError(os.Stderr, "repair", err)
		return usageError{cmdutil.ExitUsage}
	}
	cfg, err := o.restConfig()
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	logger := klog.Background().WithName("repair")
	ctx = klog.NewContext(ctx, logger)
	m, err := repair.NewManager(client, o.cfg)
	if err != nil {
		return cmdutil.FlagError(err, configFlags)
	}
	logger.Info("Starting", "version", version.Version, "metrics", m.MetricsAddr(), "health", m.HealthAddr(),
		"leaderElect", o.cfg.LeaderElect, "action", o.cfg.Action, "dryRun", o.cfg.DryRun, "gate", o.cfg.Gate)
	start := time.Now()
	err = m.Run(ctx)
	klog.Flush()
	logger.Info("Stopped", "after", time.Since(start).Round(time.Second), "err", err)
	return err
}

const usageText = `
Finds Consul transparent-proxy pods that started outside the mesh because their
sandbox was created before the consul-cni plugin was in the node's CNI chain,
and gets them recreated by their owner; marks nodes ready for injected pods
once the CNI DaemonSet pod on them is Ready. Endpoints: /metrics on
--metrics-bind-address; /healthz and /readyz on --health-probe-bind-address.
The Go garbage collector runs with GOGC=50 unless GOGC is set; GOMEMLIMIT is
honoured.`
