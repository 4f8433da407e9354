//go:build integration

package cnikube

import (
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/yaml"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/iptables"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/iptables/iptablestest"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cnichain"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

func TestMain(m *testing.M) { cluster.Main(m) }

const defaultConfig = `{"ConsulDNSIP":"127.0.0.1","ConsulDNSPort":8600,"ProxyUserID":"5995","ProxyInboundPort":20000,"ProxyOutboundPort":15001,"ExcludeInboundPorts":["20200","21000"],"ExcludeOutboundPorts":null,"ExcludeOutboundCIDRs":null,"ExcludeUIDs":["5996"],"NetNS":"","IptablesProvider":null}`

// pluginRules are the rules of the ClusterRole the manifests give the
// plugin's service account.
func pluginRules(t *testing.T) []rbacv1.PolicyRule {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testbin.RepoRoot(), "manifests", "base", "cni", "rbac.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(string(b), "\n---") {
		var cr rbacv1.ClusterRole
		if err := yaml.Unmarshal([]byte(doc), &cr); err != nil {
			t.Fatal(err)
		}
		if cr.Kind == "ClusterRole" && cr.Name == "consul-cni" {
			return cr.Rules
		}
	}
	t.Fatal("manifests/base/cni/rbac.yaml has no ClusterRole consul-cni")
	return nil
}

type env struct {
	c      *cluster.Cluster
	ns     string
	netDir string // cni_net_dir: kubeconfig and token live here
	r      *testnet.Range
	// dualStack gives the chains an IPv6 pod range too.
	dualStack bool
}

// setup gives the test a namespace, the plugin's service account with the
// manifests' permissions in it, and a CNI directory.
func setup(t *testing.T) *env {
	c := cluster.Shared(t)
	e := &env{c: c, ns: c.Namespace(t), netDir: t.TempDir(), r: testnet.Reserve(t)}
	ctx := context.Background()
	if _, err := c.Client.CoreV1().ServiceAccounts(e.ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "consul-cni"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.RbacV1().Roles(e.ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "consul-cni"}, Rules: pluginRules(t)}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.RbacV1().RoleBindings(e.ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "consul-cni"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "consul-cni"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "consul-cni", Namespace: e.ns}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return e
}

