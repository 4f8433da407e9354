//go:build integration

// Package verify runs the node verifier (cmd/consul-cni-verifier) against
// real nodes (tests/harness/realnode: kubelet, containerd, runc): the
// sandboxes come from the node's containerd over its CRI socket, the rules
// from the consul-cni plugin in the node's real CNI chain, and the verdicts
// reach the API through the verifier's own identity and admission policy.
package verify

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/cri"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/plugin"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/iptables"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/verify"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/podnet"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/proc"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/realnode"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/scenario"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

func TestMain(m *testing.M) { cluster.Main(m) }

// manifestsNamespace is where the manifests put the CNI and verifier
// identities.
const manifestsNamespace = "consul-cni-repair"

const redirectConfig = `{"ConsulDNSIP":"","ConsulDNSPort":0,"ProxyUserID":"5995","ProxyInboundPort":20000,"ProxyOutboundPort":15001,"ExcludeInboundPorts":["21000"],"ExcludeOutboundPorts":null,"ExcludeOutboundCIDRs":null,"ExcludeUIDs":["5996"],"NetNS":"","IptablesProvider":null}`

// node is a real node with the manifests' identities in the cluster.
type node struct {
	*realnode.Node
	c   *cluster.Cluster
	img realnode.Image
	r   *testnet.Range
}

func startNode(t *testing.T) *node {
	t.Helper()
	c := cluster.Shared(t)
	ctx := context.Background()
	err := scenario.ApplyManifests(ctx, c.Client, filepath.Join(testbin.RepoRoot(), "manifests"),
		"base/namespace.yaml", "base/cni/rbac.yaml", "base/cni/admission-policy.yaml",
		"base/verifier/rbac.yaml", "base/verifier/admission-policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r := testnet.Reserve(t)
	realnode.BuildImages(t)
	img := realnode.ProgramImage(t, "podprog")
	n := realnode.StartForTest(t, c, r, realnode.Options{Images: []string{img.Archive}})
	return &node{Node: n, c: c, img: img, r: r}
}

// nodeBoundConfig is a client configuration for a ServiceAccount of the
// manifests with a token bound to the Node object, which names the node
// (extra authentication.kubernetes.io/node-name) as a pod-bound token does.
func (n *node) nodeBoundConfig(t *testing.T, sa, host, serverName string) *rest.Config {
	t.Helper()
	ctx := context.Background()
	no, err := n.c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := n.c.Client.CoreV1().ServiceAccounts(manifestsNamespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3600)),
			BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Node", APIVersion: "v1", Name: no.Name, UID: no.UID}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return &rest.Config{Host: host, BearerToken: tr.Status.Token,
		TLSClientConfig: rest.TLSClientConfig{CAData: n.c.CAData, ServerName: serverName}}
}

// chain does what the installer does: the plugin binary, its kubeconfig
// (the installer's identity, through the node's API endpoint) and the
// entry appended to the node's conflist.
func (n *node) chain(t *testing.T) {
	t.Helper()
	if err := podnet.CopyExecutable(testbin.Project(t, "consul-cni"), filepath.Join(n.CNIBinDir(), cniconf.PluginType)); err != nil {
		t.Fatal(err)
	}
	kc := n.nodeBoundConfig(t, "consul-cni", realnode.APIServerURL(), "127.0.0.1")
	if err := cluster.WriteKubeconfig(filepath.Join(n.ConfDir(), cniconf.KubeconfigFileName), kc, "consul-cni"); err != nil {
		t.Fatal(err)
	}
	var conf map[string]any
	b, err := n.ConfList()
	if err == nil {
		err = json.Unmarshal(b, &conf)
	}
	if err != nil {
		t.Fatal(err)
	}
	conf["plugins"] = append(conf["plugins"].([]any), map[string]any{
		"type": cniconf.PluginType, cniconf.KeyKubeconfig: cniconf.KubeconfigFileName, cniconf.KeyLogLevel: "info",
		cniconf.KeyCNIBinDir: n.CNIBinDir(), cniconf.KeyCNINetDir: n.ConfDir(),
		"state_dir": filepath.Join(n.Dir, plugin.DefaultStateDir),
	})
	out, _ := json.MarshalIndent(conf, "", "  ")
	if err := n.WriteConfList(out); err != nil {
		t.Fatal(err)
	}
}

