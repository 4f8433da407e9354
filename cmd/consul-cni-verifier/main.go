// Command consul-cni-verifier is the node verifier (pkg/verify): on its node
// it reads the pod sandboxes from the container runtime's CRI socket, looks
// into the network namespace of each injected pod's current sandbox for
// Consul's redirect rules, and publishes what it finds: the pod condition
// consul.hashicorp.com/RedirectVerified, a Warning Event on a pod found
// without rules, the Node condition consul.hashicorp.com/CNIVerified and
// the gauges consul_cni_verifier_*.
//
// It runs as a container of the installer DaemonSet, and as a DaemonSet of
// its own beside consul-k8s's CNI DaemonSet (repair-only profile). It
// needs the node's root file system (read-only, for the runtime's netns
// paths and the host's iptables tools), the CRI socket, CAP_SYS_ADMIN (to
// enter network namespaces), CAP_NET_ADMIN and CAP_NET_RAW (to read the
// packet filter) and CAP_SYS_CHROOT (to run the host's tools).
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cmdutil"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/cri"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/verify"
)

const command = "consul-cni-verifier"

type options struct {
	CRISocket         string
	HostRoot          string
	NodeName          string
	CNINetDir         string
	ExcludeNamespaces []string
	Interval, Resync  time.Duration
	MetricsAddr       string
	Kubeconfig        string
}

func (o *options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.CRISocket, "cri-socket", "/host/run/containerd/containerd.sock",
		"the container runtime's CRI socket as seen by this process (CRI-O: /host/var/run/crio/crio.sock)")
	fs.StringVar(&o.HostRoot, "host-root", "/host", "where the node's root file system is mounted (\"/\" when running on the host): prefixes the runtime's netns paths, and the host's iptables tools run chrooted into it")
	fs.StringVar(&o.NodeName, "node-name", "", "this node's name (default $NODE_NAME)")
	fs.StringVar(&o.CNINetDir, "cni-net-dir", "/host/etc/cni/net.d", "the node's CNI configuration directory as seen by this process, to check that consul-cni ends the runtime's chain; empty skips the check")
	fs.StringSliceVar(&o.ExcludeNamespaces, "exclude-namespaces", []string{"kube-system"}, "the plugin's exclude_namespaces: pods there are never judged")
	fs.DurationVar(&o.Interval, "interval", 2*time.Second, "period of a pass: list the sandboxes and read each namespace's fingerprint (a sandbox is inspected when it appears or its rules change)")
	fs.DurationVar(&o.Resync, "resync", 5*time.Minute, "inspect an unchanged sandbox again after this long")
	fs.StringVar(&o.MetricsAddr, "metrics-bind-address", "", "serve Prometheus metrics (/metrics) and /healthz on this address; empty disables")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig (default: $KUBECONFIG, else in-cluster)")
}

// Validate checks the options and that no argument is left over.
func (o *options) Validate(args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("no arguments expected, got %q", strings.Join(args, " "))
	}
	if o.NodeName == "" {
		return errors.New("--node-name: empty (set it or $NODE_NAME, from the downward API's spec.nodeName)")
	}
	if errs := validation.IsDNS1123Subdomain(o.NodeName); len(errs) > 0 {
		return fmt.Errorf("--node-name: %q is not a valid node name: %s", o.NodeName, strings.Join(errs, "; "))
	}
	if !strings.HasPrefix(strings.TrimPrefix(o.CRISocket, "unix://"), "/") {
		return fmt.Errorf("--cri-socket: %q is not an absolute path", o.CRISocket)
	}
	if !strings.HasPrefix(o.HostRoot, "/") {
		return fmt.Errorf("--host-root: %q is not an absolute path", o.HostRoot)
	}
	if o.Interval < 100*time.Millisecond {
		return fmt.Errorf("--interval: %s is shorter than 100ms", o.Interval)
	}
	if o.Resync < o.Interval {
		return fmt.Errorf("--resync: %s is shorter than --interval %s", o.Resync, o.Interval)
	}
	if o.MetricsAddr != "" {
		if _, _, err := net.SplitHostPort(o.MetricsAddr); err != nil {
			return fmt.Errorf("--metrics-bind-address: %q: %v", o.MetricsAddr, err)
		}
	}
	return nil
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := run(ctx, os.Args[1:])
	stop()
	cmdutil.Flush()
	os.Exit(code)
}

