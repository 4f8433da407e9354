// Package plugin is the consul-cni chained CNI plugin: it applies Consul's
// transparent-proxy redirect rules (pkg/redirect) inside a pod's network
// namespace and records the result in the pod's
// consul.hashicorp.com/transparent-proxy-status annotation.
//
// It follows the meta plugins of containernetworking/plugins: one
// parseConfig, prevResult handed on unchanged, all in-pod work in the pod
// namespace, stdout only for the CNI result, a CHECK that verifies and an
// idempotent DEL. It fails closed: any error in ADD (API unreachable,
// invalid annotation, iptables failure) fails the call with a message
// naming what to fix, leaves no rule of ours behind, and the runtime
// retries the sandbox.
package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/iptables"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/nftables"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/version"
)

// Plugin holds the plugin's dependencies; the zero value is not usable, use
// New. Tests replace the fields.
type Plugin struct {
	// NewClient builds the Kubernetes client and says which kubeconfig it
	// used (for messages).
	NewClient func(conf *Config) (PodClient, string, error)
	// NewExecutor returns the iptables executor for a pod namespace.
	NewExecutor func(ctx context.Context, conf *Config, netns string, log *slog.Logger) (iptables.Executor, error)
	// Nftables is the nftables backend's kernel side.
	Nftables nftables.Kernel
	// Stdout receives the CNI result; Stderr the log unless log_file is set.
	Stdout, Stderr io.Writer
	// RetryBase is the first back-off between API retries.
	RetryBase time.Duration
	// LookTool finds an iptables tool for STATUS (nil: iptables.LookTool).
	LookTool func(name string) (string, error)
}

// New returns the plugin wired to the real Kubernetes API and iptables.
func New() *Plugin {
	return &Plugin{
		NewClient:   NewKubeClient,
		NewExecutor: realExecutor,
		Nftables:    nftables.Netlink{},
		Stdout:      os.Stdout,
		Stderr:      os.Stderr,
		RetryBase:   200 * time.Millisecond,
	}
}

// Funcs returns the CNI commands for skel.
func (p *Plugin) Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: p.Add, Check: p.Check, Del: p.Del, Status: p.Status, GC: p.GC}
}

func realExecutor(ctx context.Context, conf *Config, netns string, log *slog.Logger) (iptables.Executor, error) {
	v := conf.iptablesVariant
	if conf.autoVariant {
		var why string
		v, why = iptables.VariantDetector{}.Cached(ctx, conf.StateDir, VariantCacheTTL)
		log.Debug("iptables variant", "variant", v.String(), "reason", why)
	}
	return &iptables.NetnsExecutor{NetNS: netns, Variant: v}, nil
}

// target is what a call works on: the pod's redirect configuration, and
// for Kubernetes the pod whose status to record. skip means the pod is not
// ours to redirect.
type target struct {
	cfg    annotations.TrafficConfig
	pod    *Pod
	client PodClient
	skip   bool
	what   string // "pod ns/name" or "Nomad allocation <container>"
}

// Add implements CNI ADD.
func (p *Plugin) Add(args *skel.CmdArgs) error {
	start := time.Now()
	conf, err := parseConfig(args.StdinData)
	if err != nil {
		return err
	}
	a, err := parseCNIArgs(args.Args)
	if err != nil {
		return err
	}
	log, closeLog := p.logger(conf, "ADD", args, a)
	defer closeLog()

	result, err := passThrough(conf, log)
	if err != nil {
		return err
	}

	apiCtx, cancel := context.WithTimeout(context.Background(), conf.apiTimeout)
	defer cancel()
	tg, err := p.resolve(apiCtx, conf, args, a, log, true)
	if err != nil {
		log.Error("ADD failed", "error", err)
		return err
	}
	if tg.skip {
		return p.print(result, conf)
	}

	exCtx, exCancel := context.WithTimeout(context.Background(), conf.iptablesTimeout)
	defer exCancel()
	rs := p.backend(conf, log)
	if err := rs.Apply(exCtx, args.Netns, tg.cfg); err != nil {
		err = fmt.Errorf("consul-cni: %s: applying the traffic redirection rules in %s failed (backend %s): %w", tg.what, args.Netns, conf.Backend, err)
		log.Error("ADD failed", "error", err)
		return err
	}

	if tg.pod != nil {
		ctx := apiCtx
		n, err := patchStatus(ctx, tg.client, tg.pod, completePatch(tg.pod.UID, time.Now()), p.RetryBase)
		if err != nil {
			// The API deadline may have taken the iptables one with it.
			cctx, ccancel := context.WithTimeout(context.Background(), redirect.CleanupTimeout)
			rerr := rs.Remove(cctx, args.Netns)
			ccancel()
			if rerr != nil {
				log.Error("removing the rules after the failed status update", "error", rerr)
			}
			err = fmt.Errorf("consul-cni: %s: rules applied but setting %s=%s failed after %d attempt(s), so the rules were removed and ADD fails for the runtime to retry: %w",
				tg.what, annotations.KeyTransparentProxyStatus, annotations.TProxyStatusComplete, n, apiHint(ctx, err, conf))
			log.Error("ADD failed", "error", err)
			return err
		}
	}
	log.Info("traffic redirection applied", "target", tg.what, "backend", conf.Backend, "dual_stack", tg.cfg.DualStack, "duration", time.Since(start).String())
	return p.print(result, conf)
}

