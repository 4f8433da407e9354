// Package initcheck is the init-container check: it waits for the pod's own
// transparent-proxy-status to read complete (written by the consul-cni
// plugin once the redirect rules are in the pod's network namespace),
// optionally proves the redirection with a real connection, and otherwise
// fails with a termination message and the distinctive exit code the repair
// controller watches (annotations.InitCheckExitCode). It needs no privilege.
package initcheck

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
)

// Exit codes besides Config.ExitCode.
const (
	ExitOK = 0
	// ExitConfig is a check that could not run as configured (bad flags, no
	// source of annotations, a probe that cannot be trusted as this UID).
	// It is deliberately not the code the controller acts on.
	ExitConfig = 1
)

// DefaultProbeAddress is dialed by the traffic probe unless told
// otherwise: a link-local address no pod talks to, on an unremarkable port.
var DefaultProbeAddress = netip.MustParseAddrPort("169.254.7.127:15002")

// Config is what the check works with.
type Config struct {
	// AnnotationsFile is a downward-API file of metadata.annotations; empty
	// when not used.
	AnnotationsFile string
	// Client, PodNamespace and PodName enable reading the pod from the API
	// (its token must be allowed to get its own pod).
	Client       kubernetes.Interface
	PodNamespace string
	PodName      string

	Timeout  time.Duration
	Interval time.Duration

	// Probe enables the traffic probe once the status is complete.
	Probe        bool
	ProbeTargets []netip.AddrPort
	ProbeTimeout time.Duration
	// OutboundPort overrides the port from redirect-traffic-config.
	OutboundPort uint16
	// UID is the UID the probe's connections are made as.
	UID int

	ExitCode       int
	TerminationLog string
}

// Result is the check's verdict.
type Result struct {
	Code    int
	Message string
}

// Run performs the check. On failure it writes the message to
// TerminationLog (when set) before returning.
func Run(ctx context.Context, cfg Config) Result {
	r := run(ctx, cfg)
	if r.Code != ExitOK && cfg.TerminationLog != "" {
		msg := r.Message
		if len(msg) > 4000 { // kubelet keeps 4096 bytes
			msg = msg[:4000]
		}
		if err := os.WriteFile(cfg.TerminationLog, []byte(msg+"\n"), 0o644); err != nil {
			klog.FromContext(ctx).Error(err, "Cannot write the termination message", "path", cfg.TerminationLog)
		}
	}
	return r
}

// checker holds the configuration of one run, defaults applied.
type checker struct {
	cfg Config
	log klog.Logger
}

// bypassed is the verdict the repair controller acts on (cfg.ExitCode): the
// pod's traffic bypasses the proxy.
func (c *checker) bypassed(format string, a ...any) Result {
	return Result{Code: c.cfg.ExitCode, Message: fmt.Sprintf(format, a...)}
}

// undecided is a check that cannot judge (ExitConfig): never the
// controller's exit code.
func (c *checker) undecided(format string, a ...any) Result {
	return Result{Code: ExitConfig, Message: fmt.Sprintf(format, a...)}
}

