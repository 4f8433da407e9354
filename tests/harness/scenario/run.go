package scenario

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/plugin"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/metrics"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/consulk8s"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/podnet"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/proc"
)

// Mode is one of the three runs.
type Mode string

const (
	NoRepair   Mode = "no-repair"
	Repair     Mode = "repair"
	Prevention Mode = "prevention"
	// SandboxRecreated: meshed pods; one loses its sandbox while consul-cni
	// is out of the chain (a node reboot), bypasses with its status still
	// complete, and is replaced (not part of the demo).
	SandboxRecreated Mode = "sandbox-recreated"
	// NodeReboot: meshed pods; the node reboots with every sandbox lost
	// and its conflist rewritten without consul-cni while it is down
	// (reboot.go).
	NodeReboot Mode = "node-reboot"
)

// Modes in the order the demo runs them.
var Modes = []Mode{NoRepair, Repair, Prevention, NodeReboot}

// Config of one run. Zero fields take the defaults in brackets.
type Config struct {
	Mode Mode
	// Pods is the Deployment's replicas [3].
	Pods int
	// CNIDelay is how long after the pods run (prevention: after the
	// Deployment is created) the plugin is chained on the node [5s].
	CNIDelay time.Duration
	// Observe is the shortest observation after the plugin is chained [15s].
	Observe time.Duration
	// Timeout bounds the wait for every pod to be meshed after the plugin
	// is chained, in the runs that expect it [3m].
	Timeout time.Duration
	// Settle is how long all pods must stay meshed to end early [3s].
	Settle time.Duration
	// ProbeInterval is the probers' interval [250ms].
	ProbeInterval time.Duration
	// DirectChain appends consul-cni to the conflist from the test instead
	// of deploying the installer DaemonSet (no-repair only; the default
	// when the tree has no installer).
	DirectChain bool
	// MinPodAge is the controller's --min-pod-age [10s]; RepairArgs are
	// more controller flags.
	MinPodAge  time.Duration
	RepairArgs []string
	// SandboxSlack is the controller's --sandbox-slack in the
	// sandbox-recreated and node-reboot runs [10s]: a sandbox is dated by
	// the kubelet's next sync, seconds late on a node that restarts every
	// pod at once.
	SandboxSlack time.Duration
	// ControllerOutside runs the controller as a process of the test on
	// every kind of node (on real nodes it runs as the manifests'
	// Deployment on the run's node otherwise), so that it keeps running
	// through a node reboot.
	ControllerOutside bool
	// CheckInit gives the injected pods the init-container check
	// consul-cni-check of docs/examples/init-check as their first init
	// container.
	CheckInit bool
	// TaintByPolicy (prevention): the node registers with no taint; the
	// MutatingAdmissionPolicy of manifests/components/node-startup-taint,
	// installed for the run, adds the startup taint when it is created.
	TaintByPolicy bool
	// Progress, when set, is called about once a second.
	Progress func(Progress)
	// Inspect, when set, is called with the run's namespace after the
	// observation, before anything is torn down.
	Inspect func(ctx context.Context, namespace string) error
	// Profile is what chains consul-cni on the node [ProfileDefault];
	// ProfileRepairOnly needs ConsulK8s, consul-k8s's binaries
	// (consulk8s.Unpack).
	Profile   Profile
	ConsulK8s *consulk8s.Binaries
	// Verifier runs the node verifier (consul-cni-verifier) for the run's
	// real node from the start, as the manifests' DaemonSet does; a
	// reboot stops it with the node and starts it again after.
	Verifier bool
}

func (c *Config) defaults() {
	if c.Pods == 0 {
		c.Pods = 3
	}
	if c.CNIDelay == 0 {
		c.CNIDelay = 5 * time.Second
	}
	if c.Observe == 0 {
		c.Observe = 15 * time.Second
	}
	if c.Timeout == 0 {
		c.Timeout = 3 * time.Minute
	}
	if c.Settle == 0 {
		c.Settle = 3 * time.Second
	}
	if c.ProbeInterval == 0 {
		c.ProbeInterval = 250 * time.Millisecond
	}
	if c.MinPodAge == 0 {
		c.MinPodAge = 10 * time.Second
	}
	if c.SandboxSlack == 0 {
		c.SandboxSlack = 10 * time.Second
	}
}

// Progress is a run's state, reported while it runs.
type Progress struct {
	Mode  Mode
	Phase string
	// Elapsed since the run started; SinceCNI since the plugin was chained
	// (negative before).
	Elapsed, SinceCNI                                    time.Duration
	Pods, Live, Meshed, Bypassing, EverBypassed, Actions int
}

