package realnode

import (
	"bytes"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// The containerd configuration carries the settings this machine needs and
// keeps every path in the node's directory.
func TestContainerdConfig(t *testing.T) {
	n := &Node{Dir: "/tmp/ccr-realnode-x"}
	n.paths = newPaths(n.Dir, "/bin-dir")
	var b bytes.Buffer
	if err := containerdConfig.Execute(&b, map[string]string{
		"Root": n.paths.containerdRoot, "State": n.paths.containerdState, "Sock": n.paths.containerdSock,
		"Opt": n.paths.containerdOpt, "Pause": PauseImage, "Runc": "/bin-dir/runc",
		"RuncRoot": n.paths.runcRoot, "CNIBin": n.paths.cniBin, "CNIConf": n.paths.cniConf,
	}); err != nil {
		t.Fatal(err)
	}
	conf := b.String()
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
// this machine needs.
func TestKubeletConfig(t *testing.T) {
	var b bytes.Buffer
	if err := kubeletConfig.Execute(&b, map[string]any{
		"IP": "198.18.0.1", "Port": KubeletPort, "CA": "/ca.crt", "Cgroup": "ccr-realnode-x",
		"Sock": "/x/containerd.sock", "PodLogs": "/x/pod-logs", "VolumePlugins": "/x/vp", "ResolvConf": "/x/resolv.conf",
		"Taints": []corev1.Taint{{Key: "example.test/not-ready", Value: "true", Effect: corev1.TaintEffectNoSchedule}},
	}); err != nil {
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
	if err := yaml.Unmarshal(b.Bytes(), &cfg); err != nil {
		t.Fatalf("%v:\n%s", err, b.String())
	}
	if cfg.FailCgroupV1 == nil || *cfg.FailCgroupV1 || cfg.MakeIPTablesChains == nil || *cfg.MakeIPTablesChains {
		t.Errorf("failCgroupV1 %v makeIPTablesUtilChains %v, want both false", cfg.FailCgroupV1, cfg.MakeIPTablesChains)
	}
	if cfg.CgroupRoot != "/ccr-realnode-x" || cfg.CgroupDriver != "cgroupfs" || cfg.Endpoint != "unix:///x/containerd.sock" || cfg.Port != KubeletPort {
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
