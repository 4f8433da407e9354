package judge

import (
	"math"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/configkey"
)

// Action is what the controller does to a broken pod.
type Action string

const (
	// ActionEvict uses the policy/v1 Eviction API (PodDisruptionBudgets
	// are honoured).
	ActionEvict Action = "evict"
	// ActionDelete deletes the pod with UID and resourceVersion
	// preconditions.
	ActionDelete Action = "delete"
	// ActionLabel only labels the pod consul.hashicorp.com/cni-uninitialized=true.
	ActionLabel Action = "label"
)

// GateMode selects how the controller decides that a node's CNI is ready.
type GateMode string

const (
	// GateNodeLabel: the node carries consul.hashicorp.com/cni=ready.
	GateNodeLabel GateMode = "node-label"
	// GateCNIPod: the CNI DaemonSet pod on the node is Ready.
	GateCNIPod GateMode = "cni-pod"
	// GateNone: act on every node (not recommended).
	GateNone GateMode = "none"
)

// Defaults of the judgement's settings (also the flags' defaults).
const (
	defaultAction           = ActionEvict
	defaultGate             = GateNodeLabel
	defaultMinPodAge        = 30 * time.Second
	defaultSandboxSlack     = 2 * time.Minute
	defaultBreakerThreshold = 0.5
	defaultBreakerMinPods   = 3
	defaultCNINamespace     = "consul-cni-repair"
	defaultCNIPodSelector   = "app.kubernetes.io/name=consul-cni"
)

// defaultInjectedPodSelector is the server-side label selector of the pods
// judged: the label the consul-k8s webhook puts on every pod it injects.
var defaultInjectedPodSelector = annotations.KeyInjectStatus + "=" + annotations.InjectStatusInjected

// defaultInitContainerNames are the init containers signal B watches.
var defaultInitContainerNames = []string{annotations.InitContainerName, annotations.CheckContainerName}

// Config holds the settings that decide which pods are broken and what the
// controller would do with them: the signals, the gate, the breaker and the
// action. The controller's configuration embeds it and the audit uses it as
// is, both with the flags of Flags. The zero value is not usable: start from
// DefaultConfig.
type Config struct {
	Action        Action
	Gate          GateMode
	AllowBarePods bool
	MinPodAge     time.Duration
	// SandboxSlack is signal C's tolerance (see Detector.SandboxSlack),
	// and the breaker's for the same lateness (see dateSandbox).
	SandboxSlack       time.Duration
	InitContainerNames []string
	InitExitCode       int32

	// InjectedPodSelector is the label selector of the pods judged (the
	// controller's pod informer, the audit's LIST).
	InjectedPodSelector string

	// The circuit breaker opens on a node when at least BreakerMinPods
	// injected pods whose sandbox was created after the node's CNI became
	// ready are broken and they are at least BreakerThreshold of such pods.
	Breaker          bool
	BreakerThreshold float64
	BreakerMinPods   int

	// CNINamespace and CNIPodSelector select the CNI DaemonSet's pods (the
	// cni-pod gate; node readiness).
	CNINamespace   string
	CNIPodSelector string
}

// DefaultConfig returns the documented defaults.
func DefaultConfig() Config {
	return Config{
		Action:              defaultAction,
		Gate:                defaultGate,
		MinPodAge:           defaultMinPodAge,
		SandboxSlack:        defaultSandboxSlack,
		InitContainerNames:  append([]string(nil), defaultInitContainerNames...),
		InitExitCode:        annotations.InitCheckExitCode,
		InjectedPodSelector: defaultInjectedPodSelector,
		Breaker:             true,
		BreakerThreshold:    defaultBreakerThreshold,
		BreakerMinPods:      defaultBreakerMinPods,
		CNINamespace:        defaultCNINamespace,
		CNIPodSelector:      defaultCNIPodSelector,
	}
}

// Validate checks every field; the error of the first bad one is a
// *configkey.Error naming its key (the field name) and value. CNINamespace
// and CNIPodSelector are checked when the gate reads CNI pods or when
// cniPods says that something else does (node readiness).
func (c *Config) Validate(cniPods bool) error {
	switch c.Action {
	case ActionEvict, ActionDelete, ActionLabel:
	default:
		return configkey.New("Action", string(c.Action), "is not one of evict, delete, label")
	}
	switch c.Gate {
	case GateNodeLabel, GateCNIPod, GateNone:
	default:
		return configkey.New("Gate", string(c.Gate), "is not one of node-label, cni-pod, none")
	}
	if err := c.validateSignals(); err != nil {
		return err
	}
	if math.IsNaN(c.BreakerThreshold) || c.BreakerThreshold <= 0 || c.BreakerThreshold > 1 {
		return configkey.New("BreakerThreshold", c.BreakerThreshold, "is not a share in (0, 1]")
	}
	if c.BreakerMinPods < 1 {
		return configkey.New("BreakerMinPods", c.BreakerMinPods, "must be at least 1")
	}
	if cniPods || c.Gate == GateCNIPod {
		return c.validateCNIPods()
	}
	return nil
}

// validateSignals checks the settings of the signals and of the pods judged.
func (c *Config) validateSignals() error {
	if c.MinPodAge < 0 {
		return configkey.New("MinPodAge", c.MinPodAge, "is negative")
	}
	if c.SandboxSlack < time.Second {
		// Both times have second precision: less would judge a pod by
		// the rounding of its clocks.
		return configkey.New("SandboxSlack", c.SandboxSlack, "is less than 1s")
	}
	if len(c.InitContainerNames) == 0 {
		return configkey.New("InitContainerNames", nil, "at least one name is required")
	}
	for _, n := range c.InitContainerNames {
		if errs := validation.IsDNS1123Label(n); len(errs) > 0 {
			return configkey.New("InitContainerNames", n, "is not a container name: "+errs[0])
		}
	}
	if c.InitExitCode < 1 || c.InitExitCode > 255 {
		return configkey.New("InitExitCode", c.InitExitCode, "is not an exit code (1-255)")
	}
	if _, err := labels.Parse(c.InjectedPodSelector); err != nil || c.InjectedPodSelector == "" {
		return &configkey.Error{Key: "InjectedPodSelector", Value: c.InjectedPodSelector, Reason: "is not a non-empty label selector", Err: err}
	}
	return nil
}

func (c *Config) validateCNIPods() error {
	if errs := validation.IsDNS1123Label(c.CNINamespace); len(errs) > 0 {
		return configkey.New("CNINamespace", c.CNINamespace, "is not a namespace name: "+errs[0])
	}
	sel, err := labels.Parse(c.CNIPodSelector)
	if err != nil {
		return &configkey.Error{Key: "CNIPodSelector", Value: c.CNIPodSelector, Reason: "is not a label selector", Err: err}
	}
	if sel.Empty() {
		return configkey.New("CNIPodSelector", c.CNIPodSelector, "selects every pod of the namespace; name the CNI DaemonSet's pods")
	}
	return nil
}

// Detector returns the detector of c's signal settings.
func (c *Config) Detector() Detector {
	return Detector{InitContainerNames: c.InitContainerNames, InitExitCode: c.InitExitCode, MinPodAge: c.MinPodAge, SandboxSlack: c.SandboxSlack}
}