// PodResult is one pod's record.
type PodResult struct {
	Name    string `json:"name"`
	UID     string `json:"uid"`
	IP      string `json:"ip,omitempty"`
	Meshed  int    `json:"meshed"`
	Bypass  int    `json:"bypass"`
	Errors  int    `json:"errors"`
	Deleted bool   `json:"deleted"`
	// ExternalConnections is what the external service saw from the pod's
	// IP: a second witness of bypass.
	ExternalConnections int `json:"external_connections"`
}

// Result of one run (the JSON of the demo report's scenarios).
type Result struct {
	Name           string `json:"name"`
	Pods           int    `json:"pods"`
	EverBypassed   int    `json:"ever_bypassed"`
	BypassingAtEnd int    `json:"bypassing_at_end"`
	// SecondsToAllMeshed counts from the moment the plugin was chained on
	// the node until every pod of the Deployment was meshed; null when they
	// were not all meshed at the end.
	SecondsToAllMeshed *float64 `json:"seconds_to_all_meshed"`
	// Actions is the number of pods the repair controller evicted or
	// deleted (its consul_cni_repair_pod_repairs_total).
	Actions int `json:"actions"`
	// PodsSeen counts every pod that existed during the run.
	PodsSeen int `json:"pods_seen"`
	// Control is the no-repair run's pod created after the plugin was
	// chained (not counted above).
	Control *PodResult `json:"control,omitempty"`
	// Plain is every run's pod without the mesh (PlainPod, not counted
	// above): the positive control of the bypass path.
	Plain *PodResult `json:"plain,omitempty"`
	// Recreated is the pod whose sandbox was recreated (sandbox-recreated
	// run), and RecreatedActions the controller's successful repairs with
	// reason sandbox_recreated (also node-reboot).
	Recreated        *PodResult `json:"recreated,omitempty"`
	RecreatedActions int        `json:"recreated_actions,omitempty"`
	// VerifiedActions are the controller's successful repairs with
	// reason verified_unredirected (node-reboot run).
	VerifiedActions int     `json:"verified_actions,omitempty"`
	SecondsObserved float64 `json:"seconds_observed"`
	// Controller is what the controller reported at the end
	// (node-reboot run).
	Controller *ControllerView `json:"controller,omitempty"`
	// Node is what the run's node reported of itself.
	Node  *NodeInfo `json:"node,omitempty"`
	Chain string    `json:"chain"`
	// PluginSHA256 is the sum of the consul-cni binary on the node at the
	// end (whose plugin redirected the pods).
	PluginSHA256 string      `json:"plugin_sha256,omitempty"`
	PodResults   []PodResult `json:"pod_results"`
}

var (
	runMu  sync.Mutex
	runSeq int
)

// Run runs one scenario and tears everything it made down.
func Run(ctx context.Context, e *Env, cfg Config) (*Result, error) {
	cfg.defaults()
	if err := e.Supports(cfg.Mode); err != nil {
		return nil, err
	}
	if e.Bins.Installer == "" {
		cfg.DirectChain = true
	}
	if cfg.DirectChain && cfg.Mode != NoRepair {
		return nil, fmt.Errorf("the %s run needs the installer DaemonSet (DirectChain is for no-repair only)", cfg.Mode)
	}
	runMu.Lock()
	runSeq++
	id := fmt.Sprintf("%s-s%d-%d", cfg.Mode, e.Range.Slot, runSeq)
	runMu.Unlock()
	r := &runner{e: e, cfg: cfg, id: id, cs: e.Cluster.Client, start: time.Now()}
	defer r.cleanup()
	return r.execute(ctx)
}

// runner runs one scenario of a Config on its own node and namespace and
// undoes what it set up in cleanup.
type runner struct {
	e     *Env
	cfg   Config
	id    string
	cs    kubernetes.Interface
	start time.Time

	ns         string
	node       Node
	dir        string
	controller *proc.Process
	// metricsURL is where the controller serves its metrics now
	// (empty when unknown).
	metricsURL          func(context.Context) string
	ds                  bool
	dsNamespace, dsName string
	cniAt               time.Time
	// consulK8s is consul-k8s's installer (ProfileRepairOnly).
	consulK8s *consulK8sRun
	// verifier is the node verifier's process (Config.Verifier).
	verifier *verifierRun
	tr       *tracker
	phase    string
	live     []*podTrack
	cleanups []func()
}

func (r *runner) logf(format string, args ...any) {
	r.e.Logf("[%s %5.1fs] %s", r.cfg.Mode, time.Since(r.start).Seconds(), fmt.Sprintf(format, args...))
}

func (r *runner) cleanup() {
	r.logf("cleaning up")
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
	r.logf("cleaned up")
}