func run(ctx context.Context, args []string) int {
	o := &options{}
	fs := pflag.NewFlagSet(command, pflag.ContinueOnError)
	o.AddFlags(fs)
	fs.Usage = func() { fmt.Fprintf(os.Stderr, "Usage: %s [flags]\n\n%s", command, fs.FlagUsages()) }
	if code, done := cmdutil.Parse(fs, command, args, cmdutil.NewLogging()); done {
		return code
	}
	if o.NodeName == "" {
		o.NodeName = os.Getenv("NODE_NAME")
	}
	if err := o.Validate(fs.Args()); err != nil {
		cmdutil.UsageError(os.Stderr, command, err)
		return cmdutil.ExitUsage
	}
	logger := klog.Background().WithName("verifier")
	if err := runVerifier(klog.NewContext(ctx, logger), o); err != nil {
		logger.Error(err, "Verifier failed")
		return 1
	}
	return 0
}

func runVerifier(ctx context.Context, o *options) error {
	logger := klog.FromContext(ctx)
	rc, err := cmdutil.RESTConfig(o.Kubeconfig)
	if err != nil {
		return fmt.Errorf("client configuration: %w", err)
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	// The runtime may not answer yet (or restart): passes fail until it
	// does, the process stays.
	rt := &cri.Lazy{Endpoint: o.CRISocket}
	defer rt.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := verify.NewMetrics(reg, o.NodeName)
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: verify.Component, Host: o.NodeName})
	reporter := verify.NewKubeReporter(client, o.NodeName, recorder, metrics)
	cfg := verify.Config{Runtime: rt, Inspector: verify.Kernel{Root: o.HostRoot}, Reporter: reporter, Root: o.HostRoot,
		ExcludeNamespaces: o.ExcludeNamespaces, Interval: o.Interval, Resync: o.Resync}
	if o.CNINetDir != "" {
		cfg.Chain = verify.ChainIn(o.CNINetDir)
	}
	v, err := verify.New(cfg)
	if err != nil {
		return err
	}
	var lastPass atomic.Int64
	if o.MetricsAddr != "" {
		stopServe, err := serve(ctx, o.MetricsAddr, reg, &lastPass, 3*o.Interval+30*time.Second)
		if err != nil {
			return err
		}
		defer stopServe()
	}
	logger.Info("Starting", "node", o.NodeName, "runtime", rt.Version(ctx), "criSocket", o.CRISocket, "hostRoot", o.HostRoot, "interval", o.Interval)
	go reporter.Run(ctx)
	v.OnPass = func(error) { lastPass.Store(time.Now().UnixNano()) }
	v.Run(ctx)
	return nil
}

// serve serves /metrics and /healthz: healthy while the loop makes passes,
// completed or not (a restart does not bring a runtime that does not
// answer; a pass that hangs makes it unhealthy).
func serve(ctx context.Context, addr string, reg *prometheus.Registry, lastPass *atomic.Int64, stale time.Duration) (func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-bind-address %s: %w", addr, err)
	}
	start := time.Now()
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		last := time.Unix(0, lastPass.Load())
		if lastPass.Load() == 0 {
			last = start
		}
		if age := time.Since(last); age > stale {
			http.Error(w, fmt.Sprintf("no pass for %s", age.Round(time.Second)), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.FromContext(ctx).Error(err, "Metrics server stopped")
		}
	}()
	return func() { _ = srv.Close() }, nil
}
