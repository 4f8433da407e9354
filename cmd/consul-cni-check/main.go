// Command consul-cni-check is the init-container check of transparent-proxy
// pods: it waits for the pod's transparent-proxy-status annotation to read
// complete, optionally proves the redirection with a real connection, and
// otherwise writes a termination message and exits with the code the repair
// controller watches (88 by default).
package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/cmdutil"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/initcheck"
)

type options struct {
	AnnotationsFile string
	Timeout         time.Duration
	Interval        time.Duration
	Probe           bool
	ProbeAddresses  []string
	ProbeTimeout    time.Duration
	OutboundPort    uint16
	ExitCode        int
	TerminationLog  string
	Kubeconfig      string
	PodName         string
	PodNamespace    string
	API             string

	probeTargets []netip.AddrPort
}

func (o *options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.AnnotationsFile, "annotations-file", "/consul/podinfo/annotations", "downward-API file of the pod's metadata.annotations (empty: do not use one)")
	fs.DurationVar(&o.Timeout, "timeout", 2*time.Minute, "how long to wait for transparent-proxy-status to read complete")
	fs.DurationVar(&o.Interval, "interval", time.Second, "how often to look again (the file is also watched)")
	fs.BoolVar(&o.Probe, "probe", false, "also prove the redirection: listen on the outbound port, dial a non-local address, confirm the connection arrived redirected")
	fs.StringSliceVar(&o.ProbeAddresses, "probe-address", []string{initcheck.DefaultProbeAddress.String()}, "address:port the probe dials (repeatable; IPv6 only for dual-stack pods)")
	fs.DurationVar(&o.ProbeTimeout, "probe-timeout", 5*time.Second, "how long a probe connection may take")
	fs.Uint16Var(&o.OutboundPort, "outbound-port", 0, "the proxy's outbound port (default: ProxyOutboundPort of redirect-traffic-config, else 15001)")
	fs.IntVar(&o.ExitCode, "exit-code", annotations.InitCheckExitCode, "exit code when traffic is not redirected (the repair controller's --init-exit-code)")
	fs.StringVar(&o.TerminationLog, "termination-log", "/dev/termination-log", "where the failure message is written (empty: nowhere)")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig for API mode (default: $KUBECONFIG, else in-cluster)")
	fs.StringVar(&o.PodName, "pod-name", os.Getenv("POD_NAME"), "the pod's name for API mode (default $POD_NAME)")
	fs.StringVar(&o.PodNamespace, "pod-namespace", os.Getenv("POD_NAMESPACE"), "the pod's namespace for API mode (default $POD_NAMESPACE)")
	fs.StringVar(&o.API, "api", "auto", "read the pod from the API: auto (when the pod's name and namespace are known and a client configuration exists), true, false")
}

func (o *options) Validate() error {
	if o.Timeout <= 0 {
		return fmt.Errorf("--timeout: %s is not positive", o.Timeout)
	}
	if o.Interval <= 0 {
		return fmt.Errorf("--interval: %s is not positive", o.Interval)
	}
	if o.ProbeTimeout <= 0 {
		return fmt.Errorf("--probe-timeout: %s is not positive", o.ProbeTimeout)
	}
	if o.ExitCode <= 1 || o.ExitCode > 255 {
		return fmt.Errorf("--exit-code: %d must be within 2..255 (0 and 1 mean success and a check that could not run)", o.ExitCode)
	}
	switch o.API {
	case "auto", "true", "false":
	default:
		return fmt.Errorf("--api: %q is not auto, true or false", o.API)
	}
	if o.API == "true" && (o.PodName == "" || o.PodNamespace == "") {
		return errors.New("--api=true needs --pod-name and --pod-namespace (or $POD_NAME and $POD_NAMESPACE)")
	}
	if o.AnnotationsFile == "" && o.API == "false" {
		return errors.New("no source of annotations: --annotations-file is empty and --api=false")
	}
	o.probeTargets = nil
	for _, a := range o.ProbeAddresses {
		ap, err := netip.ParseAddrPort(a)
		if err != nil {
			return fmt.Errorf("--probe-address: %q is not address:port: %v", a, err)
		}
		o.probeTargets = append(o.probeTargets, ap)
	}
	return nil
}

func main() {
	code := run(os.Args[1:])
	cmdutil.Flush()
	os.Exit(code)
}

const command = "consul-cni-check"

func run(args []string) int {
	o := &options{}
	fs := pflag.NewFlagSet(command, pflag.ContinueOnError)
	o.AddFlags(fs)
	if code, done := cmdutil.Parse(fs, command, args, cmdutil.NewLogging()); done {
		return code
	}
	if fs.NArg() != 0 {
		cmdutil.UsageError(os.Stderr, command, fmt.Errorf("unexpected arguments %q", fs.Args()))
		return cmdutil.ExitUsage
	}
	if err := o.Validate(); err != nil {
		cmdutil.UsageError(os.Stderr, command, err)
		return cmdutil.ExitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	logger := klog.Background().WithName("check")
	ctx = klog.NewContext(ctx, logger)

	cfg := initcheck.Config{
		AnnotationsFile: o.AnnotationsFile,
		PodName:         o.PodName,
		PodNamespace:    o.PodNamespace,
		Timeout:         o.Timeout,
		Interval:        o.Interval,
		Probe:           o.Probe,
		ProbeTargets:    o.probeTargets,
		ProbeTimeout:    o.ProbeTimeout,
		OutboundPort:    o.OutboundPort,
		UID:             os.Geteuid(),
		ExitCode:        o.ExitCode,
		TerminationLog:  o.TerminationLog,
	}
	if o.API != "false" && o.PodName != "" && o.PodNamespace != "" {
		rc, err := cmdutil.RESTConfig(o.Kubeconfig)
		if err == nil {
			cfg.Client, err = kubernetes.NewForConfig(rc)
		}
		switch {
		case err != nil && o.API == "true":
			fmt.Fprintf(os.Stderr, "consul-cni-check: API client: %v\n", err)
			return initcheck.ExitConfig
		case err != nil:
			logger.V(1).Info("No API client; using the annotations file only", "err", err.Error())
		}
	}
	r := initcheck.Run(ctx, cfg)
	if r.Code == initcheck.ExitOK {
		logger.Info(r.Message)
	} else {
		fmt.Fprintln(os.Stderr, r.Message)
	}
	return r.Code
}
