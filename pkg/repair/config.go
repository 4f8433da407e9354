package repair

import (
	"fmt"
	"math"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
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

// Defaults of the controller's settings (also the flags' defaults).
const (
	defaultAction                     = ActionEvict
	defaultGate                       = GateNodeLabel
	defaultMinPodAge                  = 30 * time.Second
	defaultSandboxSlack               = 2 * time.Minute
	defaultMaxRepairsPerMinute        = 30
	defaultMaxRepairsPerNodePerMinute = 10
	defaultBackoffBase                = 5 * time.Second
	defaultBackoffMax                 = 5 * time.Minute
	defaultBreakerThreshold           = 0.5
	defaultBreakerMinPods             = 3
	defaultWorkers                    = 4
	defaultCNINamespace               = "consul-cni-repair"
	defaultCNIPodSelector             = "app.kubernetes.io/name=consul-cni"
	defaultResync                     = 10 * time.Minute
)

// defaultInjectedPodSelector is the server-side label selector of the pod
// informer: the label the consul-k8s webhook puts on every pod it injects.
var defaultInjectedPodSelector = annotations.KeyInjectStatus + "=" + annotations.InjectStatusInjected

// defaultInitContainerNames are the init containers signal B watches.
var defaultInitContainerNames = []string{annotations.InitContainerName, annotations.CheckContainerName}

// Config holds everything the repair and node-readiness controllers need.
// The zero value is not usable: start from defaultConfig.
type Config struct {
	Action        Action
	DryRun        bool
	Gate          GateMode
	AllowBarePods bool
	MinPodAge     time.Duration
	// SandboxSlack is signal C's tolerance (see Detector.SandboxSlack).
	SandboxSlack       time.Duration
	InitContainerNames []string
	InitExitCode       int32

	// InjectedPodSelector is the label selector of the pod informer.
	InjectedPodSelector string

	// MaxRepairsPerMinute caps actions cluster-wide in any minute. Pods
	// not of the race (see Limiter) are also paced by token buckets of
	// MaxRepairsPerMinute and of MaxRepairsPerNodePerMinute on each node
	// (burst a tenth of a minute's worth, at least 1).
	MaxRepairsPerMinute        int
	MaxRepairsPerNodePerMinute int
	// BackoffBase and BackoffMax bound the per-pod exponential back-off
	// after a failed (or PDB-blocked) action.
	BackoffBase time.Duration
	BackoffMax  time.Duration

	// The circuit breaker opens on a node when at least BreakerMinPods
	// injected pods whose sandbox was created after the node's CNI became
	// ready are broken and they are at least BreakerThreshold of such pods.
	Breaker          bool
	BreakerThreshold float64
	BreakerMinPods   int

	Workers int
	Resync  time.Duration

	// Node readiness.
	NodeReadiness      bool
	CNINamespace       string
	CNIPodSelector     string
	StartupTaintKey    string
	ReaddStartupTaint  bool
	StartupTaintEffect corev1.TaintEffect
}

// defaultConfig returns the documented defaults.
func defaultConfig() Config {
	return Config{
		Action:                     defaultAction,
		Gate:                       defaultGate,
		MinPodAge:                  defaultMinPodAge,
		SandboxSlack:               defaultSandboxSlack,
		InitContainerNames:         append([]string(nil), defaultInitContainerNames...),
		InitExitCode:               annotations.InitCheckExitCode,
		InjectedPodSelector:        defaultInjectedPodSelector,
		MaxRepairsPerMinute:        defaultMaxRepairsPerMinute,
		MaxRepairsPerNodePerMinute: defaultMaxRepairsPerNodePerMinute,
		BackoffBase:                defaultBackoffBase,
		BackoffMax:                 defaultBackoffMax,
		Breaker:                    true,
		BreakerThreshold:           defaultBreakerThreshold,
		BreakerMinPods:             defaultBreakerMinPods,
		Workers:                    defaultWorkers,
		Resync:                     defaultResync,
		NodeReadiness:              true,
		CNINamespace:               defaultCNINamespace,
		CNIPodSelector:             defaultCNIPodSelector,
		StartupTaintKey:            annotations.TaintCNINotReady,
		StartupTaintEffect:         corev1.TaintEffectNoSchedule,
	}
}

// Validate checks every field and names the flag and value of the first bad
// one.
func (c *Config) Validate() error {
	switch c.Action {
	case ActionEvict, ActionDelete, ActionLabel:
	default:
		return fmt.Errorf("--action: %q is not one of evict, delete, label", c.Action)
	}
	switch c.Gate {
	case GateNodeLabel, GateCNIPod, GateNone:
	default:
		return fmt.Errorf("--cni-ready-gate: %q is not one of node-label, cni-pod, none", c.Gate)
	}
	if c.MinPodAge < 0 {
		return fmt.Errorf("--min-pod-age: %s is negative", c.MinPodAge)
	}
	if c.SandboxSlack < time.Second {
		// Both times have second precision: less would judge a pod by
		// the rounding of its clocks.
		return fmt.Errorf("--sandbox-slack: %s is less than 1s", c.SandboxSlack)
	}
	if len(c.InitContainerNames) == 0 {
		return fmt.Errorf("--init-container-name: at least one name is required")
	}
	for _, n := range c.InitContainerNames {
		if errs := validation.IsDNS1123Label(n); len(errs) > 0 {
			return fmt.Errorf("--init-container-name: %q is not a container name: %s", n, errs[0])
		}
	}
	if c.InitExitCode < 1 || c.InitExitCode > 255 {
		return fmt.Errorf("--init-exit-code: %d is not an exit code (1-255)", c.InitExitCode)
	}
	if _, err := labels.Parse(c.InjectedPodSelector); err != nil || c.InjectedPodSelector == "" {
		return fmt.Errorf("--injected-pod-selector: %q is not a non-empty label selector: %v", c.InjectedPodSelector, err)
	}
	if c.MaxRepairsPerMinute < 1 {
		return fmt.Errorf("--max-repairs-per-minute: %d must be at least 1", c.MaxRepairsPerMinute)
	}
	if c.MaxRepairsPerNodePerMinute < 1 {
		return fmt.Errorf("--max-repairs-per-node-per-minute: %d must be at least 1", c.MaxRepairsPerNodePerMinute)
	}
	if c.BackoffBase <= 0 || c.BackoffMax < c.BackoffBase {
		return fmt.Errorf("--backoff-base/--backoff-max: %s/%s: want 0 < base <= max", c.BackoffBase, c.BackoffMax)
	}
	if math.IsNaN(c.BreakerThreshold) || c.BreakerThreshold <= 0 || c.BreakerThreshold > 1 {
		return fmt.Errorf("--breaker-threshold: %v is not a share in (0, 1]", c.BreakerThreshold)
	}
	if c.BreakerMinPods < 1 {
		return fmt.Errorf("--breaker-min-pods: %d must be at least 1", c.BreakerMinPods)
	}
	if c.Workers < 1 {
		return fmt.Errorf("--workers: %d must be at least 1", c.Workers)
	}
	if c.Resync < 0 {
		return fmt.Errorf("--resync-period: %s is negative", c.Resync)
	}
	if c.NodeReadiness || c.Gate == GateCNIPod {
		if errs := validation.IsDNS1123Label(c.CNINamespace); len(errs) > 0 {
			return fmt.Errorf("--cni-namespace: %q is not a namespace name: %s", c.CNINamespace, errs[0])
		}
		sel, err := labels.Parse(c.CNIPodSelector)
		if err != nil {
			return fmt.Errorf("--cni-pod-selector: %q: %v", c.CNIPodSelector, err)
		}
		if sel.Empty() {
			return fmt.Errorf("--cni-pod-selector: %q selects every pod of the namespace; name the CNI DaemonSet's pods", c.CNIPodSelector)
		}
	}
	if c.NodeReadiness {
		if errs := validation.IsQualifiedName(c.StartupTaintKey); len(errs) > 0 {
			return fmt.Errorf("--startup-taint-key: %q is not a taint key: %s", c.StartupTaintKey, errs[0])
		}
		switch c.StartupTaintEffect {
		case corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
		default:
			return fmt.Errorf("--startup-taint-effect: %q is not one of NoSchedule, PreferNoSchedule, NoExecute", c.StartupTaintEffect)
		}
	}
	return nil
}

func (c *Config) detector() Detector {
	return Detector{InitContainerNames: c.InitContainerNames, InitExitCode: c.InitExitCode, MinPodAge: c.MinPodAge, SandboxSlack: c.SandboxSlack}
}