// resolve finds the redirect configuration: from CONSUL_IPTABLES_CONFIG
// (Nomad) or from the pod's annotations. For ADD it records `waiting`.
func (p *Plugin) resolve(ctx context.Context, conf *Config, args *skel.CmdArgs, a cniArgs, log *slog.Logger, add bool) (*target, error) {
	if a.IptablesConfig != "" {
		tg := &target{what: "container " + args.ContainerID}
		cfg, err := annotations.ParseRedirectTrafficConfig([]byte(a.IptablesConfig), false)
		if err != nil {
			return nil, fmt.Errorf("consul-cni: %s: CNI argument CONSUL_IPTABLES_CONFIG is invalid: %w", tg.what, err)
		}
		tg.cfg = cfg
		return tg, nil
	}
	if a.PodName == "" || a.PodNamespace == "" {
		return nil, errors.New("consul-cni: CNI_ARGS has neither K8S_POD_NAMESPACE and K8S_POD_NAME (Kubernetes) nor CONSUL_IPTABLES_CONFIG (Nomad); not running for a pod")
	}
	tg := &target{what: "pod " + a.PodNamespace + "/" + a.PodName}
	if conf.excluded(a.PodNamespace) {
		log.Debug("namespace is in exclude_namespaces; not redirecting")
		tg.skip = true
		return tg, nil
	}
	client, path, err := p.NewClient(conf)
	if errors.Is(err, ErrNoKubeconfig) {
		// The installer writes the kubeconfig before it chains the plugin
		// and removes it only after the entry is gone from every list, so
		// a chain without it is an uninstall in progress or credentials
		// removed by hand: the node no longer runs the plugin.
		log.Warn("consul-cni is uninstalled from this node (its kubeconfig is gone); not redirecting", "error", err.Error())
		tg.skip = true
		return tg, nil
	}
	if err != nil {
		return nil, fmt.Errorf("consul-cni: %s: cannot build the Kubernetes client: %w", tg.what, err)
	}
	tg.client = client
	pod, n, err := getPod(ctx, client, a.PodNamespace, a.PodName, p.RetryBase)
	if left, err := productLeft(conf, err, log); left {
		tg.skip = true
		return tg, nil
	} else if err != nil {
		return nil, fmt.Errorf("consul-cni: %s: reading the pod from the Kubernetes API (kubeconfig %s) failed after %d attempt(s): %w",
			tg.what, path, n, apiHint(ctx, err, conf))
	}
	if a.PodUID != "" && pod.UID != a.PodUID && pod.Annotations[annotations.KeyConfigMirror] != string(a.PodUID) {
		// (A static pod's sandbox carries the static pod's UID; the API
		// holds its mirror pod, which names that UID in an annotation.)
		return nil, fmt.Errorf("consul-cni: %s: the API holds a different pod of that name (uid %s, the sandbox is for uid %s)", tg.what, pod.UID, a.PodUID)
	}
	if !annotations.UsesTransparentProxy(pod.Labels, pod.Annotations) {
		log.Debug("pod is not injected or has no transparent proxy status; not redirecting")
		tg.skip = true
		return tg, nil
	}
	tg.pod = pod
	if add {
		if n, err := patchStatus(ctx, client, pod, statusPatch(pod.UID, annotations.TProxyStatusWaiting), p.RetryBase); err != nil {
			return nil, fmt.Errorf("consul-cni: %s: setting %s=%s failed after %d attempt(s): %w",
				tg.what, annotations.KeyTransparentProxyStatus, annotations.TProxyStatusWaiting, n, apiHint(ctx, err, conf))
		}
	}
	raw, ok := pod.Annotations[annotations.KeyRedirectTrafficConfig]
	if !ok {
		return nil, fmt.Errorf("consul-cni: %s: the pod is injected with transparent proxy but has no %s annotation; check that consul-k8s runs with the CNI plugin enabled (connectInject.cni.enabled)",
			tg.what, annotations.KeyRedirectTrafficConfig)
	}
	dual, err := annotations.DualStack(pod.Annotations)
	if err != nil {
		return nil, fmt.Errorf("consul-cni: %s: %w", tg.what, err)
	}
	cfg, err := annotations.ParseRedirectTrafficConfig([]byte(raw), dual)
	if err != nil {
		return nil, fmt.Errorf("consul-cni: %s: %w", tg.what, err)
	}
	tg.cfg = cfg
	return tg, nil
}