func (r *runner) onCleanup(f func()) { r.cleanups = append(r.cleanups, f) }

// execute sets the run up, lets the pods start before consul-cni is on the
// node (except in the sandbox-recreated run), chains it and observes.
func (r *runner) execute(ctx context.Context) (*Result, error) {
	if err := r.setUp(ctx); err != nil {
		return nil, err
	}
	switch r.cfg.Mode {
	case SandboxRecreated:
		return r.runRecreated(ctx)
	case NodeReboot:
		return r.runReboot(ctx)
	}
	if err := r.podsBeforeCNI(ctx); err != nil {
		return nil, err
	}
	if err := r.chainCNI(ctx); err != nil {
		return nil, err
	}
	res, err := r.observe(ctx, r.cfg.Mode != NoRepair)
	if err == nil && r.cfg.Inspect != nil {
		err = r.cfg.Inspect(ctx, r.ns)
	}
	return res, err
}

// setUp makes the run's directory, node and namespace and, unless the mode
// is no-repair, starts the controller with its manifests.
func (r *runner) setUp(ctx context.Context) error {
	var err error
	proc.RemoveStale(filepath.Join(os.TempDir(), "ccr-run-*"))
	if r.dir, err = os.MkdirTemp("", "ccr-run-"); err != nil {
		return err
	}
	if err := proc.MarkOwned(r.dir); err != nil {
		return err
	}
	r.onCleanup(func() { os.RemoveAll(r.dir) })

	if r.cfg.TaintByPolicy {
		r.setPhase("installing the startup-taint admission policy")
		if err := r.installStartupTaintPolicy(ctx); err != nil {
			return err
		}
	}
	r.setPhase("starting the node")
	if err := r.startNode(ctx); err != nil {
		return err
	}
	ns, err := r.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "race-" + string(r.cfg.Mode) + "-"}}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	r.ns = ns.Name
	r.onCleanup(func() {
		_ = r.cs.CoreV1().Namespaces().Delete(context.Background(), r.ns, metav1.DeleteOptions{})
	})
	r.tr = newTracker(r.node.LogFiles, r.ns)
	if err := poll.Until(ctx, 2*time.Minute, waitInterval, func() (bool, error) {
		_, err := r.cs.CoreV1().ServiceAccounts(r.ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		return fmt.Errorf("namespace %s: no default service account: %w", r.ns, err)
	}

	if r.cfg.Verifier {
		if err := r.startVerifier(ctx); err != nil {
			return err
		}
	}
	if r.cfg.Mode != NoRepair {
		if err := r.applyCNIManifests(ctx, false); err != nil {
			return err
		}
		if err := r.startController(ctx); err != nil {
			return err
		}
	}
	return nil
}

// podsBeforeCNI deploys the injected pods and waits while consul-cni is
// not on the node: prevention keeps them pending, the other modes let them
// run on the primary network only.
func (r *runner) podsBeforeCNI(ctx context.Context) error {
	r.setPhase(fmt.Sprintf("deploying %d injected pods", r.cfg.Pods))
	if err := r.deploy(ctx); err != nil {
		return err
	}
	if r.cfg.Mode != Prevention {
		r.setPhase("pods starting on the primary network only")
		if err := r.waitRunning(ctx); err != nil {
			return err
		}
		r.setPhase(fmt.Sprintf("pods run; consul-cni arrives in %s", r.cfg.CNIDelay))
		return r.wait(ctx, r.cfg.CNIDelay)
	}
	r.setPhase("pods wait for the node's CNI")
	if err := r.wait(ctx, r.cfg.CNIDelay); err != nil {
		return err
	}
	pods, err := r.pods(ctx)
	if err != nil {
		return err
	}
	for _, p := range pods {
		if p.Spec.NodeName != "" {
			return fmt.Errorf("prevention: pod %s was scheduled onto %s before its CNI was ready", p.Name, p.Spec.NodeName)
		}
	}
	return nil
}

// chainCNI puts consul-cni into the node's chain (by the installer
// DaemonSet, or by hand with DirectChain) and waits until it is there.
func (r *runner) chainCNI(ctx context.Context) error {
	r.setPhase("chaining consul-cni on the node")
	var err error
	switch {
	case r.cfg.Profile == ProfileRepairOnly:
		err = r.startConsulK8s(ctx)
	case r.cfg.DirectChain:
		err = r.chainDirectly(ctx)
	default:
		if err = r.applyCNIManifests(ctx, false); err == nil {
			err = r.applyCNIManifests(ctx, true)
		}
	}
	if err != nil {
		return err
	}
	if err := r.waitChained(ctx); err != nil {
		return err
	}
	if r.cfg.Mode == NoRepair {
		// A pod that lands now gets the plugin: it must be meshed, which
		// shows that the others bypass because of when their sandbox was
		// made, not because the plugin or the probe is broken.
		return r.createControl(ctx)
	}
	return nil
}

// waitChained waits until consul-cni is in the node's chain and records
// when.
func (r *runner) waitChained(ctx context.Context) error {
	limit := 2 * time.Minute
	if r.cfg.Profile == ProfileRepairOnly {
		limit = 4 * time.Minute // consul-k8s's installer may wait 100 s for a binary to go
	}
	if err := poll.Until(ctx, limit, waitInterval, func() (bool, error) {
		ok, err := r.chained()
		if ok {
			r.cniAt = time.Now()
		}
		r.tick(ctx)
		return ok, err
	}); err != nil {
		return fmt.Errorf("consul-cni never appeared in %s: %w%s", r.node.ConfDir(), err, r.installerLogs())
	}
	r.logf("consul-cni chained on %s: %s", r.node.Name(), r.chainString())
	return nil
}

// observe watches the traffic for at least Observe after cniAt and, when
// expectMeshed, until every pod has been meshed for Settle, and until the
// no-repair run's control pod has answered (or Timeout): on a slow node the
// control pod may start after Observe, and a verdict on it before it
// answered would say nothing.
func (r *runner) observe(ctx context.Context, expectMeshed bool) (*Result, error) {
	r.setPhase("observing traffic")
	for {
		live := r.tick(ctx)
		now := time.Now()
		allMeshed, at := r.allMeshed(live)
		since := now.Sub(r.cniAt)
		done := since >= r.cfg.Observe && (!expectMeshed || (allMeshed && now.Sub(at) >= r.cfg.Settle)) &&
			r.controlAnswered()
		if done || since >= r.cfg.Observe+r.cfg.Timeout {
			res := r.result(ctx, live, now)
			r.setPhase("done")
			return res, nil
		}
		if err := r.wait(ctx, time.Second); err != nil {
			return nil, err
		}
	}
}

// controlAnswered reports whether the control pod answered a probe, meshed
// or not (true for the runs without one).
func (r *runner) controlAnswered() bool {
	if r.cfg.Mode != NoRepair {
		return true
	}
	c := r.tr.control
	return c != nil && c.Meshed+c.Bypass > 0
}

func (r *runner) setPhase(p string) {
	r.phase = p
	r.logf("%s", p)
	r.report(nil)
}

func (r *runner) wait(ctx context.Context, d time.Duration) error {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		step := min(time.Second, time.Until(end))
		if err := sleepCtx(ctx, step); err != nil {
			return err
		}
		r.tick(ctx)
	}
	return nil
}

