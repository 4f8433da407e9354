//go:build integration

package verify

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/initcheck"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/iptables"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/realnode"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

// checkImage imports the project's consul-cni-check image into the node
// and returns its reference.
func (n *node) checkImage(t *testing.T) string {
	t.Helper()
	for _, img := range realnode.ProjectImages(t, "verify") {
		if strings.Contains(img.Ref, "/"+annotations.CheckContainerName+":") {
			if err := n.ImportImage(context.Background(), img.Archive); err != nil {
				t.Fatal(err)
			}
			return img.Ref
		}
	}
	t.Fatal("realnode.ProjectImages built no consul-cni-check image")
	return ""
}

// checkFailure waits until the pod's check init container has terminated
// with a code other than 0 at least once, and returns that termination.
func (n *node) checkFailure(t *testing.T, ns, app string) (*corev1.Pod, *corev1.ContainerStateTerminated) {
	t.Helper()
	var pod *corev1.Pod
	var term *corev1.ContainerStateTerminated
	var first types.UID
	poll.Eventually(t, 2*time.Minute, "the check of "+app+" failed", func() (bool, error) {
		l, err := n.c.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "app=" + app})
		if err != nil || len(l.Items) == 0 {
			return false, fmt.Errorf("pods: %v", err)
		}
		pod = &l.Items[0]
		if first == "" {
			first = pod.UID
		}
		if len(l.Items) != 1 || pod.UID != first || pod.DeletionTimestamp != nil {
			t.Fatalf("pod %s of %s acted on (deleted or replaced) before its check's failure was seen; Events: %s", pod.Name, app, strings.Join(n.actionEvents(t, ns), "; "))
		}
		for _, cs := range pod.Status.InitContainerStatuses {
			if cs.Name != annotations.CheckContainerName {
				continue
			}
			for _, st := range []corev1.ContainerState{cs.State, cs.LastTerminationState} {
				if st.Terminated != nil && st.Terminated.ExitCode != 0 {
					term = st.Terminated
					return true, nil
				}
			}
			return false, fmt.Errorf("check %+v", cs.State)
		}
		return false, fmt.Errorf("no check status yet")
	})
	return pod, term
}