// productLeft reports whether the API error err is a refusal of the
// plugin's credentials on a node the product left (cniconf.ProductLeft):
// the pod is then passed through. Otherwise err is returned, a refusal
// with what was found.
func productLeft(conf *Config, err error, log *slog.Logger) (bool, error) {
	if err == nil || !refused(err) {
		return false, err
	}
	left, why := cniconf.ProductLeft(conf.binDir(), time.Now())
	if left {
		log.Warn("consul-cni's credentials are refused and the product has left this node; not redirecting", "why", why, "error", err.Error())
		return true, nil
	}
	return false, fmt.Errorf("%w; not taken for a node the product left: %s", err, why)
}

func apiHint(ctx context.Context, err error, conf *Config) error {
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil || (errors.As(err, &ne) && ne.Timeout()) {
		return fmt.Errorf("%w (gave up at api_timeout %s: is the API server reachable from the node?)", err, conf.apiTimeout)
	}
	var ae *APIError
	if errors.As(err, &ae) && (ae.Code == http.StatusUnauthorized || ae.Code == http.StatusForbidden) {
		return fmt.Errorf("%w (the plugin's credentials were refused: the consul-cni installer on this node keeps them current; "+
			"if it was removed without running its uninstall, the plugin is still chained with stale credentials)", err)
	}
	return err
}

// passThrough returns the result to print: the prevResult unchanged, or,
// without one (Multus calls the plugin on its own), an empty result, as
// consul-k8s does.
func passThrough(conf *Config, log *slog.Logger) (types.Result, error) {
	if conf.PrevResult == nil {
		log.Debug("no prevResult; returning an empty result", "multus", conf.Multus)
		return &current.Result{CNIVersion: current.ImplementedSpecVersion}, nil
	}
	r, err := current.GetResult(conf.PrevResult)
	if err != nil {
		return nil, fmt.Errorf("consul-cni: cannot convert prevResult: %w", err)
	}
	if len(r.IPs) == 0 {
		return nil, errors.New("consul-cni: prevResult has no container IPs: the plugin must come after the plugin that sets up the pod network")
	}
	return conf.PrevResult, nil
}

func (p *Plugin) print(r types.Result, conf *Config) error {
	out, err := r.GetAsVersion(conf.CNIVersion)
	if err != nil {
		return fmt.Errorf("consul-cni: converting the result to CNI version %s: %w", conf.CNIVersion, err)
	}
	return out.PrintTo(p.Stdout)
}

// Check implements CNI CHECK: the rules must be in the pod namespace exactly
// as ADD put them.
func (p *Plugin) Check(args *skel.CmdArgs) error {
	conf, err := parseConfig(args.StdinData)
	if err != nil {
		return err
	}
	a, err := parseCNIArgs(args.Args)
	if err != nil {
		return err
	}
	log, closeLog := p.logger(conf, "CHECK", args, a)
	defer closeLog()
	apiCtx, cancel := context.WithTimeout(context.Background(), conf.apiTimeout)
	defer cancel()
	tg, err := p.resolve(apiCtx, conf, args, a, log, false)
	if err != nil {
		return err
	}
	if tg.skip {
		return nil
	}
	exCtx, exCancel := context.WithTimeout(context.Background(), conf.iptablesTimeout)
	defer exCancel()
	if err := p.backend(conf, log).Check(exCtx, args.Netns, tg.cfg); err != nil {
		err = fmt.Errorf("consul-cni: %s: %w", tg.what, err)
		log.Warn("CHECK found drift", "error", err)
		return err
	}
	return nil
}