// waitInterval is how often the run polls the cluster and the node.
const waitInterval = 200 * time.Millisecond

// nodeLabel marks the run's node; the installer DaemonSet is pinned to it.
const nodeLabel = "scenario.consul-cni-repair.test/run"

func (r *runner) startNode(ctx context.Context) error {
	spec := NodeSpec{Name: "race-" + r.id, Labels: map[string]string{nodeLabel: r.id}, Logf: r.logf}
	if r.cfg.Mode == Prevention && !r.cfg.TaintByPolicy {
		spec.Taints = []corev1.Taint{{Key: annotations.TaintCNINotReady, Value: "true", Effect: corev1.TaintEffectNoSchedule}}
	}
	n, err := r.e.Nodes.Start(ctx, spec)
	if err != nil {
		return err
	}
	r.node = n
	r.onCleanup(n.Stop)
	return nil
}

// Deployment is the name of the injected Deployment.
const Deployment = "web"

// redirectConfig is what the consul-k8s webhook writes for a pod with
// transparent proxy and the CNI plugin on (see consul-compat.md).
const redirectConfig = `{"ConsulDNSIP":"127.0.0.1","ConsulDNSPort":8600,"ProxyUserID":"5995","ProxyInboundPort":20000,` +
	`"ProxyOutboundPort":15001,"ExcludeInboundPorts":["20200","21000"],"ExcludeOutboundPorts":null,` +
	`"ExcludeOutboundCIDRs":null,"ExcludeUIDs":["5996"],"NetNS":"","IptablesProvider":null}`

// PodImages are the images of the injected pods' containers on a kind of
// node. Each runs tests/cmd/podprog, as the simulated node's program for
// the image or as the image's entrypoint (Entrypoint: the connect-init
// container then gives only podprog's arguments).
type PodImages struct {
	ConnectInit, Dataplane, App string
	Entrypoint                  bool
	// Check is the image of the init-container check (empty: the
	// documented example's).
	Check string
}

