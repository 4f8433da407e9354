// Command consul-cni-installer runs in the CNI DaemonSet: it installs the
// consul-cni plugin on its node and keeps it last in the node's CNI chain.
//
//	consul-cni-installer [run]     install and keep the chain (default)
//	consul-cni-installer ready     exit 0 only when the plugin is really chained and the run process
//	                               watches the CNI directories (readiness probe)
//	consul-cni-installer uninstall remove the plugin, its chain entries and files
//	                               (--wait: and keep it removed until SIGTERM)
//	consul-cni-installer uninstalled exit 0 only when nothing of the plugin is left (probe of uninstall --wait)
//	consul-cni-installer uninstall-all switch the installer DaemonSet to removers and wait until
//	                               every node is clean (the chart's pre-delete hook)
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cmdutil"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/credentials"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/leave"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/watchcheck"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/uninstallall"
)

type options struct {
	BinDir       string
	NetDir       string
	HostBinDir   string
	HostNetDir   string
	PluginBinary string
	Kubeconfig   string
	LogLevel     string
	Multus       bool
	Resync       time.Duration
	MetricsAddr  string
	// ExpectInstalled makes uninstall fail when nothing of ours was found.
	ExpectInstalled bool
	// Wait keeps uninstall running: the node is kept clean until SIGTERM.
	Wait bool
	// ExcludeNamespaces is the plugin's exclude_namespaces (unset: the
	// plugin's default, kube-system).
	ExcludeNamespaces []string
	// Backend is the plugin's backend (empty: the plugin's default,
	// iptables).
	Backend string
	// Namespace, DaemonSet and Timeout of uninstall-all.
	Namespace, DaemonSet string
	Timeout              time.Duration
}

func (o *options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.BinDir, "cni-bin-dir", "/host/opt/cni/bin", "the host's CNI bin directory as mounted in this container")
	fs.StringVar(&o.NetDir, "cni-net-dir", "/host/etc/cni/net.d", "the host's CNI configuration directory as mounted in this container")
	fs.StringVar(&o.HostBinDir, "host-cni-bin-dir", "/opt/cni/bin", "the CNI bin directory on the host (written into the chain entry as cni_bin_dir)")
	fs.StringVar(&o.HostNetDir, "host-cni-net-dir", "/etc/cni/net.d", "the CNI configuration directory on the host (written into the chain entry as cni_net_dir and used for the kubeconfig's tokenFile)")
	fs.StringVar(&o.PluginBinary, "plugin-binary", "", "the consul-cni executable to install (default: consul-cni next to this executable)")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig of the installer (default: $KUBECONFIG, else in-cluster); the plugin's kubeconfig is derived from it")
	fs.StringVar(&o.LogLevel, "log-level", "info", "the plugin's log level (log_level in the chain entry): "+strings.Join(cniconf.LogLevels, ", "))
	fs.BoolVar(&o.Multus, "multus", false, "the plugin runs as a Multus delegate (multus in the chain entry)")
	fs.DurationVar(&o.Resync, "resync", 30*time.Second, "period of full passes besides file events; also bounds the age of the plugin's token copy")
	fs.StringVar(&o.MetricsAddr, "metrics-bind-address", "", "serve Prometheus metrics on this address (for example :9090); empty disables")
	fs.BoolVar(&o.ExpectInstalled, "expect-installed", false, "uninstall: fail when nothing of consul-cni was found on the node")
	fs.StringSliceVar(&o.ExcludeNamespaces, "exclude-namespaces", nil, "the plugin's exclude_namespaces: namespaces whose pods it passes through without any API call (unset: the plugin's default, kube-system)")
	fs.StringVar(&o.Backend, "backend", "", "the plugin's backend (backend in the chain entry): "+strings.Join(cniconf.Backends, " or ")+
		"; empty leaves the key out (the plugin's default, iptables). Changing it and rolling the DaemonSet out switches every new pod sandbox")
	fs.StringVar(&o.Namespace, "namespace", "", "uninstall-all: namespace of the installer DaemonSet")
	fs.StringVar(&o.DaemonSet, "daemonset", "consul-cni", "uninstall-all: name of the installer DaemonSet")
	fs.DurationVar(&o.Timeout, "timeout", 10*time.Minute, "uninstall-all: fail, naming the nodes not clean, when they are not all clean by then")
	fs.BoolVar(&o.Wait, "wait", false, "uninstall: keep running and keep the node clean (every --resync) until SIGTERM; readiness: the uninstalled subcommand")
}

// configFlags maps the keys of install.Config (its field names, as the
// library's errors name them) to the flags that set them.
var configFlags = map[string]string{
	"BinDir": "cni-bin-dir", "NetDir": "cni-net-dir", "HostBinDir": "host-cni-bin-dir", "HostNetDir": "host-cni-net-dir",
	"PluginBinary": "plugin-binary", "LogLevel": "log-level", "Multus": "multus",
	"ExcludeNamespaces": "exclude-namespaces", "Resync": "resync", "Backend": "backend",
}

