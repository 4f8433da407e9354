//go:build integration

package audit

import (
	"bytes"
	"context"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/scenario"
)

// TestAuditRealBypassingPods audits the race reproduced for real (no
// repair): the pods whose sandbox was made before consul-cni was chained
// bypass the proxy and are reported; the control pod created afterwards is
// meshed and is not.
func TestAuditRealBypassingPods(t *testing.T) {
	c := cluster.Shared(t)
	env := scenario.NewEnv(t, c)
	env.Logf = t.Logf
	var r Report
	var code int
	var stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	res, err := scenario.Run(ctx, env, scenario.Config{
		Mode: scenario.NoRepair, Pods: 2, CNIDelay: 2 * time.Second, Observe: 8 * time.Second, DirectChain: true,
		Inspect: func(ctx context.Context, ns string) error {
			var out bytes.Buffer
			code = Main(ctx, "repair audit", []string{"-n", ns, "--min-pod-age=5s", "-o", "yaml"}, &out, &stderr,
				func(*Options) (kubernetes.Interface, error) { return c.Client, nil })
			return yaml.Unmarshal(out.Bytes(), &r)
		},
	})
	if err != nil {
		t.Fatalf("no-repair run: %v (audit stderr %s)", err, stderr.String())
	}
	if code != ExitOutside {
		t.Fatalf("exit %d, want %d; stderr %s", code, ExitOutside, stderr.String())
	}
	reported := map[string]Pod{}
	for _, p := range r.Outside {
		reported[p.Name] = p
	}
	bypassing := 0
	for _, p := range res.PodResults {
		if p.Bypass == 0 {
			continue
		}
		bypassing++
		if _, ok := reported[p.Name]; !ok {
			t.Errorf("pod %s bypassed the proxy (%d probes) and is not reported; report %+v", p.Name, p.Bypass, r.Outside)
		}
	}
	if bypassing == 0 || len(r.Outside) != bypassing {
		t.Errorf("%d pods bypassed, %d reported: %+v", bypassing, len(r.Outside), r.Outside)
	}
	if res.Control == nil {
		t.Fatal("no control pod")
	}
	if p, ok := reported[res.Control.Name]; ok {
		t.Errorf("the meshed control pod is reported: %+v", p)
	}
	t.Logf("reported: %+v", r.Outside)
}