// SimPodImages are the image names consul-k8s gives the pods, with the
// app's own; simulated nodes run podprog for each.
var SimPodImages = PodImages{ConnectInit: "hashicorp/consul-k8s-control-plane:1.6.2",
	Dataplane: "hashicorp/consul-dataplane:1.6.2", App: "example.com/race/podprog:1.0"}

// InjectedPodTemplate is a pod as the consul-k8s connect-inject webhook
// leaves it with transparent proxy and the CNI plugin: its markers, the
// connect-init init container (UID 5996), the dataplane sidecar (UID 5995,
// here a stand-in answering "proxy" on 15001 and 20000) and the app, a
// prober of the external service.
func InjectedPodTemplate(name, nodeName string, service string, interval time.Duration, img PodImages) corev1.PodTemplateSpec {
	initCmd, initArgs := []string{"consul-k8s-control-plane", "connect-init"}, []string(nil)
	if img.Entrypoint {
		initCmd, initArgs = nil, []string{"connect-init"}
	}
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{
			Labels: map[string]string{"app": name, annotations.KeyInjectStatus: annotations.InjectStatusInjected},
			Annotations: map[string]string{
				annotations.KeyInjectStatus:            annotations.InjectStatusInjected,
				annotations.KeyTransparentProxyStatus:  annotations.TProxyStatusEnabled,
				annotations.KeyRedirectTrafficConfig:   redirectConfig,
				annotations.KeyDualStack:               "false",
				"consul.hashicorp.com/connect-service": name,
			},
		},
		Spec: corev1.PodSpec{
			NodeSelector:                  map[string]string{"kubernetes.io/hostname": nodeName},
			TerminationGracePeriodSeconds: ptr.To(int64(5)),
			InitContainers: []corev1.Container{{
				Name:            annotations.InitContainerName,
				Image:           img.ConnectInit,
				Command:         initCmd,
				Args:            initArgs,
				SecurityContext: &corev1.SecurityContext{RunAsUser: ptr.To(int64(annotations.InitUID)), RunAsGroup: ptr.To(int64(annotations.InitUID))},
			}},
			Containers: []corev1.Container{
				{
					Name:  ProberContainer,
					Image: img.App,
					Args:  []string{"probe", "--target=" + service, "--interval=" + interval.String()},
				},
				{
					Name:            "consul-dataplane",
					Image:           img.Dataplane,
					Args:            []string{"proxy", "--outbound=15001", "--inbound=20000"},
					SecurityContext: &corev1.SecurityContext{RunAsUser: ptr.To(int64(annotations.ProxyUID)), RunAsGroup: ptr.To(int64(annotations.ProxyUID))},
					ReadinessProbe: &corev1.Probe{
						ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(20000)}},
						PeriodSeconds: 2,
					},
				},
			},
		},
	}
}

func (r *runner) deploy(ctx context.Context) error {
	tmpl := InjectedPodTemplate(Deployment, r.node.Name(), r.e.Service.String(), r.cfg.ProbeInterval, r.e.Nodes.PodImages())
	if r.cfg.CheckInit {
		if err := r.withCheck(&tmpl); err != nil {
			return err
		}
	}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: Deployment, Namespace: r.ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(int32(r.cfg.Pods)),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": Deployment}},
			Template: tmpl,
		},
	}
	if _, err := r.cs.AppsV1().Deployments(r.ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		return err
	}
	return r.createPlain(ctx)
}

// PlainPod is the pod every run creates beside the injected Deployment: the
// same prober without the mesh (no injection markers, so consul-cni leaves
// it alone). It must be seen bypassing, reaching the external service: the
// positive control of the bypass path, without which a run that saw no
// bypass proves nothing (Verdict).
const PlainPod = "plain"

func (r *runner) createPlain(ctx context.Context) error {
	img := r.e.Nodes.PodImages()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: PlainPod, Namespace: r.ns, Labels: map[string]string{"app": PlainPod}},
		Spec: corev1.PodSpec{
			NodeSelector:                  map[string]string{"kubernetes.io/hostname": r.node.Name()},
			TerminationGracePeriodSeconds: ptr.To(int64(5)),
			Containers: []corev1.Container{{
				Name:  ProberContainer,
				Image: img.App,
				Args:  []string{"probe", "--target=" + r.e.Service.String(), "--interval=" + r.cfg.ProbeInterval.String()},
			}},
		},
	}
	_, err := r.cs.CoreV1().Pods(r.ns).Create(ctx, pod, metav1.CreateOptions{})
	return err
}

// podIP is the address of the run's pod name.
func (r *runner) podIP(ctx context.Context, name string) (netip.Addr, error) {
	p, err := r.cs.CoreV1().Pods(r.ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return netip.Addr{}, err
	}
	return netip.ParseAddr(p.Status.PodIP)
}

