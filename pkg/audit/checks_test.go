package audit

import (
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// lease is the controller's Lease in ns consul-cni-repair, held by holder
// and renewed renewed ago, for 15 s.
func lease(holder string, renewed time.Duration) *coordinationv1.Lease {
	d := int32(15)
	t := metav1.NewMicroTime(time.Now().Add(-renewed))
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "consul-cni-repair", Namespace: "consul-cni-repair"},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &d, RenewTime: &t},
	}
}

// The checks of the install decide the exit code (4 when one fails, before
// pods outside the mesh), say on stderr what each found, and never pass
// without having seen a working controller and a labelled node.
func TestChecksOfTheInstall(t *testing.T) {
	checks := []string{"--controller-lease=consul-cni-repair/consul-cni-repair", "--check-node-readiness"}
	for _, tc := range []struct {
		name string
		args []string
		objs []runtime.Object
		code int
		want string // on stderr
	}{
		{"working", checks, []runtime.Object{lease("pod-a", 3*time.Second), readyNode("n1"), cniPod("n1", true), notReadyNode("n2"), cniPod("n2", false)},
			ExitNoneOutside, "ok: node readiness: the 1 nodes with a Ready pod"},
		{"no Lease", checks, []runtime.Object{readyNode("n1"), cniPod("n1", true)},
			ExitUnhealthy, "FAIL: controller: no Lease consul-cni-repair/consul-cni-repair: no controller has led yet"},
		{"no leader", checks, []runtime.Object{lease("", 3*time.Second), readyNode("n1"), cniPod("n1", true)},
			ExitUnhealthy, "FAIL: controller: Lease consul-cni-repair/consul-cni-repair has no leader"},
		{"leader gone", checks, []runtime.Object{lease("pod-a", time.Minute), readyNode("n1"), cniPod("n1", true)},
			ExitUnhealthy, "last renewed by pod-a 1m0s ago, longer than its duration 15s"},
		{"a Ready node unlabelled", checks, []runtime.Object{lease("pod-a", time.Second), readyNode("n1"), cniPod("n1", true), notReadyNode("n2"), cniPod("n2", true)},
			ExitUnhealthy, "FAIL: node readiness: 1 of 2 nodes with a Ready pod of the CNI pods app.kubernetes.io/name=consul-cni in consul-cni-repair lack the label consul.hashicorp.com/cni=ready: n2"},
		{"no Ready CNI pod", checks, []runtime.Object{lease("pod-a", time.Second), readyNode("n1"), cniPod("n1", false)},
			ExitUnhealthy, "FAIL: node readiness: no Ready pod"},
		{"unhealthy before outside", checks, []runtime.Object{lease("", 0), readyNode("n1"), cniPod("n1", true), injected("stuck", "n1", stuck)},
			ExitUnhealthy, "1 of 1 injected pods outside the mesh"},
		{"outside, --fail-outside=false", append(checks, "--fail-outside=false"), []runtime.Object{lease("pod-a", 0), readyNode("n1"), cniPod("n1", true), injected("stuck", "n1", stuck)},
			ExitNoneOutside, "1 of 1 injected pods outside the mesh"},
		{"outside", checks, []runtime.Object{lease("pod-a", 0), readyNode("n1"), cniPod("n1", true), injected("stuck", "n1", stuck)},
			ExitOutside, "ok: controller: Lease consul-cni-repair/consul-cni-repair held by pod-a"},
	} {
		code, _, stderr := main(t, tc.args, clientOf(tc.objs...))
		if code != tc.code || !strings.Contains(stderr, tc.want) {
			t.Errorf("%s: exit %d, stderr %q; want %d and %q", tc.name, code, stderr, tc.code, tc.want)
		}
	}
}

// With --checks-timeout the checks are repeated until they pass: a Lease
// that gets a leader while they wait passes.
func TestChecksRepeatUntilTheyPass(t *testing.T) {
	old := checkInterval
	checkInterval = 10 * time.Millisecond
	t.Cleanup(func() { checkInterval = old })
	newClient := func(gets *int) ClientFunc {
		return func(*Options) (kubernetes.Interface, error) {
			c := fake.NewClientset()
			c.PrependReactor("get", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
				*gets++
				if *gets < 3 {
					return true, lease("", 0), nil
				}
				return true, lease("pod-a", 0), nil
			})
			return c, nil
		}
	}
	var gets int
	code, _, stderr := main(t, []string{"--controller-lease=consul-cni-repair/consul-cni-repair", "--checks-timeout=10s"}, newClient(&gets))
	if code != ExitNoneOutside || gets != 3 || !strings.Contains(stderr, "ok: controller") || strings.Contains(stderr, "FAIL") {
		t.Errorf("--checks-timeout=10s: exit %d after %d checks, stderr %q; want 0 after the third", code, gets, stderr)
	}
	gets = 0
	code, _, stderr = main(t, []string{"--controller-lease=consul-cni-repair/consul-cni-repair"}, newClient(&gets))
	if code != ExitUnhealthy || gets != 1 || !strings.Contains(stderr, "FAIL: controller") {
		t.Errorf("without --checks-timeout: exit %d after %d checks, stderr %q; want 4 after one", code, gets, stderr)
	}
}

func TestChecksFlagsValidated(t *testing.T) {
	for _, args := range [][]string{{"--controller-lease=nameonly"}, {"--controller-lease=a/b/c"}, {"--controller-lease=/b"}, {"--checks-timeout=-1s"}} {
		if code, _, stderr := main(t, args, clientOf()); code != ExitUsage || !strings.Contains(stderr, strings.SplitN(args[0], "=", 2)[0]) {
			t.Errorf("%q: exit %d, stderr %q; want a usage error naming the flag", args, code, stderr)
		}
	}
}
