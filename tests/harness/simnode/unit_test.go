package simnode

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

func TestImageBase(t *testing.T) {
	for in, want := range map[string]string{
		"podprog":                                "podprog",
		"podprog:1.0":                            "podprog",
		"ghcr.io/consul-cni-repair/repair:v1":    "repair",
		"registry:5000/org/podprog:1.0@sha256:0": "podprog",
		"hashicorp/consul-dataplane@sha256:abc":  "consul-dataplane",
	} {
		if got := imageBase(in); got != want {
			t.Errorf("imageBase(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestProgramByTag(t *testing.T) {
	n := &Node{cfg: Config{Programs: map[string]string{"installer": "/any", "installer:v2": "/v2"}}}
	for image, want := range map[string]string{
		"registry.example/installer:v1":          "/any",
		"registry.example/installer:v2":          "/v2",
		"registry.example/installer":             "/any",
		"registry.example/installer:v2@sha256:0": "/v2",
		"registry.example/other:v2":              "",
	} {
		if got, _ := n.program(image); got != want {
			t.Errorf("program(%q) = %q, want %q", image, got, want)
		}
	}
}

func TestExpandVars(t *testing.T) {
	vars := map[string]string{"A": "1", "POD": "web"}
	lookup := func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	for in, want := range map[string]string{
		"$(A)-$(POD)":   "1-web",
		"$$(A)":         "$(A)",
		"$(MISSING)":    "$(MISSING)",
		"plain":         "plain",
		"$(A":           "$(A",
		"x$":            "x$",
		"--name=$(POD)": "--name=web",
	} {
		if got := expandVars(in, lookup); got != want {
			t.Errorf("expandVars(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestRebase(t *testing.T) {
	c := &corev1.Container{
		VolumeMounts:           []corev1.VolumeMount{{Name: "bin", MountPath: "/host/opt/cni/bin"}, {Name: "conf", MountPath: "/host/etc/cni/net.d/"}, {Name: "sub", MountPath: "/data", SubPath: "x"}},
		TerminationMessagePath: "",
	}
	v := &volumes{
		dirs:      map[string]string{"bin": "/root/opt/cni/bin", "conf": "/root/etc/cni/net.d", "sub": "/pod/volumes/sub"},
		hostPaths: map[string]string{"/opt/cni/bin": "/root/opt/cni/bin", "/etc/cni/net.d": "/root/etc/cni/net.d"},
	}
	r := newRebaser(c, v, "/pod/containers/app/0/termination-log")
	for in, want := range map[string]string{
		"/host/opt/cni/bin":                      "/root/opt/cni/bin",
		"/host/opt/cni/bin/consul-cni":           "/root/opt/cni/bin/consul-cni",
		"--cni-net-dir=/host/etc/cni/net.d":      "--cni-net-dir=/root/etc/cni/net.d",
		"--host-cni-net-dir=/etc/cni/net.d":      "--host-cni-net-dir=/root/etc/cni/net.d",
		"/host/opt/cni/binary":                   "/host/opt/cni/binary",
		"/data/f":                                "/pod/volumes/sub/x/f",
		"/dev/termination-log":                   "/pod/containers/app/0/termination-log",
		"--termination-log=/dev/termination-log": "--termination-log=/pod/containers/app/0/termination-log",
		"relative/path":                          "relative/path",
		"/elsewhere":                             "/elsewhere",
	} {
		if got := r.value(in); got != want {
			t.Errorf("rebase(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestBackoff(t *testing.T) {
	w := &podWorker{n: &Node{cfg: Config{RestartBackoff: 10 * time.Second, MaxRestartBackoff: 40 * time.Second}}}
	want := []time.Duration{0, 0, 10 * time.Second, 20 * time.Second, 40 * time.Second, 40 * time.Second}
	for runs, d := range want {
		if got := w.backoff(runs); got != d {
			t.Errorf("backoff(%d) = %v, want %v", runs, got, d)
		}
	}
}

func TestFormatMapAndFieldValue(t *testing.T) {
	p := &corev1.Pod{}
	p.Annotations = map[string]string{"b": "2", "a": `x"y`}
	if got, want := formatMap(p.Annotations), "a=\"x\\\"y\"\nb=\"2\""; got != want {
		t.Fatalf("formatMap = %q, want %q", got, want)
	}
	if v, err := fieldValue(p, "metadata.annotations['b']"); err != nil || v != "2" {
		t.Fatalf("annotation subscript: %q %v", v, err)
	}
	if _, err := fieldValue(p, "spec.unknown"); err == nil {
		t.Fatal("unknown field path accepted")
	}
}