func (r *runner) pods(ctx context.Context) ([]corev1.Pod, error) {
	l, err := r.cs.CoreV1().Pods(r.ns).List(ctx, metav1.ListOptions{LabelSelector: "app=" + Deployment})
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}

func (r *runner) waitRunning(ctx context.Context) error {
	var last string
	err := poll.Until(ctx, 3*time.Minute, waitInterval, func() (bool, error) {
		pods, err := r.pods(ctx)
		if err != nil {
			return false, nil
		}
		running := 0
		for _, p := range pods {
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				running++
			}
		}
		last = fmt.Sprintf("%d of %d running", running, r.cfg.Pods)
		r.tick(ctx)
		return running == r.cfg.Pods, nil
	})
	if err != nil {
		return fmt.Errorf("pods of %s/%s did not all run (%s): %w", r.ns, Deployment, last, err)
	}
	return nil
}

// ControlPod is the pod the no-repair run creates once the plugin is
// chained.
const ControlPod = "control"

func (r *runner) createControl(ctx context.Context) error {
	tmpl := InjectedPodTemplate(ControlPod, r.node.Name(), r.e.Service.String(), r.cfg.ProbeInterval, r.e.Nodes.PodImages())
	pod := &corev1.Pod{ObjectMeta: tmpl.ObjectMeta, Spec: tmpl.Spec}
	pod.Name, pod.Namespace = ControlPod, r.ns
	_, err := r.cs.CoreV1().Pods(r.ns).Create(ctx, pod, metav1.CreateOptions{})
	return err
}

// applyCNIManifests applies the CNI part of the kustomize base: namespace,
// the installer's RBAC and admission policy, and (withDaemonSet) the
// installer DaemonSet, pinned to this run's node.
func (r *runner) applyCNIManifests(ctx context.Context, withDaemonSet bool) error {
	if r.cfg.Profile == ProfileRepairOnly {
		// The repair-only overlay deploys nothing of the installer: no
		// ServiceAccount, RBAC or admission policy of it.
		if withDaemonSet {
			return r.startConsulK8s(ctx)
		}
		return nil
	}
	files := []string{"base/namespace.yaml", "base/cni/rbac.yaml", "base/cni/admission-policy.yaml"}
	if withDaemonSet {
		files = []string{"base/cni/daemonset.yaml"}
	}
	objs, err := readManifests(r.e.Manifests, files...)
	if err != nil {
		return err
	}
	for _, o := range objs {
		if ds, ok := o.(*appsv1.DaemonSet); ok {
			// Only this run's node (other tests may have nodes in the
			// same control plane); everything else as the manifest says.
			if ds.Spec.Template.Spec.NodeSelector == nil {
				ds.Spec.Template.Spec.NodeSelector = map[string]string{}
			}
			ds.Spec.Template.Spec.NodeSelector[nodeLabel] = r.id
			if err := r.e.Nodes.Installer(r.node, &ds.Spec.Template.Spec); err != nil {
				return err
			}
			r.ds = true
			r.dsNamespace, r.dsName = ds.Namespace, ds.Name
			r.onCleanup(func() {
				if err := r.deleteWorkload(ds.Namespace, ds.Name, true); err != nil {
					r.logf("cleanup: %v", err)
				}
			})
		}
	}
	return apply(ctx, r.cs, objs)
}

// nodeBoundToken is a token of the installer's ServiceAccount bound to this
// run's Node object: like the installer's pod-bound token it names the node
// (extra authentication.kubernetes.io/node-name), which the plugin's
// admission policy requires.
func (r *runner) nodeBoundToken(ctx context.Context) (string, error) {
	node, err := r.cs.CoreV1().Nodes().Get(ctx, r.node.Name(), metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	tr, err := r.cs.CoreV1().ServiceAccounts(manifestsNamespace).CreateToken(ctx, "consul-cni", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: ptr.To(int64(3600)),
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Node", APIVersion: "v1", Name: node.Name, UID: node.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token for service account consul-cni-repair/consul-cni bound to node %s: %w", node.Name, err)
	}
	return tr.Status.Token, nil
}

