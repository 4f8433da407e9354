package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
)

func parse(t *testing.T, args ...string) (*options, error) {
	t.Helper()
	o := &options{}
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	return o, o.Validate()
}

func TestOptions(t *testing.T) {
	o, err := parse(t)
	if err != nil {
		t.Fatal(err)
	}
	if o.ExitCode != annotations.InitCheckExitCode || o.AnnotationsFile != "/consul/podinfo/annotations" || o.TerminationLog != "/dev/termination-log" {
		t.Errorf("defaults %+v", o)
	}
	for _, tc := range []struct {
		args    []string
		wantErr string
	}{
		{[]string{"--timeout=0s"}, "--timeout"},
		{[]string{"--exit-code=0"}, "--exit-code"},
		{[]string{"--exit-code=1"}, "--exit-code"},
		{[]string{"--exit-code=256"}, "--exit-code"},
		{[]string{"--probe-address=10.0.0.1"}, "--probe-address"},
		{[]string{"--api=maybe"}, "--api"},
		{[]string{"--api=true", "--pod-name="}, "--pod-name"},
		{[]string{"--annotations-file=", "--api=false"}, "no source"},
	} {
		if _, err := parse(t, tc.args...); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%v: err = %v, want %q", tc.args, err, tc.wantErr)
		}
	}
}

func TestRunExitCodes(t *testing.T) {
	dir := t.TempDir()
	ann := filepath.Join(dir, "annotations")
	tl := filepath.Join(dir, "termination-log")
	write := func(status string) {
		os.WriteFile(ann, []byte(fmt.Sprintf("%s=%q\n%s=%q", annotations.KeyInjectStatus, "injected", annotations.KeyTransparentProxyStatus, status)), 0o644)
	}
	common := []string{"--annotations-file", ann, "--api=false", "--termination-log", tl, "--interval=20ms"}
	write("complete")
	if code := run(append(common, "--timeout=10s")); code != 0 {
		t.Fatalf("complete: exit %d", code)
	}
	write("enabled")
	if code := run(append(common, "--timeout=200ms")); code != annotations.InitCheckExitCode {
		t.Fatalf("enabled: exit %d", code)
	}
	if b, _ := os.ReadFile(tl); !strings.Contains(string(b), `"enabled"`) {
		t.Errorf("termination message %q", b)
	}
	if code := run(append(common, "--timeout=200ms", "--exit-code=42")); code != 42 {
		t.Fatalf("--exit-code=42: exit %d", code)
	}
	if code := run([]string{"--timeout=-1s"}); code != 2 {
		t.Fatalf("bad flag: exit %d", code)
	}
	if code := run([]string{"extra"}); code != 2 {
		t.Fatalf("extra argument: exit %d", code)
	}
}

// The documented example must be one the check accepts and whose paths
// line up: the annotations file inside a downward-API volume of
// metadata.annotations, a UID the probe may run as.
func TestDocumentedExample(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(testbin.RepoRoot(), "docs", "examples", "init-check", "app.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var d appsv1.Deployment
	if err := yaml.UnmarshalStrict(b, &d); err != nil {
		t.Fatal(err)
	}
	spec := d.Spec.Template.Spec
	if len(spec.InitContainers) == 0 || spec.InitContainers[0].Name != annotations.CheckContainerName {
		t.Fatalf("the check is not the first init container, named %s", annotations.CheckContainerName)
	}
	c := spec.InitContainers[0]
	if !strings.HasSuffix(c.Image, "/consul-cni-check") {
		t.Errorf("image %q", c.Image)
	}
	o, err := parse(t, c.Args...)
	if err != nil {
		t.Fatalf("args %v: %v", c.Args, err)
	}
	if !o.Probe {
		t.Errorf("the example does not enable the probe")
	}
	var vol *corev1.Volume
	for _, m := range c.VolumeMounts {
		if strings.HasPrefix(o.AnnotationsFile, m.MountPath+"/") {
			for i := range spec.Volumes {
				if spec.Volumes[i].Name == m.Name {
					vol = &spec.Volumes[i]
				}
			}
			rel := strings.TrimPrefix(o.AnnotationsFile, m.MountPath+"/")
			if vol == nil || vol.DownwardAPI == nil {
				t.Fatalf("%s is not in a downward-API volume", o.AnnotationsFile)
			}
			found := false
			for _, it := range vol.DownwardAPI.Items {
				if it.Path == rel && it.FieldRef != nil && it.FieldRef.FieldPath == "metadata.annotations" {
					found = true
				}
			}
			if !found {
				t.Errorf("the volume has no item %s of metadata.annotations", rel)
			}
		}
	}
	if vol == nil {
		t.Fatalf("no volume mounted over %s", o.AnnotationsFile)
	}
	sc := c.SecurityContext
	if sc == nil || sc.RunAsUser == nil || *sc.RunAsUser == annotations.ProxyUID || *sc.RunAsUser == annotations.InitUID || *sc.RunAsUser == 0 {
		t.Errorf("the check must run as a non-root UID other than %d and %d", annotations.ProxyUID, annotations.InitUID)
	}
}
