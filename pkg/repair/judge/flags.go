package judge

import "github.com/spf13/pflag"

// Flags are the flags of Config. The controller and the audit command
// register them with AddFlags, so both take the same flags with the same
// defaults.
type Flags struct {
	// Action and Gate hold the --action and --cni-ready-gate strings;
	// Apply copies them into the Config.
	Action string
	Gate   string
}

// NewFlags returns the flag strings of c's action and gate.
func NewFlags(c *Config) *Flags {
	return &Flags{Action: string(c.Action), Gate: string(c.Gate)}
}

// FlagNames maps the Config keys AddFlags sets (the field names
// Config.Validate's errors name) to their flags.
var FlagNames = map[string]string{
	"Action": "action", "Gate": "cni-ready-gate", "AllowBarePods": "allow-bare-pods",
	"MinPodAge": "min-pod-age", "SandboxSlack": "sandbox-slack",
	"InitContainerNames": "init-container-name", "InitExitCode": "init-exit-code",
	"InjectedPodSelector": "injected-pod-selector", "Breaker": "circuit-breaker",
	"BreakerThreshold": "breaker-threshold", "BreakerMinPods": "breaker-min-pods",
	"CNINamespace": "cni-namespace", "CNIPodSelector": "cni-pod-selector",
}

// AddFlags registers the detection, gate, breaker and action flags of c on
// fs.
func (f *Flags) AddFlags(fs *pflag.FlagSet, c *Config) {
	fs.StringVar(&f.Action, "action", f.Action, "What to do with a pod that bypassed the CNI plugin: evict (policy/v1 Eviction, PodDisruptionBudgets honoured), delete (UID and resourceVersion preconditions) or label (only label it "+"consul.hashicorp.com/cni-uninitialized=true).")
	fs.StringVar(&f.Gate, "cni-ready-gate", f.Gate, "When a node's CNI counts as ready (no action elsewhere): node-label (label consul.hashicorp.com/cni=ready), cni-pod (the CNI DaemonSet pod on the node is Ready) or none.")
	fs.BoolVar(&c.AllowBarePods, "allow-bare-pods", c.AllowBarePods, "Also act on pods without a controller (they are NOT recreated). Default: Event and metric only.")
	fs.DurationVar(&c.MinPodAge, "min-pod-age", c.MinPodAge, "Signal A: how long the transparent-proxy-status may stay enabled/waiting after the sandbox exists before the pod counts as broken.")
	fs.DurationVar(&c.SandboxSlack, "sandbox-slack", c.SandboxSlack, "Signal C: how much later than the consul.hashicorp.com/cni-applied-at annotation (without it, as with consul-k8s's plugin: the time the API server recorded the last write of transparent-proxy-status, from the pod's managedFields) a complete pod's sandbox may have become ready (PodReadyToStartContainers) and still be the sandbox the rules were applied to; later means it was recreated without consul-cni. It covers the kubelet reporting the new sandbox only after pulling and starting the first init container, and, without cni-applied-at, how far a node's clock runs ahead of the API server's. The circuit breaker allows for the same lateness: it counts only sandboxes dated at least this long after the node's CNI became ready. At least 1s.")
	fs.StringSliceVar(&c.InitContainerNames, "init-container-name", c.InitContainerNames, "Signal B: names of the annotation-check init containers (NAME and NAME-<service> match); repeat or comma-separate.")
	fs.Int32Var(&c.InitExitCode, "init-exit-code", c.InitExitCode, "Signal B: exit code of a failed check.")
	fs.StringVar(&c.InjectedPodSelector, "injected-pod-selector", c.InjectedPodSelector, "Server-side label selector of the pods the controller watches (the injected ones).")
	fs.BoolVar(&c.Breaker, "circuit-breaker", c.Breaker, "Stop acting on a node where pods created after its CNI became ready are broken too (misconfiguration, not the race).")
	fs.Float64Var(&c.BreakerThreshold, "breaker-threshold", c.BreakerThreshold, "Share (0-1] of broken pods, among the injected pods whose sandbox was created since the node's CNI became ready (dated --sandbox-slack after it or later), that opens the breaker.")
	fs.IntVar(&c.BreakerMinPods, "breaker-min-pods", c.BreakerMinPods, "Broken pods (sandbox created since the node's CNI became ready, dated --sandbox-slack after it or later) needed before the breaker can open.")
	fs.StringVar(&c.CNINamespace, "cni-namespace", c.CNINamespace, "Namespace of the CNI DaemonSet.")
	fs.StringVar(&c.CNIPodSelector, "cni-pod-selector", c.CNIPodSelector, "Label selector of the CNI DaemonSet's pods.")
}

// Apply copies the string flags into c.
func (f *Flags) Apply(c *Config) {
	c.Action = Action(f.Action)
	c.Gate = GateMode(f.Gate)
}
