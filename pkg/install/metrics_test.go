package install

import (
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/version"
)

func TestBuildInfo(t *testing.T) {
	old := version.Version
	t.Cleanup(func() { version.Version = old })
	version.Version = "v1.2.3-test"
	reg := prometheus.NewRegistry()
	NewMetrics(reg)
	want := `
# HELP consul_cni_installer_build_info Build information; always 1.
# TYPE consul_cni_installer_build_info gauge
consul_cni_installer_build_info{go_version="` + runtime.Version() + `",version="v1.2.3-test"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), MetricsPrefix+"build_info"); err != nil {
		t.Fatal(err)
	}
}

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