// checkFailsForAnotherReason runs, on a chained and ready node, injected
// pods whose init-container check fails, or could fail, for a reason other
// than the race, and shows none of them is ever acted on:
//   - port in use: consul-dataplane runs as a native sidecar (an init
//     container with restartPolicy Always, as consul-k8s injects it on
//     newer Kubernetes) before the check, so the proxy holds the outbound
//     port the probe listens on;
//   - probe blocked by policy: a rule in the pod's netns drops the probe's
//     connection before the redirect can see it (raw table, OUTPUT),
//     inserted while consul-k8s's connect-init stand-in runs, before the
//     check, which sees no packet leave the pod and says it cannot judge;
//   - DNS: the pod's only nameserver answers nothing.
//
// Each pod is meshed (a real connection from its netns reaches its proxy);
// the controller (resync and min age 10s) must not act on any over 35 s
// after each check failed, and each failure's termination message says
// what the check saw.
func checkFailsForAnotherReason(t *testing.T, withVerifier bool) {
	n := startNode(t)
	ns := n.c.Namespace(t)
	check := n.checkImage(t)
	n.chain(t)
	n.markReady(t)
	if withVerifier {
		n.startVerifier(t)
	}
	addr := n.startController(t, "--sandbox-slack=10s", "--min-pod-age=10s", "--resync-period=10s")

	// Port in use: the proxy holds the outbound port before the check.
	sidecar := n.proxyContainer()
	sidecar.RestartPolicy = ptr.To(corev1.ContainerRestartPolicyAlways)
	app := corev1.Container{Name: "app", Image: n.img.Ref, ImagePullPolicy: corev1.PullNever, Args: []string{"idle"}}
	n.injectedReplicaSetWith(t, ns, "port", 1, corev1.PodSpec{InitContainers: []corev1.Container{sidecar, checkInitContainer(check, corev1.PullNever)},
		Containers: []corev1.Container{app}})

	// Probe blocked by policy, in the pod's netns while connect-init runs.
	connectInit := corev1.Container{Name: annotations.InitContainerName, Image: n.img.Ref, ImagePullPolicy: corev1.PullNever,
		Args: []string{"connect-init", "--delay=20s"}, SecurityContext: &corev1.SecurityContext{RunAsUser: ptr.To(int64(annotations.InitUID))}}
	n.injectedReplicaSetWith(t, ns, "policy", 1, corev1.PodSpec{InitContainers: []corev1.Container{connectInit, checkInitContainer(check, corev1.PullNever)}})
	ruled := n.dropProbe(t, ns, "policy")

	// DNS: the pod's only nameserver, an address of the test's range, answers nothing.
	deadDNS := testnet.Host(n.r.Subnet4(13, 24), 53).String()
	n.injectedReplicaSetWith(t, ns, "dns", 1, corev1.PodSpec{InitContainers: []corev1.Container{checkInitContainer(check, corev1.PullNever)},
		DNSPolicy: corev1.DNSNone, DNSConfig: &corev1.PodDNSConfig{Nameservers: []string{deadDNS}}})

	var pods []corev1.Pod
	for _, c := range []struct{ app, want string }{
		{"port", "cannot listen on the outbound port"},
		{"policy", "no packet left the pod's network namespace"},
	} {
		p, term := n.checkFailure(t, ns, c.app)
		t.Logf("%s: the check exited %d: %s", c.app, term.ExitCode, strings.TrimSpace(term.Message))
		if !strings.Contains(term.Message, c.want) {
			t.Errorf("%s: the check's termination message %q does not say %q", c.app, term.Message, c.want)
		}
		if term.ExitCode != initcheck.ExitConfig {
			t.Errorf("%s: the check exited %d, want %d (could not judge), never the race's %d", c.app, term.ExitCode, initcheck.ExitConfig, annotations.InitCheckExitCode)
		}
		if c.app == "policy" && !term.StartedAt.After(ruled) {
			t.Fatalf("policy: the check started at %s, before the drop rule (%s): the run shows nothing", term.StartedAt, ruled)
		}
		pods = append(pods, *p)
	}
	dns := n.runningPods(t, ns, "dns", 1, 2*time.Minute)
	t.Logf("dns: the check passed with no nameserver answering; pod %s Running", dns[0].Name)
	pods = append(pods, dns...)
	n.meshedByTraffic(t, pods)
	n.noActionFor(t, ns, pods, 35*time.Second)
	controllerIdle(t, addr)
	t.Logf("actions=0 on %d meshed pods whose check failed or could not resolve names, over 35s (verifier: %v)", len(pods), withVerifier)
}

// dropProbe waits for the ReplicaSet app's pod's sandbox and drops, in its
// netns, the probe's connections to the check's default probe address
// before the nat table's redirect sees them (raw table, OUTPUT), as an
// egress policy enforced in the pod would; it returns when the rule was in.
func (n *node) dropProbe(t *testing.T, ns, app string) time.Time {
	t.Helper()
	var uid string
	poll.Eventually(t, time.Minute, "the sandbox of "+app, func() (bool, error) {
		l, err := n.c.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "app=" + app})
		if err != nil || len(l.Items) != 1 || l.Items[0].Status.PodIP == "" {
			return false, fmt.Errorf("no pod IP yet: %v", err)
		}
		uid = string(l.Items[0].UID)
		return true, nil
	})
	path := n.netnsOf(t, uid)
	target := initcheck.DefaultProbeAddress
	out, err := n.Command("nsenter", "--net="+path, "--", iptables.VariantNFT.Tool(redirect.IPv4), "-t", "raw", "-A", "OUTPUT",
		"-p", "tcp", "-d", target.Addr().String(), "--dport", fmt.Sprint(target.Port()), "-j", "DROP").CombinedOutput()
	if err != nil {
		t.Fatalf("dropping the probe in %s: %v: %s", path, err, out)
	}
	return time.Now()
}

// TestInitCheckFailingForOtherReasonsNeverActsOnTimingsAlone: port in use,
// probe blocked by policy and DNS failing, with no verifier.
func TestInitCheckFailingForOtherReasonsNeverActsOnTimingsAlone(t *testing.T) {
	checkFailsForAnotherReason(t, false)
}

// TestInitCheckFailingForOtherReasonsNeverActsWithTheVerifier: the same with
// the node verifier reporting for the node.
func TestInitCheckFailingForOtherReasonsNeverActsWithTheVerifier(t *testing.T) {
	checkFailsForAnotherReason(t, true)
}
