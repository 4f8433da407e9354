//go:build integration

package manifests

import (
	"context"
	"testing"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
)

// The local cluster (`make cluster`) installs minimal Prometheus Operator
// CRDs, so every overlay applies there as it is, its ServiceMonitor and
// PrometheusRule included: `kubectl apply -k` exits 0 (here as a
// server-side dry run of each object).
func TestOverlaysApplyWholeOnLocalCluster(t *testing.T) {
	c := cluster.Shared(t)
	ctx := context.Background()
	if err := c.InstallPrometheusOperatorCRDs(ctx); err != nil {
		t.Fatal(err)
	}
	a := newApplier(t, c) // discovers the CRDs' kinds
	if _, err := a.apply(ctx, find(t, buildOverlay(t, "base"), "Namespace", namespace), false); err != nil {
		t.Fatal(err)
	}
	for _, ov := range overlayNames() {
		t.Run(ov, func(t *testing.T) {
			monitoring := 0
			for _, o := range buildOverlay(t, ov) {
				if _, err := a.apply(ctx, o, true); err != nil {
					t.Errorf("server-side dry run: %v", err)
				}
				if gvkOf(o).Group == monitoringGroup {
					monitoring++
				}
			}
			if monitoring == 0 {
				t.Errorf("overlay %s has no Prometheus Operator object: nothing tested", ov)
			}
		})
	}
}