func (o *options) Validate() error {
	cfg := o.config()
	if err := cfg.Validate(); err != nil {
		return cmdutil.FlagError(err, configFlags)
	}
	for _, f := range []struct{ name, v string }{{"namespace", o.Namespace}, {"daemonset", o.DaemonSet}} {
		if f.v == "" {
			continue
		}
		if errs := validation.IsDNS1123Subdomain(f.v); len(errs) > 0 {
			return fmt.Errorf("--%s: %q is not a valid name: %s", f.name, f.v, strings.Join(errs, "; "))
		}
	}
	if o.Timeout <= 0 {
		return fmt.Errorf("--timeout: %s is not positive", o.Timeout)
	}
	if o.Resync < time.Second {
		return fmt.Errorf("--resync: %s is shorter than 1s", o.Resync)
	}
	if o.MetricsAddr != "" {
		if _, _, err := net.SplitHostPort(o.MetricsAddr); err != nil {
			return fmt.Errorf("--metrics-bind-address: %q: %v", o.MetricsAddr, err)
		}
	}
	if o.PluginBinary == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("--plugin-binary not set and this executable's path is unknown: %v", err)
		}
		o.PluginBinary = filepath.Join(filepath.Dir(exe), cniconf.PluginType)
	}
	return nil
}

func (o *options) config() install.Config {
	return install.Config{
		BinDir: o.BinDir, NetDir: o.NetDir, HostBinDir: o.HostBinDir, HostNetDir: o.HostNetDir,
		PluginBinary: o.PluginBinary, LogLevel: o.LogLevel, Multus: o.Multus, Resync: o.Resync,
		ExcludeNamespaces: o.ExcludeNamespaces, Backend: o.Backend,
	}
}

func main() {
	code := run(os.Args[1:])
	cmdutil.Flush()
	os.Exit(code)
}

const command = "consul-cni-installer"

func run(args []string) int {
	o := &options{}
	fs := pflag.NewFlagSet(command, pflag.ContinueOnError)
	o.AddFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(os.Stderr, "Usage: consul-cni-installer [run|ready|uninstall|uninstalled|uninstall-all] [flags]\n\n%s", fs.FlagUsages())
	}
	if code, done := cmdutil.Parse(fs, command, args, cmdutil.NewLogging()); done {
		return code
	}
	sub := "run"
	switch rest := fs.Args(); len(rest) {
	case 0:
	case 1:
		sub = rest[0]
	default:
		cmdutil.UsageError(os.Stderr, command, fmt.Errorf("one subcommand expected, got %q", strings.Join(rest, " ")))
		return cmdutil.ExitUsage
	}
	if err := o.Validate(); err != nil {
		cmdutil.UsageError(os.Stderr, command, err)
		return cmdutil.ExitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	logger := klog.Background().WithName("installer")
	ctx = klog.NewContext(ctx, logger)

	switch sub {
	case "run":
		if err := runInstaller(ctx, o); err != nil {
			logger.Error(err, "Installer failed")
			return 1
		}
		return 0
	case "ready":
		return ready(o, os.Stdout)
	case "uninstall":
		return uninstall(ctx, o)
	case "uninstalled":
		return uninstalled(o)
	case "uninstall-all":
		return uninstallAll(ctx, o)
	default:
		cmdutil.UsageError(os.Stderr, command, fmt.Errorf("unknown subcommand %q (want run, ready, uninstall, uninstalled or uninstall-all)", sub))
		return cmdutil.ExitUsage
	}
}

// procRoot is where ready looks for the installer's run process and its
// inotify watches; tests point it at a fake.
var procRoot = "/proc"

// ready is the readiness probe: exit 0 only when the plugin is chained and
// the installer's run process beside the probe watches the CNI
// directories; otherwise exit 1 saying why.
func ready(o *options, out io.Writer) int {
	cfg := o.config()
	// The probe only reads files; it checks that the kubeconfig and
	// token the run command writes are present.
	cfg.Client = &credentials.Source{}
	in, err := install.New(cfg)
	if err == nil {
		err = in.Ready(procRoot)
	}
	switch {
	case errors.Is(err, watchcheck.ErrNoInstallerProcess):
		fmt.Fprintln(out, "ready: consul-cni is installed and last in the runtime's CNI chain (no installer run process visible: its directory watch not checked)")
		return 0
	case err != nil:
		fmt.Fprintf(out, "not ready: %v\n", err)
		return 1
	}
	fmt.Fprintln(out, "ready: consul-cni is installed and last in the runtime's CNI chain, and the installer watches its directories")
	return 0
}