// chainDirectly does what the installer does, from the test: copy the
// plugin, write its kubeconfig (the installer's service account, through
// the node's API endpoint) and append it to the node's conflist.
func (r *runner) chainDirectly(ctx context.Context) error {
	if err := r.applyCNIManifests(ctx, false); err != nil {
		return err
	}
	if err := podnet.CopyExecutable(r.e.Bins.ConsulCNI, filepath.Join(r.node.BinDir(), "consul-cni")); err != nil {
		return err
	}
	tok, err := r.nodeBoundToken(ctx)
	if err != nil {
		return err
	}
	kc := &rest.Config{Host: r.node.APIServer(), BearerToken: tok,
		TLSClientConfig: rest.TLSClientConfig{CAData: r.e.Cluster.CAData, ServerName: "127.0.0.1"}}
	if err := cluster.WriteKubeconfig(filepath.Join(r.node.ConfDir(), cniconf.KubeconfigFileName), kc, "consul-cni"); err != nil {
		return err
	}
	file := r.node.PrimaryConflist()
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	var conf map[string]any
	if err := json.Unmarshal(b, &conf); err != nil {
		return err
	}
	conf["plugins"] = append(conf["plugins"].([]any), struct {
		Type string `json:"type"`
		cniconf.Settings
		StateDir string `json:"state_dir"`
	}{
		Type: cniconf.PluginType,
		Settings: cniconf.Settings{LogLevel: "info", Kubeconfig: cniconf.KubeconfigFileName,
			CNIBinDir: r.node.BinDir(), CNINetDir: r.node.ConfDir()},
		StateDir: filepath.Join(r.node.Root(), plugin.DefaultStateDir),
	})
	out, _ := json.MarshalIndent(conf, "", "  ")
	return writeFileAtomic(file, out)
}

// chained reports whether the node's network (as a sandbox created now
// would get it) has consul-cni, with the binary in place.
func (r *runner) chained() (bool, error) {
	if _, err := os.Stat(filepath.Join(r.node.BinDir(), "consul-cni")); err != nil {
		return false, nil
	}
	files, _ := filepath.Glob(filepath.Join(r.node.ConfDir(), "*.conflist"))
	sort.Strings(files)
	if len(files) == 0 {
		return false, nil
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		return false, nil
	}
	var conf struct {
		Plugins []struct {
			Type string `json:"type"`
		} `json:"plugins"`
	}
	if json.Unmarshal(b, &conf) != nil {
		return false, nil
	}
	for _, p := range conf.Plugins {
		if p.Type == "consul-cni" {
			return true, nil
		}
	}
	return false, nil
}

func (r *runner) chainString() string {
	files, _ := filepath.Glob(filepath.Join(r.node.ConfDir(), "*.conflist"))
	sort.Strings(files)
	if len(files) == 0 {
		return ""
	}
	b, _ := os.ReadFile(files[0])
	var conf struct {
		Plugins []struct {
			Type string `json:"type"`
		} `json:"plugins"`
	}
	_ = json.Unmarshal(b, &conf)
	var t []string
	for _, p := range conf.Plugins {
		t = append(t, p.Type)
	}
	return strings.Join(t, " -> ")
}

// installerLogs returns the end of the installer containers' output on
// the node, for error messages.
func (r *runner) installerLogs() string { return r.containerLogs(manifestsNamespace, "", 15) }

// manifestsNamespace is the namespace manifests/base installs into, the
// controller's default --cni-namespace.
var manifestsNamespace = judge.DefaultConfig().CNINamespace

// containerLogs returns the last lines of every log on the node of
// containers in namespace ns named container (any when empty).
func (r *runner) containerLogs(ns, container string, lines int) string {
	files, _ := r.node.LogFiles()
	var b strings.Builder
	for _, f := range files {
		if f.Namespace != ns || (container != "" && f.Container != container) {
			continue
		}
		out, _ := os.ReadFile(f.Path)
		fmt.Fprintf(&b, "\n--- %s/%s %s #%d:\n%s", f.Namespace, f.Pod, f.Container, f.Instance, tail(string(out), lines))
	}
	return b.String()
}

func tail(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// actions reads the controller's successful repairs from its metrics, for
// progress and the result's count (0 while they cannot be read; the checks
// that depend on it read them with actionsFor).
func (r *runner) actions() int {
	n, _ := r.actionsFor("")
	return n
}

// actionsFor reads the controller's successful repairs with reason (any
// reason when empty) from its metrics.
func (r *runner) actionsFor(reason judge.Reason) (int, error) {
	var match []string
	if reason != "" {
		match = append(match, metrics.LabelReason+`="`+string(reason)+`"`)
	}
	n, err := r.metricSum(metrics.PodRepairs, match...)
	return int(n), err
}

// metricSum adds up the controller's samples of metric whose line holds
// every one of match (0 without a controller).
func (r *runner) metricSum(metric string, match ...string) (float64, error) {
	if r.metricsURL == nil {
		return 0, nil
	}
	url := r.metricsURL(context.Background())
	if url == "" {
		return 0, errors.New("reading the controller's metrics: no address (is its pod running?)")
	}
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, fmt.Errorf("reading the controller's metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("reading the controller's metrics at %s: %s", url, resp.Status)
	}
	total := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
next:
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, metric+"{") && !strings.HasPrefix(l, metric+" ") {
			continue
		}
		for _, m := range match {
			if !strings.Contains(l, m) {
				continue next
			}
		}
		if i := strings.LastIndexByte(l, ' '); i > 0 {
			if v, err := strconv.ParseFloat(l[i+1:], 64); err == nil {
				total += v
			}
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("reading the controller's metrics at %s: %w", url, err)
	}
	return total, nil
}

