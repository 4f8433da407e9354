package install

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestInstallerCountersBornAtZero: every counter series exists at 0 before
// the first pass, so that increase() sees the first error or write.
func TestInstallerCountersBornAtZero(t *testing.T) {
	reg := prometheus.NewRegistry()
	NewMetrics(reg)
	const want = `
# HELP consul_cni_installer_reconciles_total Passes over the node's CNI configuration, by result (chained, waiting: no primary network yet, error).
# TYPE consul_cni_installer_reconciles_total counter
consul_cni_installer_reconciles_total{result="chained"} 0
consul_cni_installer_reconciles_total{result="error"} 0
consul_cni_installer_reconciles_total{result="waiting"} 0
# HELP consul_cni_installer_writes_total Files the installer wrote, by what (binary, kubeconfig, token, chain, convert).
# TYPE consul_cni_installer_writes_total counter
consul_cni_installer_writes_total{what="binary"} 0
consul_cni_installer_writes_total{what="chain"} 0
consul_cni_installer_writes_total{what="convert"} 0
consul_cni_installer_writes_total{what="kubeconfig"} 0
consul_cni_installer_writes_total{what="token"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "consul_cni_installer_reconciles_total", "consul_cni_installer_writes_total"); err != nil {
		t.Fatal(err)
	}
}