// uninstall removes the plugin from the node; exit 1 when that is not
// complete, when the directories do not exist, or when nothing was found
// and --expect-installed is set.
func uninstall(ctx context.Context, o *options) int {
	logger := klog.FromContext(ctx)
	in, err := install.New(o.config())
	if err != nil {
		fmt.Fprintf(os.Stderr, "consul-cni-installer: %v\n", err)
		return 2
	}
	if o.Wait {
		logger.Info("Removing consul-cni from the node and keeping it removed until stopped", "netDir", o.NetDir, "binDir", o.BinDir)
		in.KeepUninstalled(ctx, nil)
		return 0
	}
	res, err := in.Uninstall(ctx)
	if err != nil {
		fmt.Fprintf(os.Stderr, "consul-cni-installer uninstall: %v\n", err)
		return 1
	}
	if !res.Found() {
		if o.ExpectInstalled {
			fmt.Fprintf(os.Stderr, "consul-cni-installer uninstall: nothing of consul-cni found in %s or %s (--expect-installed)\n", o.NetDir, o.BinDir)
			return 1
		}
		logger.Info("Nothing of consul-cni found on the node", "netDir", o.NetDir, "binDir", o.BinDir)
		return 0
	}
	logger.Info("Uninstalled consul-cni from the node", "removed", res.Removed, "keptBinary", res.KeptBinary)
	return 0
}

// uninstalled is the readiness probe of uninstall --wait: exit 0 only when
// nothing of the plugin is left on the node.
func uninstalled(o *options) int {
	in, err := install.New(o.config())
	if err != nil {
		fmt.Fprintf(os.Stderr, "consul-cni-installer: %v\n", err)
		return 2
	}
	left, err := in.Leftovers()
	if err != nil {
		fmt.Printf("not uninstalled: %v\n", err)
		return 1
	}
	if len(left) > 0 {
		fmt.Printf("not uninstalled: left on the node: %s\n", strings.Join(left, ", "))
		return 1
	}
	fmt.Println("uninstalled: nothing of consul-cni is left on the node")
	return 0
}

// uninstallAll switches the installer DaemonSet to removers and waits
// until every node is clean; exit 1, naming what is not clean, on --timeout.
func uninstallAll(ctx context.Context, o *options) int {
	if o.Namespace == "" || o.DaemonSet == "" {
		cmdutil.UsageError(os.Stderr, command, fmt.Errorf("uninstall-all: --namespace and --daemonset are required"))
		return cmdutil.ExitUsage
	}
	rc, err := cmdutil.RESTConfig(o.Kubeconfig)
	if err != nil {
		fmt.Fprintf(os.Stderr, "consul-cni-installer uninstall-all: client configuration: %v\n", err)
		return 1
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		fmt.Fprintf(os.Stderr, "consul-cni-installer uninstall-all: %v\n", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	err = uninstallall.Run(ctx, client, uninstallall.Options{Namespace: o.Namespace, DaemonSet: o.DaemonSet, HostNetDir: o.HostNetDir})
	if err != nil {
		fmt.Fprintf(os.Stderr, "consul-cni-installer uninstall-all: %v\n", err)
		return 1
	}
	return 0
}

// podAlive asks the API whether the pod another installer's token is bound
// to still runs (the installer may get pods).
func podAlive(c kubernetes.Interface) credentials.PodAlive {
	return func(ctx context.Context, ns, name, uid string) (bool, error) {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		p, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		return string(p.UID) == uid && p.DeletionTimestamp == nil, nil
	}
}

// podGone asks the API whether a pod no longer exists (not found, or
// another pod of that name); a pod being deleted still exists.
func podGone(c kubernetes.Interface) install.PodGone {
	return func(ctx context.Context, ns, name, uid string) (bool, error) {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		p, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		return string(p.UID) != uid, nil
	}
}

func runInstaller(ctx context.Context, o *options) error {
	logger := klog.FromContext(ctx)
	rc, err := cmdutil.RESTConfig(o.Kubeconfig)
	if err != nil {
		return fmt.Errorf("client configuration: %w", err)
	}
	src, err := credentials.FromREST(rc)
	if err != nil {
		return err
	}
	cfg := o.config()
	cfg.Client = &src
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	cfg.PodAlive = podAlive(client)
	cfg.PodGone = podGone(client)
	if ns, pod, ok := leave.PodOf(src); ok {
		// The watch outlives SIGTERM: the decision may wait for its events.
		w := leave.StartWatch(context.WithoutCancel(ctx), client, ns, pod)
		cfg.Decide = w.Decider(leave.APIDecider(client, ns, pod))
	} else {
		logger.Info("Not running in a pod (no pod-bound token): on SIGTERM the installation stays in place")
	}
	if o.MetricsAddr != "" {
		m, addr, stop, err := serveMetrics(ctx, o.MetricsAddr)
		if err != nil {
			return err
		}
		defer stop()
		cfg.Metrics = m
		logger.Info("Serving metrics", "address", addr.String())
	}
	in, err := install.New(cfg)
	if err != nil {
		return err
	}
	logger.Info("Starting", "binDir", o.BinDir, "netDir", o.NetDir, "hostNetDir", o.HostNetDir, "plugin", o.PluginBinary, "server", src.Server)
	return in.Run(ctx, nil)
}