// tick reads the probers' output and the pods, and reports progress.
func (r *runner) tick(ctx context.Context) []*podTrack {
	if r.tr == nil {
		return nil
	}
	r.tr.readLogs()
	pods, err := r.pods(ctx)
	if err != nil {
		return nil
	}
	live := r.tr.observe(pods)
	r.report(live)
	return live
}

func (r *runner) allMeshed(live []*podTrack) (bool, time.Time) {
	if len(live) != r.cfg.Pods {
		return false, time.Time{}
	}
	var at time.Time
	for _, p := range live {
		if p.MeshedSince.IsZero() || !p.fresh(time.Now(), 5*time.Second) {
			return false, time.Time{}
		}
		if p.MeshedSince.After(at) {
			at = p.MeshedSince
		}
	}
	return true, at
}

func (r *runner) counts(live []*podTrack) (meshed, bypassing, ever int) {
	now := time.Now()
	for _, p := range live {
		if !p.fresh(now, 5*time.Second) {
			continue
		}
		switch p.Last {
		case resultMeshed:
			meshed++
		case resultBypass:
			bypassing++
		}
	}
	for _, p := range r.tr.pods {
		if p.Bypass > 0 {
			ever++
		}
	}
	return
}

func (r *runner) report(live []*podTrack) {
	if r.cfg.Progress == nil {
		return
	}
	if live == nil {
		live = r.live
	}
	r.live = live
	pr := Progress{Mode: r.cfg.Mode, Phase: r.phase, Elapsed: time.Since(r.start), SinceCNI: -1, Pods: r.cfg.Pods, Live: len(live)}
	if !r.cniAt.IsZero() {
		pr.SinceCNI = time.Since(r.cniAt)
	}
	if r.tr != nil {
		pr.Meshed, pr.Bypassing, pr.EverBypassed = r.counts(live)
	}
	pr.Actions = r.actions()
	r.cfg.Progress(pr)
}

func (r *runner) result(ctx context.Context, live []*podTrack, now time.Time) *Result {
	res := &Result{Name: string(r.cfg.Mode), Pods: r.cfg.Pods, Actions: r.actions(),
		SecondsObserved: now.Sub(r.cniAt).Seconds(), Chain: r.chainString(), Node: r.nodeInfo(ctx),
		PluginSHA256: fileSHA256(filepath.Join(r.node.BinDir(), "consul-cni"))}
	_, res.BypassingAtEnd, res.EverBypassed = r.counts(live)
	if ok, at := r.allMeshed(live); ok {
		s := at.Sub(r.cniAt).Seconds()
		if s < 0 {
			s = 0
		}
		s = float64(int(s*10+0.5)) / 10
		res.SecondsToAllMeshed = &s
	}
	if c := r.tr.control; c != nil {
		pr := PodResult{Name: c.Name, UID: string(c.UID), Meshed: c.Meshed, Bypass: c.Bypass, Errors: c.Errors}
		res.Control = &pr
	}
	if c := r.tr.plain; c != nil {
		pr := PodResult{Name: c.Name, UID: string(c.UID), Meshed: c.Meshed, Bypass: c.Bypass, Errors: c.Errors}
		if ip, err := r.podIP(ctx, PlainPod); err == nil {
			pr.IP, pr.ExternalConnections = ip.String(), r.e.Connections(ip, r.start)
		}
		res.Plain = &pr
	}
	for _, p := range r.tr.pods {
		pr := PodResult{Name: p.Name, UID: string(p.UID), Meshed: p.Meshed, Bypass: p.Bypass, Errors: p.Errors, Deleted: p.Deleted}
		if p.IP.IsValid() {
			pr.IP = p.IP.String()
			pr.ExternalConnections = r.e.Connections(p.IP, r.start)
		}
		res.PodResults = append(res.PodResults, pr)
	}
	sort.Slice(res.PodResults, func(i, j int) bool { return res.PodResults[i].Name < res.PodResults[j].Name })
	res.PodsSeen = len(res.PodResults)
	return res
}

// fileSHA256 is the hex sum of a file, "" when it cannot be read.
func fileSHA256(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