// startVerifier runs consul-cni-verifier in the node's mount namespace (as
// its DaemonSet pod sees the host) with its own identity, and returns its
// metrics address.
func (n *node) startVerifier(t *testing.T, extra ...string) string {
	t.Helper()
	kc := filepath.Join(t.TempDir(), "verifier.kubeconfig")
	if err := cluster.WriteKubeconfig(kc, n.nodeBoundConfig(t, "consul-cni-verifier", n.c.Server, ""), "consul-cni-verifier"); err != nil {
		t.Fatal(err)
	}
	port, err := testnet.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	logFile := filepath.Join(t.TempDir(), "verifier.log")
	f, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"--node-name=" + n.Name, "--cri-socket=" + n.CRISocket(), "--host-root=/",
		"--cni-net-dir=" + n.ConfDir(), "--kubeconfig=" + kc, "--interval=1s", "--metrics-bind-address=" + addr, "-v=2"}, extra...)
	cmd := n.Command(testbin.Project(t, "consul-cni-verifier"), args...)
	cmd.Stdout, cmd.Stderr = f, f
	p, err := proc.Start(cmd, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Stop(5 * time.Second)
		f.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logFile)
			t.Logf("--- verifier log:\n%s", tail(string(b), 40))
		}
	})
	return addr
}

func tail(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// injectedPod is a pod as the consul-k8s webhook leaves it with transparent
// proxy and the CNI plugin, its sidecar a stand-in proxy.
func (n *node) injectedPod(t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Labels: map[string]string{annotations.KeyInjectStatus: annotations.InjectStatusInjected},
			Annotations: map[string]string{annotations.KeyInjectStatus: annotations.InjectStatusInjected,
				annotations.KeyTransparentProxyStatus: annotations.TProxyStatusEnabled,
				annotations.KeyRedirectTrafficConfig:  redirectConfig, annotations.KeyDualStack: "false"}},
		Spec: corev1.PodSpec{
			NodeName:                      n.Name,
			TerminationGracePeriodSeconds: ptr.To(int64(1)),
			Containers: []corev1.Container{{Name: "consul-dataplane", Image: n.img.Ref, ImagePullPolicy: corev1.PullNever,
				Args:            []string{"proxy", "--outbound=15001", "--inbound=20000"},
				SecurityContext: &corev1.SecurityContext{RunAsUser: ptr.To(int64(annotations.ProxyUID))}}},
		},
	}
	created, err := n.c.Client.CoreV1().Pods(ns).Create(context.Background(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 2*time.Minute, "pod "+name+" running", func() (bool, error) {
		p, err := n.c.Client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return p.Status.Phase == corev1.PodRunning, fmt.Errorf("phase %s", p.Status.Phase)
	})
	return created
}

