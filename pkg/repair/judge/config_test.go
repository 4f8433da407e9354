package judge_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/configkey"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
)

func TestConfigValidate(t *testing.T) {
	configFields := map[string]bool{}
	for f := range reflect.TypeFor[judge.Config]().Fields() {
		configFields[f.Name] = true
	}
	for name, mut := range map[string]func(*judge.Config){
		"action":        func(c *judge.Config) { c.Action = "kill" },
		"gate":          func(c *judge.Config) { c.Gate = "maybe" },
		"exit code":     func(c *judge.Config) { c.InitExitCode = 0 },
		"threshold":     func(c *judge.Config) { c.BreakerThreshold = 1.5 },
		"init name":     func(c *judge.Config) { c.InitContainerNames = []string{"Bad_Name"} },
		"selector":      func(c *judge.Config) { c.InjectedPodSelector = "a in (" },
		"cni selector":  func(c *judge.Config) { c.CNIPodSelector = "" },
		"sandbox slack": func(c *judge.Config) { c.SandboxSlack = 500 * time.Millisecond },
	} {
		c := judge.DefaultConfig()
		mut(&c)
		if err := c.Validate(true); err == nil {
			t.Errorf("%s: accepted", name)
		} else if ke := (*configkey.Error)(nil); !errors.As(err, &ke) || !configFields[ke.Keys()[0]] || strings.Contains(err.Error(), "--") {
			t.Errorf("%s: error does not name the key (a Config field): %v", name, err)
		}
	}
	c := judge.DefaultConfig()
	if err := c.Validate(true); err != nil {
		t.Fatalf("defaults: %v", err)
	}
}

// The CNI pod settings are checked only when something reads CNI pods: the
// cni-pod gate, or what the caller says (node readiness).
func TestConfigValidateCNIPodsOnlyWhenRead(t *testing.T) {
	c := judge.DefaultConfig()
	c.CNINamespace = "Not A Namespace"
	if err := c.Validate(false); err != nil {
		t.Fatalf("node-label gate, nothing else reads CNI pods: %v", err)
	}
	if err := c.Validate(true); err == nil {
		t.Fatal("node readiness reads CNI pods: bad namespace accepted")
	}
	c.Gate = judge.GateCNIPod
	if err := c.Validate(false); err == nil {
		t.Fatal("cni-pod gate: bad namespace accepted")
	}
}
