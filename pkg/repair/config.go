package repair

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/configkey"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
)

// Defaults of the controller's own settings (also the flags' defaults).
const (
	defaultMaxRepairsPerMinute        = 30
	defaultMaxRepairsPerNodePerMinute = 10
	defaultBackoffBase                = 5 * time.Second
	defaultBackoffMax                 = 5 * time.Minute
	defaultWorkers                    = 4
	defaultResync                     = 10 * time.Minute
)

// Config holds everything the repair and node-readiness controllers need:
// the judgement's settings (judge.Config, shared with the audit) and the
// controllers' own. The zero value is not usable: start from defaultConfig.
type Config struct {
	judge.Config

	DryRun bool

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

	Workers int
	Resync  time.Duration

	// Node readiness (package nodeready).
	NodeReadiness      bool
	StartupTaintKey    string
	ReaddStartupTaint  bool
	StartupTaintEffect corev1.TaintEffect
}

// defaultConfig returns the documented defaults.
func defaultConfig() Config {
	return Config{
		Config:                     judge.DefaultConfig(),
		MaxRepairsPerMinute:        defaultMaxRepairsPerMinute,
		MaxRepairsPerNodePerMinute: defaultMaxRepairsPerNodePerMinute,
		BackoffBase:                defaultBackoffBase,
		BackoffMax:                 defaultBackoffMax,
		Workers:                    defaultWorkers,
		Resync:                     defaultResync,
		NodeReadiness:              true,
		StartupTaintKey:            annotations.TaintCNINotReady,
		StartupTaintEffect:         corev1.TaintEffectNoSchedule,
	}
}

// Validate checks every field; the error of the first bad one is a
// *configkey.Error naming its key (the field name) and value.
func (c *Config) Validate() error {
	// Node readiness reads the CNI pods as the cni-pod gate does.
	if err := c.Config.Validate(c.NodeReadiness); err != nil {
		return err
	}
	if c.MaxRepairsPerMinute < 1 {
		return configkey.New("MaxRepairsPerMinute", c.MaxRepairsPerMinute, "must be at least 1")
	}
	if c.MaxRepairsPerNodePerMinute < 1 {
		return configkey.New("MaxRepairsPerNodePerMinute", c.MaxRepairsPerNodePerMinute, "must be at least 1")
	}
	if c.BackoffBase <= 0 || c.BackoffMax < c.BackoffBase {
		return configkey.Errorf("BackoffBase"+configkey.Sep+"BackoffMax", "%s/%s: want 0 < base <= max", c.BackoffBase, c.BackoffMax)
	}
	if c.Workers < 1 {
		return configkey.New("Workers", c.Workers, "must be at least 1")
	}
	if c.Resync < 0 {
		return configkey.New("Resync", c.Resync, "is negative")
	}
	if c.NodeReadiness {
		if errs := validation.IsQualifiedName(c.StartupTaintKey); len(errs) > 0 {
			return configkey.New("StartupTaintKey", c.StartupTaintKey, "is not a taint key: "+errs[0])
		}
		switch c.StartupTaintEffect {
		case corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
		default:
			return configkey.New("StartupTaintEffect", string(c.StartupTaintEffect), "is not one of NoSchedule, PreferNoSchedule, NoExecute")
		}
	}
	return nil
}