// Del implements CNI DEL: removes our rules when the namespace still
// exists. A missing namespace, missing rules or an unparsable configuration
// are not errors (DEL must be able to finish).
func (p *Plugin) Del(args *skel.CmdArgs) error {
	conf, err := parseConfig(args.StdinData)
	if err != nil {
		// Keep going with defaults: DEL must not be blocked by a
		// configuration that ADD would have refused anyway.
		conf = &Config{apiTimeout: DefaultAPITimeout, iptablesTimeout: DefaultIptablesTimeout,
			Backend: cniconf.BackendIptables, autoVariant: true, StateDir: DefaultStateDir, level: slog.LevelInfo}
		fmt.Fprintf(p.Stderr, "consul-cni DEL: ignoring an invalid configuration: %v\n", err)
	}
	a, _ := parseCNIArgs(args.Args)
	log, closeLog := p.logger(conf, "DEL", args, a)
	defer closeLog()
	if args.Netns == "" {
		return nil
	}
	if _, err := os.Stat(args.Netns); err != nil {
		log.Debug("netns is gone; nothing to remove", "netns", args.Netns)
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), conf.iptablesTimeout)
	defer cancel()
	if err := p.backend(conf, log).Remove(ctx, args.Netns); err != nil {
		return fmt.Errorf("consul-cni: removing the traffic redirection rules from %s: %w", args.Netns, err)
	}
	return nil
}

// Status implements CNI STATUS (spec 1.1.0). It fails only when ADD would
// fail for every pod for a reason the node's operator must fix on the node:
// the IPv4 iptables tools are missing (iptables backend). Missing IPv6
// tools fail only dual-stack pods, so they are logged, not reported: a
// node without ip6tables keeps starting every single-stack pod. A problem with the plugin's credentials
// or the API is logged and left to ADD (which fails closed for injected
// pods) and to the installer's readiness: a runtime that sees STATUS fail
// reports the node's network as not ready, and the node lifecycle
// controller would then evict every pod of the node.
func (p *Plugin) Status(args *skel.CmdArgs) error {
	conf, err := parseConfig(args.StdinData)
	if err != nil {
		return types.NewError(types.ErrInvalidNetworkConfig, err.Error(), "")
	}
	log, closeLog := p.logger(conf, "STATUS", args, cniArgs{})
	defer closeLog()
	// The nftables backend speaks netlink and needs no tool.
	if !conf.nftables() {
		if missing := p.missingTools(conf, redirect.IPv4); missing != nil {
			return types.NewError(types.ErrPluginNotAvailable, "consul-cni: iptables tools are missing on the node", fmt.Sprint(missing))
		}
		if missing := p.missingTools(conf, redirect.IPv4, redirect.IPv6); missing != nil {
			log.Warn("the IPv6 iptables tools are missing: ADD fails for dual-stack pods until they are installed", "missing", missing)
		}
	}
	if conf.Kubeconfig != "" {
		if _, path, err := p.NewClient(conf); err != nil {
			log.Warn("the plugin's kubeconfig is not usable: ADD fails for injected pods until it is", "kubeconfig", path, "error", err.Error())
		}
	}
	return nil
}

// missingTools returns the iptables tools of the families missing for
// every usable variant, nil when one variant has them all.
func (p *Plugin) missingTools(conf *Config, families ...redirect.Family) []string {
	look := p.LookTool
	if look == nil {
		look = iptables.LookTool
	}
	variants := []iptables.Variant{conf.iptablesVariant}
	if conf.autoVariant {
		variants = []iptables.Variant{iptables.VariantNFT, iptables.VariantLegacy, iptables.VariantDefault}
	}
	var missing []string
	for _, b := range variants {
		ok := true
		for _, f := range families {
			for _, verb := range []string{"save", "restore"} {
				if _, err := look(b.Command(f, verb)); err != nil {
					ok = false
					missing = append(missing, b.Command(f, verb))
				}
			}
		}
		if ok {
			return nil
		}
	}
	return missing
}

// GC implements CNI GC (spec 1.1.0). The plugin keeps no state outside pod
// namespaces, which disappear with their sandboxes, so there is nothing to
// collect.
func (p *Plugin) GC(args *skel.CmdArgs) error {
	conf, err := parseConfig(args.StdinData)
	if err != nil {
		return err
	}
	_, closeLog := p.logger(conf, "GC", args, cniArgs{})
	closeLog()
	return nil
}

// logger returns the call's logger (stderr or log_file, never stdout).
func (p *Plugin) logger(conf *Config, cmd string, args *skel.CmdArgs, a cniArgs) (*slog.Logger, func()) {
	var w io.Writer = p.Stderr
	closer := func() {}
	if conf.logOff {
		w = io.Discard
	} else if conf.LogFile != "" {
		f, err := os.OpenFile(conf.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
		if err == nil {
			w, closer = f, func() { f.Close() }
		} else {
			fmt.Fprintf(p.Stderr, "consul-cni: cannot open log_file %s, logging to stderr: %v\n", conf.LogFile, err)
		}
	}
	l := slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: conf.level})).With("plugin", "consul-cni", "cmd", cmd, "container", args.ContainerID)
	if a.PodName != "" {
		l = l.With("pod", a.PodNamespace+"/"+a.PodName)
	}
	l.Debug("consul-cni called", "version", version.Version)
	return l, closer
}
