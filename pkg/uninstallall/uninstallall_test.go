package uninstallall

import (
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
)

func daemonSet() *appsv1.DaemonSet {
	sel := map[string]string{"app.kubernetes.io/name": "consul-cni"}
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "consul-cni", Namespace: "ns", Generation: 1},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: sel},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: sel},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "installer", Args: []string{"run", "--metrics-bind-address=:9313"},
					ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"consul-cni-installer", "ready"}}}},
				}}},
			},
		},
		Status: appsv1.DaemonSetStatus{ObservedGeneration: 1, DesiredNumberScheduled: 1, UpdatedNumberScheduled: 1, NumberReady: 1},
	}
}

func pod(name, node string, remover, ready bool) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", Labels: map[string]string{"app.kubernetes.io/name": "consul-cni"}},
		Spec:       corev1.PodSpec{NodeName: node},
	}
	if remover {
		p.Labels[annotations.LabelInstallerMode] = annotations.InstallerModeUninstall
	}
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}
	return p
}

func TestRunPatchesAndNamesWhatIsNotClean(t *testing.T) {
	c := fake.NewClientset(daemonSet(), pod("installer-a", "node-a", false, true))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := Run(ctx, c, Options{Namespace: "ns", DaemonSet: "consul-cni", HostNetDir: "/etc/cni/net.d", Poll: time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), `node "node-a": pod installer-a is an installer`) {
		t.Fatalf("Run: %v, want an error naming node-a's installer", err)
	}
	ds, err := c.AppsV1().DaemonSets("ns").Get(context.Background(), "consul-cni", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tpl := ds.Spec.Template
	if tpl.Labels[annotations.LabelInstallerMode] != annotations.InstallerModeUninstall {
		t.Errorf("template labels %v", tpl.Labels)
	}
	ctr := tpl.Spec.Containers[0]
	if got := strings.Join(ctr.Args, " "); got != "uninstall --wait --resync=10s --cni-bin-dir=/host/opt/cni/bin --cni-net-dir=/host/etc/cni/net.d --host-cni-net-dir=/etc/cni/net.d" {
		t.Errorf("args %q", got)
	}
	if got := strings.Join(ctr.ReadinessProbe.Exec.Command, " "); !strings.HasPrefix(got, "consul-cni-installer uninstalled ") {
		t.Errorf("probe %q", got)
	}
	if ru := ds.Spec.UpdateStrategy.RollingUpdate; ru == nil || ru.MaxSurge.IntValue() != 0 || ru.MaxUnavailable.String() != "100%" {
		t.Errorf("rolling update %+v", ru)
	}
	if a := tpl.Spec.AutomountServiceAccountToken; a == nil || *a {
		t.Errorf("automountServiceAccountToken %v", a)
	}
}

func TestNotClean(t *testing.T) {
	ctx := context.Background()
	behind := daemonSet()
	behind.Generation = 2
	for name, tc := range map[string]struct {
		ds   *appsv1.DaemonSet
		pods []*corev1.Pod
		want string
	}{
		"clean":             {ds: daemonSet(), pods: []*corev1.Pod{pod("r", "a", true, true)}},
		"status behind":     {ds: behind, pods: []*corev1.Pod{pod("r", "a", true, true)}, want: "generation 2 not observed"},
		"remover not ready": {ds: daemonSet(), pods: []*corev1.Pod{pod("r", "a", true, false)}, want: `node "a": pod r is not Ready`},
		"old installer":     {ds: daemonSet(), pods: []*corev1.Pod{pod("r", "a", true, true), pod("i", "b", false, true)}, want: `node "b": pod i is an installer`},
	} {
		t.Run(name, func(t *testing.T) {
			c := fake.NewClientset(tc.ds)
			for _, p := range tc.pods {
				if _, err := c.CoreV1().Pods("ns").Create(ctx, p, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			left, err := NotClean(ctx, c, "ns", "consul-cni")
			if err != nil {
				t.Fatal(err)
			}
			got := strings.Join(left, "; ")
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Errorf("NotClean: %q, want %q", got, tc.want)
			}
		})
	}
}

func TestRunReturnsOnceClean(t *testing.T) {
	ds := daemonSet()
	ds.Spec.Template.Labels[annotations.LabelInstallerMode] = annotations.InstallerModeUninstall
	c := fake.NewClientset(ds, pod("r", "a", true, true))
	if err := Run(context.Background(), c, Options{Namespace: "ns", DaemonSet: "consul-cni", HostNetDir: "/etc/cni/net.d"}); err != nil {
		t.Fatal(err)
	}
}

func TestPatchRejectsRelativeDir(t *testing.T) {
	if _, err := Patch("etc/cni"); err == nil || !strings.Contains(err.Error(), `"etc/cni"`) {
		t.Errorf("Patch: %v", err)
	}
}
