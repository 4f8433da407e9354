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