// token returns a fresh token of the plugin's service account, bound to the
// Secret named bound (deleting it invalidates the token) when not empty.
func (e *env) token(t *testing.T, bound string) string {
	t.Helper()
	ctx := context.Background()
	secs := int64(3600)
	spec := authenticationv1.TokenRequestSpec{ExpirationSeconds: &secs}
	if bound != "" {
		s, err := e.c.Client.CoreV1().Secrets(e.ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: bound}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Secret", APIVersion: "v1", Name: s.Name, UID: s.UID}
	}
	tr, err := e.c.Client.CoreV1().ServiceAccounts(e.ns).CreateToken(ctx, "consul-cni", &authenticationv1.TokenRequest{Spec: spec}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// writeKubeconfig writes the kubeconfig the installer would: a versioned
// file name, the CA inline, and a tokenFile relative to it.
func (e *env) writeKubeconfig(t *testing.T, server, token string) {
	t.Helper()
	ca := e.c.Config.TLSClientConfig.CAData
	if len(ca) == 0 {
		b, err := os.ReadFile(e.c.Config.TLSClientConfig.CAFile)
		if err != nil {
			t.Fatal(err)
		}
		ca = b
	}
	caLine := fmt.Sprintf("certificate-authority-data: %s", b64(ca))
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: %s
    %s
contexts:
- name: consul-cni
  context: {cluster: local, user: consul-cni}
current-context: consul-cni
users:
- name: consul-cni
  user:
    tokenFile: consul-cni-token
`, server, caLine)
	if err := os.WriteFile(filepath.Join(e.netDir, cniconf.ConsulK8sKubeconfigFileName+"-1a2b"), []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	e.writeToken(t, token)
}

func (e *env) writeToken(t *testing.T, token string) {
	t.Helper()
	tmp := filepath.Join(e.netDir, ".token.tmp")
	if err := os.WriteFile(tmp, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(e.netDir, "consul-cni-token")); err != nil {
		t.Fatal(err)
	}
}

func (e *env) chain(t *testing.T, extra map[string]any) *cnichain.Chain {
	entry := map[string]any{
		cniconf.KeyCNIBinDir: "/opt/cni/bin", cniconf.KeyCNINetDir: e.netDir, cniconf.KeyKubeconfig: cniconf.ConsulK8sKubeconfigFileName,
		cniconf.KeyLogLevel: "debug", "state_dir": e.netDir, "log_file": filepath.Join(e.netDir, "consul-cni.log"),
	}
	for k, v := range extra {
		entry[k] = v
	}
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(e.netDir, "consul-cni.log"))
			t.Logf("consul-cni log:\n%s", b)
		}
	})
	i := 1 + int(podCount%12)
	podCount++
	// The plugin runs in the chain's node namespace: the apiserver on the
	// host's loopback is forwarded there at the same address.
	api, err := url.Parse(e.c.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	opts := cnichain.Options{Subnet4: e.r.Subnet4(i, 24), Consul: entry, Loopback: []string{api.Host}}
	if e.dualStack {
		opts.Subnet6 = e.r.Subnet6(i)
	}
	return cnichain.New(t, opts)
}

var podCount int

func (e *env) createPod(t *testing.T, name string, ann map[string]string, labels map[string]string) *corev1.Pod {
	t.Helper()
	pod, err := e.c.Client.CoreV1().Pods(e.ns).Create(context.Background(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann, Labels: labels},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "registry.invalid/app:1"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

func injectedAnnotations(cfg string) map[string]string {
	return map[string]string{
		annotations.KeyInjectStatus:           annotations.InjectStatusInjected,
		annotations.KeyTransparentProxyStatus: annotations.TProxyStatusEnabled,
		annotations.KeyRedirectTrafficConfig:  cfg,
	}
}

func podArgs(pod *corev1.Pod) [][2]string {
	return [][2]string{{"K8S_POD_NAMESPACE", pod.Namespace}, {"K8S_POD_NAME", pod.Name},
		{"K8S_POD_INFRA_CONTAINER_ID", "sandbox-" + pod.Name}, {"K8S_POD_UID", string(pod.UID)}}
}

func natTable(t *testing.T, ns *testnet.Netns) string {
	t.Helper()
	return natTableOf(t, ns, redirect.IPv4)
}

func natTableOf(t *testing.T, ns *testnet.Netns, fam redirect.Family) string {
	t.Helper()
	b, _ := iptables.VariantDetector{}.Detect(context.Background())
	out, err := (&iptables.NetnsExecutor{NetNS: ns.Path, Variant: b}).Save(context.Background(), fam)
	if err != nil {
		t.Fatal(err)
	}
	return iptablestest.Normalize(out)
}

func goldenDefault(t *testing.T) string {
	t.Helper()
	return cnichain.GoldenTable(t, "default", redirect.IPv4)
}

// TestStatusEnabledWaitingComplete: ADD of an injected pod moves its
// transparent-proxy-status from enabled through waiting to complete (seen
// by a watch), with the rules in place, as the plugin's least-privilege
// service account.
func TestStatusEnabledWaitingComplete(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	e.writeKubeconfig(t, e.c.Config.Host, e.token(t, ""))
	chain := e.chain(t, nil)
	pod := e.createPod(t, "web", injectedAnnotations(defaultConfig), map[string]string{annotations.KeyInjectStatus: "injected"})

	w, err := e.c.Client.CoreV1().Pods(e.ns).Watch(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("metadata.name", "web").String(), ResourceVersion: pod.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	seen := []string{pod.Annotations[annotations.KeyTransparentProxyStatus]}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			if ev.Type != watch.Modified {
				continue
			}
			s := ev.Object.(*corev1.Pod).Annotations[annotations.KeyTransparentProxyStatus]
			if s != seen[len(seen)-1] {
				seen = append(seen, s)
			}
			if s == annotations.TProxyStatusComplete {
				return
			}
		}
	}()

	netns := e.r.NewNetns(t, "pod")
	rt := cnichain.Runtime("sandbox-web", netns.Path, podArgs(pod)...)
	if _, err := chain.Add(ctx, rt); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	t.Cleanup(func() { chain.Del(context.Background(), rt) })
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatalf("complete never observed; saw %v", seen)
	}
	if got := strings.Join(seen, " -> "); got != "enabled -> waiting -> complete" {
		t.Fatalf("status went %s", got)
	}
	if got := natTable(t, netns); got != goldenDefault(t) {
		t.Fatalf("nat table\n%s\nwant\n%s", got, goldenDefault(t))
	}
	if err := chain.Check(ctx, rt); err != nil {
		t.Fatalf("CHECK: %v", err)
	}
	got, err := e.c.Client.CoreV1().Pods(e.ns).Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	managers := ""
	for _, m := range got.ManagedFields {
		managers += m.Manager + "/" + string(m.Operation) + " "
	}
	if !strings.Contains(managers, "consul-cni/Update") {
		t.Errorf("status not written by consul-cni (managers %s)", managers)
	}
	// Only the annotation changed: labels, other annotations, spec kept.
	if got.Annotations[annotations.KeyRedirectTrafficConfig] != defaultConfig || got.Labels[annotations.KeyInjectStatus] != "injected" {
		t.Errorf("pod changed beyond the status: %v %v", got.Labels, got.Annotations)
	}
	// With complete, the time the rules were applied.
	if _, err := annotations.ParseTime(annotations.KeyCNIAppliedAt, got.Annotations[annotations.KeyCNIAppliedAt]); err != nil {
		t.Errorf("status complete without a valid %s: %v", annotations.KeyCNIAppliedAt, err)
	}
}

// TestDualStackThroughTheAPI: a pod whose annotations (read from the real
// API) say dual-stack gets both nat tables exactly as the golden file of the
// same config has them (IPv4 without DNS rules, IPv6 with them) and is
// marked complete; CHECK agrees, DEL leaves neither family with our rules.
func TestDualStackThroughTheAPI(t *testing.T) {
	e := setup(t)
	e.dualStack = true
	ctx := context.Background()
	e.writeKubeconfig(t, e.c.Config.Host, e.token(t, ""))
	chain := e.chain(t, nil)
	ann := injectedAnnotations(cnichain.GoldenConfig(t, "dual-stack"))
	ann[annotations.KeyDualStack] = "true"
	pod := e.createPod(t, "web6", ann, map[string]string{annotations.KeyInjectStatus: "injected"})

	netns := e.r.NewNetns(t, "pod")
	rt := cnichain.Runtime("sandbox-web6", netns.Path, podArgs(pod)...)
	if _, err := chain.Add(ctx, rt); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	deleted := false
	t.Cleanup(func() {
		if !deleted {
			chain.Del(context.Background(), rt)
		}
	})
	for _, fam := range []redirect.Family{redirect.IPv4, redirect.IPv6} {
		if got, want := natTableOf(t, netns, fam), cnichain.GoldenTable(t, "dual-stack", fam); got != want {
			t.Errorf("%s nat table\n%s\nwant\n%s", fam, got, want)
		}
	}
	got, err := e.c.Client.CoreV1().Pods(e.ns).Get(ctx, "web6", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if s := got.Annotations[annotations.KeyTransparentProxyStatus]; s != annotations.TProxyStatusComplete {
		t.Errorf("status %q after ADD, want complete", s)
	}
	if err := chain.Check(ctx, rt); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	if err := chain.Del(ctx, rt); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	deleted = true
	for _, fam := range []redirect.Family{redirect.IPv4, redirect.IPv6} {
		if tbl := natTableOf(t, netns, fam); strings.Contains(tbl, "CONSUL") {
			t.Errorf("%s rules left after DEL:\n%s", fam, tbl)
		}
	}
}

// TestSkipsPodsThatAreNotOurs: a pod without injection is left alone.
func TestSkipsPodsThatAreNotOurs(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	e.writeKubeconfig(t, e.c.Config.Host, e.token(t, ""))
	chain := e.chain(t, nil)
	pod := e.createPod(t, "plain", map[string]string{"team": "x"}, nil)
	netns := e.r.NewNetns(t, "pod")
	rt := cnichain.Runtime("sandbox-plain", netns.Path, podArgs(pod)...)
	if _, err := chain.Add(ctx, rt); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	t.Cleanup(func() { chain.Del(context.Background(), rt) })
	got, _ := e.c.Client.CoreV1().Pods(e.ns).Get(ctx, "plain", metav1.GetOptions{})
	if len(got.Annotations) != 1 || got.Annotations["team"] != "x" {
		t.Fatalf("annotations changed: %v", got.Annotations)
	}
	for _, m := range got.ManagedFields {
		if m.Manager == "consul-cni" {
			t.Fatalf("consul-cni wrote to the pod: %+v", m)
		}
	}
	if strings.Contains(natTable(t, netns), "CONSUL") {
		t.Fatal("rules applied to a pod that is not injected")
	}
}

// TestBadAnnotationFailsClosed: an invalid redirect config fails ADD with a
// message naming the pod and the field; nothing is applied; status stays
// waiting.
func TestBadAnnotationFailsClosed(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	e.writeKubeconfig(t, e.c.Config.Host, e.token(t, ""))
	chain := e.chain(t, nil)
	pod := e.createPod(t, "bad", injectedAnnotations(`{"ProxyUserID":"5995","ProxyInboundPort":20000,"ExcludeInboundPorts":["22 -j ACCEPT"]}`), nil)
	netns := e.r.NewNetns(t, "pod")
	rt := cnichain.Runtime("sandbox-bad", netns.Path, podArgs(pod)...)
	_, err := chain.Add(ctx, rt)
	t.Cleanup(func() { chain.Del(context.Background(), rt) })
	if err == nil || !strings.Contains(err.Error(), "pod "+e.ns+"/bad") || !strings.Contains(err.Error(), "ExcludeInboundPorts[0]") {
		t.Fatalf("ADD error %v", err)
	}
	t.Logf("operator sees: %v", err)
	if strings.Contains(natTable(t, netns), "CONSUL") {
		t.Fatal("rules applied")
	}
	got, _ := e.c.Client.CoreV1().Pods(e.ns).Get(ctx, "bad", metav1.GetOptions{})
	if s := got.Annotations[annotations.KeyTransparentProxyStatus]; s != annotations.TProxyStatusWaiting {
		t.Fatalf("status %q", s)
	}
}

// TestRotatedToken: the token in the tokenFile is invalidated (its bound
// Secret deleted): ADD fails with the API's 401 and nothing applied; once
// the file holds a fresh token, ADD works without touching the kubeconfig.
func TestRotatedToken(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	e.writeKubeconfig(t, e.c.Config.Host, e.token(t, "token-holder-1"))
	chain := e.chain(t, map[string]any{"api_timeout": "20s"})
	pod := e.createPod(t, "web", injectedAnnotations(defaultConfig), nil)
	if err := e.c.Client.CoreV1().Secrets(e.ns).Delete(ctx, "token-holder-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// The API server drops a token whose bound object is gone.
	netns := e.r.NewNetns(t, "pod")
	rt := cnichain.Runtime("sandbox-web", netns.Path, podArgs(pod)...)
	deadline := time.Now().Add(60 * time.Second)
	var err error
	for {
		_, err = chain.Add(ctx, rt)
		chain.Del(ctx, rt)
		if err != nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	if err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("ADD with an invalidated token: %v", err)
	}
	t.Logf("operator sees: %v", err)
	if strings.Contains(natTable(t, netns), "CONSUL") {
		t.Fatal("rules applied without the API")
	}
	e.writeToken(t, e.token(t, ""))
	if _, err := chain.Add(ctx, rt); err != nil {
		t.Fatalf("ADD after rotation: %v", err)
	}
	t.Cleanup(func() { chain.Del(context.Background(), rt) })
	got, _ := e.c.Client.CoreV1().Pods(e.ns).Get(ctx, "web", metav1.GetOptions{})
	if s := got.Annotations[annotations.KeyTransparentProxyStatus]; s != annotations.TProxyStatusComplete {
		t.Fatalf("status %q", s)
	}
}

// TestAPIUnreachableFailsWithinTimeout: with the API server unreachable
// (connection refused) or not answering (a listener that never replies),
// ADD fails, bounded by api_timeout rather than hanging, with a message
// that says what to check; no rules are left.
func TestAPIUnreachableFailsWithinTimeout(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	pod := e.createPod(t, "web", injectedAnnotations(defaultConfig), nil)
	token := e.token(t, "")

	// A port nothing listens on, and one that accepts and never answers.
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	closed.Close()
	hole, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hole.Close() })
	go func() {
		for {
			c, err := hole.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
		}
	}()

	for _, tc := range []struct{ name, server, want string }{
		{"connection refused", "https://" + closedAddr, "connection refused"},
		{"no answer", "https://" + hole.Addr().String(), "gave up at api_timeout 3s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e.writeKubeconfig(t, tc.server, token)
			chain := e.chain(t, map[string]any{"api_timeout": "3s"})
			netns := e.r.NewNetns(t, "pod")
			rt := cnichain.Runtime("sandbox-web", netns.Path, podArgs(pod)...)
			start := time.Now()
			_, err := chain.Add(ctx, rt)
			took := time.Since(start)
			t.Cleanup(func() { chain.Del(context.Background(), rt) })
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "pod "+e.ns+"/web") {
				t.Fatalf("ADD error %v, want %q", err, tc.want)
			}
			t.Logf("ADD failed after %v: %v", took.Round(time.Millisecond), err)
			// Not a timing assertion: only that the call was bounded at all
			// (without a bound it would wait for the TCP stack, minutes).
			if took > 90*time.Second {
				t.Fatalf("ADD took %v with api_timeout 3s", took)
			}
			if strings.Contains(natTable(t, netns), "CONSUL") {
				t.Fatal("rules applied without the API")
			}
		})
	}
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