// condition returns the pod's verifier condition (nil when absent).
func (n *node) condition(t *testing.T, ns, name string) *corev1.PodCondition {
	p, err := n.c.Client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == annotations.ConditionRedirectVerified {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

func (n *node) waitCondition(t *testing.T, ns, name string, status corev1.ConditionStatus, reason string, timeout time.Duration) *corev1.PodCondition {
	t.Helper()
	var got *corev1.PodCondition
	poll.Eventually(t, timeout, fmt.Sprintf("pod %s condition %s=%s (%s)", name, annotations.ConditionRedirectVerified, status, reason), func() (bool, error) {
		got = n.condition(t, ns, name)
		if got == nil {
			return false, fmt.Errorf("no condition")
		}
		return got.Status == status && got.Reason == reason, fmt.Errorf("condition %s %s: %s", got.Status, got.Reason, got.Message)
	})
	return got
}

func (n *node) nodeCondition(t *testing.T) *corev1.NodeCondition {
	no, err := n.c.Client.CoreV1().Nodes().Get(context.Background(), n.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range no.Status.Conditions {
		if no.Status.Conditions[i].Type == annotations.NodeConditionCNIVerified {
			return &no.Status.Conditions[i]
		}
	}
	return nil
}

// netnsOf is the runtime's netns path of the pod's ready sandbox.
func (n *node) netnsOf(t *testing.T, uid string) string {
	t.Helper()
	ctx := context.Background()
	rt, err := cri.Dial(ctx, n.CRISocket())
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	list, err := rt.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range list {
		if s.PodUID == uid {
			st, err := rt.Status(ctx, s.ID)
			if err != nil {
				t.Fatal(err)
			}
			return st.NetNS
		}
	}
	t.Fatalf("no ready sandbox of pod %s", uid)
	return ""
}

// TestVerifierJudgesEachSandboxOnARealNode: a pod created before consul-cni
// was chained (no rules) and one created after (rules) on a real node; the
// verifier reads both namespaces through containerd's CRI and publishes the
// truth; then the meshed pod's rules are removed by hand in its namespace,
// and the verifier finds it within 10 s.
func TestVerifierJudgesEachSandboxOnARealNode(t *testing.T) {
	n := startNode(t)
	ns := n.c.Namespace(t)
	bypass := n.injectedPod(t, ns, "bypass")
	n.chain(t)
	meshed := n.injectedPod(t, ns, "meshed")
	metrics := n.startVerifier(t)

	got := n.waitCondition(t, ns, "meshed", corev1.ConditionTrue, annotations.ReasonRulesInPlace, time.Minute)
	if !strings.Contains(got.Message, "iptables-") {
		t.Errorf("condition message %q does not name the iptables variant found", got.Message)
	}
	n.waitCondition(t, ns, "bypass", corev1.ConditionFalse, annotations.ReasonRulesMissing, time.Minute)
	poll.Eventually(t, 30*time.Second, "a Warning Event on the bypassing pod", func() (bool, error) {
		evs, err := n.c.Client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("involvedObject.uid", string(bypass.UID)).String()})
		if err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if e.Reason == verify.EventReasonUnredirected && e.Type == corev1.EventTypeWarning {
				return true, nil
			}
		}
		return false, fmt.Errorf("%d events, none %s", len(evs.Items), verify.EventReasonUnredirected)
	})
	poll.Eventually(t, 30*time.Second, "the Node condition", func() (bool, error) {
		c := n.nodeCondition(t)
		if c == nil {
			return false, fmt.Errorf("none")
		}
		return c.Status == corev1.ConditionFalse && c.Reason == annotations.ReasonPodsUnredirected, fmt.Errorf("%s %s: %s", c.Status, c.Reason, c.Message)
	})
	checkGauges(t, metrics, 1, 1)

	// Rules removed by hand from the meshed pod's namespace.
	path := n.netnsOf(t, string(meshed.UID))
	out, err := n.Command("nsenter", "--net="+path, "--", iptables.VariantNFT.Tool(redirect.IPv4), "-t", "nat", "-F", redirect.ChainOutput).CombinedOutput()
	if err != nil {
		t.Fatalf("flushing %s in %s: %v: %s", redirect.ChainOutput, path, err, out)
	}
	removed := time.Now()
	got = n.waitCondition(t, ns, "meshed", corev1.ConditionFalse, annotations.ReasonRulesDrifted, 10*time.Second)
	t.Logf("rules removed by hand: condition False %s after %s (%s)", got.Reason, time.Since(removed).Round(10*time.Millisecond), got.Message)
	checkGauges(t, metrics, 0, 2)
}

// checkGauges scrapes the verifier's pods gauge until it shows the counts.
func checkGauges(t *testing.T, addr string, redirected, unredirected int) {
	t.Helper()
	poll.Eventually(t, 30*time.Second, "verifier gauges", func() (bool, error) {
		b, err := httpGet("http://" + addr + "/metrics")
		if err != nil {
			return false, err
		}
		want := []string{
			fmt.Sprintf(`%s{node="`, verify.MetricPods),
			fmt.Sprintf(`verdict="redirected"} %d`, redirected),
			fmt.Sprintf(`verdict="unredirected"} %d`, unredirected),
		}
		for _, w := range want {
			if !strings.Contains(b, w) {
				return false, fmt.Errorf("no %q in the metrics", w)
			}
		}
		return true, nil
	})
}
