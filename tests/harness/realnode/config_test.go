package realnode

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
)

// The containerd configuration carries the settings a test node needs and
// keeps every path in the node's directory.
func TestContainerdConfig(t *testing.T) {
	n := &Node{Dir: t.TempDir()}
	n.paths = newPaths(n.Dir, "/bin-dir")
	if err := n.writeContainerdConfig(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(n.paths.containerdConfig)
	if err != nil {
		t.Fatal(err)
	}
	conf := string(b)
	for _, want := range []string{
		"version = 3",
		"restrict_oom_score_adj = true",
		"disable_apparmor = true",
		"netns_mounts_under_state_dir = true",
		`sandbox = "` + PauseImage + `"`,
		`BinaryName = "/bin-dir/runc"`,
		"max_conf_num = 1",
		`"io.containerd.nri.v1.nri"`,
	} {
		if !strings.Contains(conf, want) {
			t.Errorf("containerd config lacks %q:\n%s", want, conf)
		}
	}
	for _, line := range strings.Split(conf, "\n") {
		if i := strings.Index(line, `= "/`); i >= 0 && !strings.Contains(line, n.Dir) && !strings.Contains(line, "/bin-dir") {
			t.Errorf("path outside the node's directory: %s", line)
		}
	}
}

// The KubeletConfiguration is valid YAML with the taints and the settings
// a test node needs.
func TestKubeletConfig(t *testing.T) {
	dir := t.TempDir()
	n := &Node{Dir: filepath.Join(dir, "ccr-realnode-x"), IP: netip.MustParseAddr("198.18.0.1"), c: &cluster.Cluster{CAFile: "/ca.crt"},
		opts: Options{Taints: []corev1.Taint{{Key: "example.test/not-ready", Value: "true", Effect: corev1.TaintEffectNoSchedule}}}}
	n.paths = newPaths(dir, "/bin-dir")
	if err := n.writeKubeletConfiguration(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(n.paths.kubeletConfig)
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		FailCgroupV1       *bool          `json:"failCgroupV1"`
		CgroupRoot         string         `json:"cgroupRoot"`
		CgroupDriver       string         `json:"cgroupDriver"`
		Endpoint           string         `json:"containerRuntimeEndpoint"`
		MakeIPTablesChains *bool          `json:"makeIPTablesUtilChains"`
		RegisterWithTaints []corev1.Taint `json:"registerWithTaints"`
		Port               int            `json:"port"`
	}
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		t.Fatalf("%v:\n%s", err, b)
	}
	if cfg.FailCgroupV1 == nil || *cfg.FailCgroupV1 || cfg.MakeIPTablesChains == nil || *cfg.MakeIPTablesChains {
		t.Errorf("failCgroupV1 %v makeIPTablesUtilChains %v, want both false", cfg.FailCgroupV1, cfg.MakeIPTablesChains)
	}
	if cfg.CgroupRoot != "/ccr-realnode-x" || cfg.CgroupDriver != "cgroupfs" || cfg.Endpoint != "unix://"+n.paths.containerdSock || cfg.Port != KubeletPort {
		t.Errorf("config %+v", cfg)
	}
	if len(cfg.RegisterWithTaints) != 1 || cfg.RegisterWithTaints[0].Key != "example.test/not-ready" || cfg.RegisterWithTaints[0].Effect != corev1.TaintEffectNoSchedule {
		t.Errorf("registerWithTaints %+v", cfg.RegisterWithTaints)
	}
}

func TestUnescapeMount(t *testing.T) {
	for in, want := range map[string]string{`/a\040b`: "/a b", `/plain`: "/plain", `/x\134y`: `/x\y`} {
		if got := unescapeMount(in); got != want {
			t.Errorf("unescapeMount(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestJoinLabels(t *testing.T) {
	if got := joinLabels(map[string]string{"b": "2", "a": "1"}); got != "a=1,b=2" {
		t.Errorf("got %q", got)
	}
}