func run(ctx context.Context, cfg Config) Result {
	if cfg.ExitCode == 0 {
		cfg.ExitCode = annotations.InitCheckExitCode
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.ProbeTimeout <= 0 {
		cfg.ProbeTimeout = 5 * time.Second
	}
	c := &checker{cfg: cfg, log: klog.FromContext(ctx)}
	anns, status, verdict := c.waitComplete(ctx)
	if verdict != nil {
		return *verdict
	}
	if !cfg.Probe {
		return Result{Code: ExitOK, Message: fmt.Sprintf("consul-cni-check: %s is %q", annotations.KeyTransparentProxyStatus, status)}
	}
	return c.probe(ctx, anns, status)
}

// sources are where the pod's annotations are read from, in order.
func (c *checker) sources() []source {
	var sources []source
	if c.cfg.AnnotationsFile != "" {
		sources = append(sources, &fileSource{path: c.cfg.AnnotationsFile})
	}
	if c.cfg.Client != nil && c.cfg.PodName != "" && c.cfg.PodNamespace != "" {
		sources = append(sources, &apiSource{client: c.cfg.Client, ns: c.cfg.PodNamespace, pod: c.cfg.PodName})
	}
	return sources
}

// waitComplete is the first phase: it reads the pod's annotations until
// transparent-proxy-status is complete and returns them with the status, or
// a verdict when it is not complete within cfg.Timeout or cannot be read.
func (c *checker) waitComplete(ctx context.Context) (map[string]string, string, *Result) {
	cfg := c.cfg
	sources := c.sources()
	if len(sources) == 0 {
		r := c.undecided("consul-cni-check: no source for the pod's annotations (give --annotations-file, or the pod's name and namespace with API access)")
		return nil, "", &r
	}

	wake := make(chan struct{}, 1)
	if cfg.AnnotationsFile != "" {
		if stop, err := watchDir(filepath.Dir(cfg.AnnotationsFile), wake); err == nil {
			defer stop()
		} else {
			c.log.V(2).Info("Cannot watch the annotations directory; polling", "err", err.Error())
		}
	}

	waitCtx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	tick := time.NewTicker(cfg.Interval)
	defer tick.Stop()
	var (
		anns     map[string]string
		status   string
		seen     bool
		lastErrs []string
		usable   int
	)
	for {
		lastErrs, usable = lastErrs[:0], 0
		for _, s := range sources {
			a, err := s.read(waitCtx)
			if err != nil {
				lastErrs = append(lastErrs, err.Error())
				if !s.disabled() {
					usable++
				}
				continue
			}
			usable++
			st, ok := annotations.TProxyStatus(a)
			if !ok {
				r := c.undecided("consul-cni-check: the pod has no %s annotation (%s): it is not a transparent-proxy pod, nothing to check", annotations.KeyTransparentProxyStatus, s.name())
				return nil, "", &r
			}
			if st != status || !seen {
				c.log.Info("Transparent proxy status", "status", st, "source", s.name())
			}
			anns, status, seen = a, st, true
			if annotations.IsComplete(st) {
				return anns, status, nil
			}
		}
		if usable == 0 {
			r := c.undecided("consul-cni-check: cannot read the pod's annotations: %s", strings.Join(lastErrs, "; "))
			return nil, "", &r
		}
		select {
		case <-waitCtx.Done():
			var r Result
			switch {
			case ctx.Err() != nil:
				r = c.undecided("consul-cni-check: interrupted")
			case !seen:
				// Not knowing is not evidence of a bypass: never the
				// controller's exit code.
				r = c.undecided("consul-cni-check: could not read the pod's annotations within %s: %s", cfg.Timeout, strings.Join(lastErrs, "; "))
			default:
				r = c.bypassed("consul-cni-check: %s is still %q after %s: the pod's sandbox was set up without the consul-cni plugin, so its traffic bypasses the proxy; delete the pod so that it is recreated",
					annotations.KeyTransparentProxyStatus, status, cfg.Timeout)
			}
			return nil, "", &r
		case <-wake:
		case <-tick.C:
		}
	}
}

// probe is the second phase: with the status complete, it proves with real
// connections that the pod's outbound traffic is redirected.
func (c *checker) probe(ctx context.Context, anns map[string]string, status string) Result {
	tc, err := trafficConfig(anns)
	if err != nil {
		return c.undecided("consul-cni-check: %v", err)
	}
	port := tc.ProxyOutboundPort
	if c.cfg.OutboundPort != 0 {
		port = c.cfg.OutboundPort
	}
	if err := probeAllowed(tc, c.cfg.UID); err != nil {
		return c.undecided("consul-cni-check: %v", err)
	}
	targets := c.cfg.ProbeTargets
	if len(targets) == 0 {
		targets = []netip.AddrPort{DefaultProbeAddress}
	}
	for _, t := range targets {
		if err := targetAllowed(tc, t); err != nil {
			return c.undecided("consul-cni-check: probe address %s: %v", t, err)
		}
	}
	for _, t := range targets {
		err := Probe(ctx, port, t, c.cfg.ProbeTimeout)
		var nr *NotRedirectedError
		switch {
		case errors.As(err, &nr):
			return c.bypassed("consul-cni-check: %s is %q but traffic is not redirected: %v", annotations.KeyTransparentProxyStatus, status, err)
		case err != nil:
			return c.undecided("consul-cni-check: traffic probe: %v", err)
		}
		c.log.Info("Traffic probe: connection redirected to the outbound port", "target", t.String(), "port", port)
	}
	return Result{Code: ExitOK, Message: fmt.Sprintf("consul-cni-check: %s is %q and traffic is redirected to port %d", annotations.KeyTransparentProxyStatus, status, port)}
}

// trafficConfig is the pod's redirect configuration, or consul-k8s's
// defaults when the annotation is absent.
func trafficConfig(anns map[string]string) (annotations.TrafficConfig, error) {
	raw, ok := anns[annotations.KeyRedirectTrafficConfig]
	if !ok {
		return annotations.TrafficConfig{
			ProxyUserID:       annotations.ProxyUID,
			ProxyOutboundPort: annotations.DefaultProxyOutboundPort,
			ExcludeUIDs:       []uint32{annotations.InitUID},
		}, nil
	}
	dual, err := annotations.DualStack(anns)
	if err != nil {
		return annotations.TrafficConfig{}, err
	}
	return annotations.ParseRedirectTrafficConfig([]byte(raw), dual)
}

// probeAllowed refuses UIDs the redirect rules exempt: as those, the probe
// would fail even when every rule is in place.
func probeAllowed(tc annotations.TrafficConfig, uid int) error {
	if uid < 0 {
		return fmt.Errorf("unknown UID %d", uid)
	}
	if uint32(uid) == tc.ProxyUserID {
		return fmt.Errorf("refusing to run the traffic probe as UID %d, the proxy's UID (ProxyUserID), whose traffic is never redirected; run the check as another UID", uid)
	}
	if slices.Contains(tc.ExcludeUIDs, uint32(uid)) {
		return fmt.Errorf("refusing to run the traffic probe as UID %d, which ExcludeUIDs exempts from redirection; run the check as another UID", uid)
	}
	return nil
}

// targetAllowed refuses probe addresses the rules do not redirect.
func targetAllowed(tc annotations.TrafficConfig, t netip.AddrPort) error {
	a := t.Addr()
	switch {
	case !t.IsValid() || t.Port() == 0:
		return errors.New("not an address and port")
	case a.IsLoopback() || a.IsUnspecified() || a.IsMulticast():
		return errors.New("loopback, unspecified and multicast addresses are not redirected")
	case a.Is6() && !a.Is4In6() && !tc.DualStack:
		return errors.New("an IPv6 address, but the pod is not dual-stack (no IPv6 rules)")
	}
	if annotations.PortsContain(tc.ExcludeOutboundPorts, t.Port()) {
		return fmt.Errorf("port %d is in ExcludeOutboundPorts", t.Port())
	}
	for _, c := range tc.ExcludeOutboundCIDRs {
		if c.Contains(a) {
			return fmt.Errorf("inside ExcludeOutboundCIDRs entry %s", c)
		}
	}
	return nil
}

// source yields the pod's current annotations.
type source interface {
	read(ctx context.Context) (map[string]string, error)
	name() string
	// disabled reports a source that will never work (no permission).
	disabled() bool
}

// fileSource re-reads a downward-API file by path at every look. kubelet
// updates such files by writing a new timestamped directory and renaming a
// symlink (..data) over the old one; opening the path each time follows the
// swap, and a reader never sees a partial file.
type fileSource struct {
	path string
}

func (f *fileSource) name() string   { return "file " + f.path }
func (f *fileSource) disabled() bool { return false }
func (f *fileSource) read(context.Context) (map[string]string, error) {
	b, err := os.ReadFile(f.path)
	if err != nil {
		return nil, err
	}
	return ParseDownwardAPI(b)
}

// apiSource reads the pod from the API (GET only, the least a pod's token
// may be granted). Forbidden and Unauthorized disable it.
type apiSource struct {
	client  kubernetes.Interface
	ns, pod string
	off     bool
	offErr  error
}

func (a *apiSource) name() string   { return "API pod " + a.ns + "/" + a.pod }
func (a *apiSource) disabled() bool { return a.off }
func (a *apiSource) read(ctx context.Context) (map[string]string, error) {
	if a.off {
		return nil, a.offErr
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	pod, err := a.client.CoreV1().Pods(a.ns).Get(rctx, a.pod, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) {
			a.off, a.offErr = true, fmt.Errorf("API: %w", err)
			klog.FromContext(ctx).Info("The pod's token may not read its own pod; using the downward-API file only", "err", err.Error())
		}
		return nil, fmt.Errorf("API: %w", err)
	}
	return pod.Annotations, nil
}

// watchDir sends to wake on every change in dir.
func watchDir(dir string, wake chan<- struct{}) (stop func(), err error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, err
	}
	if err := w.Add(dir); err != nil {
		w.Close()
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case _, ok := <-w.Events:
				if !ok {
					return
				}
				select {
				case wake <- struct{}{}:
				default:
				}
			case _, ok := <-w.Errors:
				if !ok {
					return
				}
			}
		}
	}()
	return func() { w.Close(); <-done }, nil
}
