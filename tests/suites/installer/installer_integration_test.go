//go:build integration

package installer_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/proc"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
)

func TestMain(m *testing.M) { cluster.Main(m) }

const kindnet = `{"cniVersion":"1.0.0","name":"kindnet","plugins":[
 {"type":"ptp","ipMasq":false,"ipam":{"type":"host-local","ranges":[[{"subnet":"10.244.0.0/24"}]]}},
 {"type":"portmap","capabilities":{"portMappings":true}}]}`

// installerPod is a pod object (never scheduled: nothing runs it) that a
// service-account token is bound to, as a DaemonSet pod's token is.
type installerPod struct {
	name, tokenFile string
	pod             *corev1.Pod
}

// installerNode is the Node the installer pods are bound to. It exists, so
// kube-controller-manager's pod garbage collector never deletes them as
// orphans (it does after 40 s on a missing node), and the pods tolerate
// every taint, so the NotReady taints of a node without a kubelet never
// evict them: a pod goes only when a test deletes it.
const installerNode = "consul-cni-installer-test"

func newInstallerPod(t *testing.T, c *cluster.Cluster, ns, name, dir string) *installerPod {
	t.Helper()
	ctx := context.Background()
	_, err := c.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: installerNode}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	p, err := c.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app.kubernetes.io/name": "consul-cni"}},
		Spec: corev1.PodSpec{
			ServiceAccountName: "consul-cni",
			NodeName:           installerNode,
			Tolerations:        []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers:         []corev1.Container{{Name: "installer", Image: "consul-cni-installer"}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ip := &installerPod{name: name, pod: p, tokenFile: filepath.Join(dir, name, "token")}
	ip.rotate(t, c, ns)
	return ip
}

// rotate writes a fresh token bound to the pod, replacing the file the
// way kubelet's atomic writer does (rename over the old one).
func (ip *installerPod) rotate(t *testing.T, c *cluster.Cluster, ns string) string {
	t.Helper()
	secs := int64(3600)
	tr, err := c.Client.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), "consul-cni", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: &secs,
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: ip.pod.Name, UID: ip.pod.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(ip.tokenFile), 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := ip.tokenFile + ".new"
	if err := os.WriteFile(tmp, []byte(tr.Status.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, ip.tokenFile); err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

type node struct {
	root, bin, net, plugin string
	installer              string
}

// newInstallerHost makes a host tree in a temporary directory (empty CNI
// bin and net dirs, a plugin executable to install) and builds the installer.
func newInstallerHost(t *testing.T) node {
	t.Helper()
	root := t.TempDir()
	n := node{root: root, bin: filepath.Join(root, "opt/cni/bin"), net: filepath.Join(root, "etc/cni/net.d"),
		plugin: filepath.Join(root, "image/consul-cni"), installer: testbin.Project(t, "consul-cni-installer")}
	for _, d := range []string{n.bin, n.net, filepath.Dir(n.plugin)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(n.plugin, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return n
}

func (n node) args(sub string, extra ...string) []string {
	return append([]string{sub, "--cni-bin-dir", n.bin, "--cni-net-dir", n.net, "--host-cni-bin-dir", n.bin,
		"--host-cni-net-dir", n.net, "--plugin-binary", n.plugin}, extra...)
}

// start runs `consul-cni-installer run` with a kubeconfig that reads the
// pod's token file, as simulated nodes give containers.
func (n node) start(t *testing.T, c *cluster.Cluster, ip *installerPod, extra ...string) *proc.Process {
	t.Helper()
	cfg := rest.AnonymousClientConfig(c.Config)
	cfg.BearerTokenFile = ip.tokenFile
	kc := filepath.Join(filepath.Dir(ip.tokenFile), "kubeconfig")
	if err := cluster.WriteKubeconfig(kc, cfg, ip.name); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(n.installer, n.args("run", append([]string{"--kubeconfig", kc, "--resync", "2s", "-v", "2"}, extra...)...)...)
	log, err := os.Create(filepath.Join(t.TempDir(), ip.name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	p, err := proc.Start(cmd, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Stop(10 * time.Second)
		if t.Failed() {
			b, _ := os.ReadFile(log.Name())
			t.Logf("%s log:\n%s", ip.name, b)
		}
	})
	return p
}

func (n node) ready(t *testing.T) error {
	t.Helper()
	_, err := n.probe()
	return err
}

// watching is ready, and also fails when the probe did not check the
// directory watch because it saw no installer run process: a test whose
// installer runs asks for the whole check, not the files alone.
func (n node) watching(t *testing.T) error {
	t.Helper()
	out, err := n.probe()
	if err == nil && !strings.Contains(out, "the installer watches its directories") {
		return fmt.Errorf("the probe did not check the directory watch: %s", out)
	}
	return err
}

// probe runs `consul-cni-installer ready` and returns what it printed.
func (n node) probe() (string, error) {
	var out bytes.Buffer
	cmd := exec.Command(n.installer, n.args("ready")...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%v: %s", err, out.String())
	}
	return out.String(), nil
}

// whoAmI authenticates with the plugin's kubeconfig, exactly as the plugin
// would load it.
func (n node) whoAmI(t *testing.T) (string, error) {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(n.net, cniconf.KubeconfigFileName))
	if err != nil {
		return "", err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", err
	}
	r, err := cs.AuthenticationV1().SelfSubjectReviews().Create(context.Background(), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	return r.Status.UserInfo.Username, nil
}

func setupNamespace(t *testing.T, c *cluster.Cluster) string {
	t.Helper()
	ns := c.Namespace(t)
	ctx := context.Background()
	if _, err := c.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "consul-cni"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// What the installer's ClusterRole grants (pods get/patch), here in the
	// test namespace.
	if _, err := c.Client.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "consul-cni"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "patch"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "consul-cni"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "consul-cni"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "consul-cni", Namespace: ns}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return ns
}

// The installer binary against a real apiserver: it chains the plugin, the
// plugin's kubeconfig authenticates through the token file (no embedded
// token) and keeps working across kubelet's token rotation; SIGTERM leaves
// everything; uninstall removes it.
func TestInstallerLifecycle(t *testing.T) {
	c := cluster.Shared(t)
	ns := setupNamespace(t, c)
	n := newInstallerHost(t)
	if err := os.WriteFile(filepath.Join(n.net, "10-kindnet.conflist"), []byte(kindnet), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := n.ready(t); err == nil {
		t.Fatal("ready before the installer ran")
	}
	a := newInstallerPod(t, c, ns, "consul-cni-a", t.TempDir())
	p := n.start(t, c, a)
	poll.Eventually(t, 2*time.Minute, "ready", func() error { return n.ready(t) })

	user, err := n.whoAmI(t)
	if err != nil {
		t.Fatalf("plugin kubeconfig does not authenticate: %v", err)
	}
	if want := "system:serviceaccount:" + ns + ":consul-cni"; user != want {
		t.Fatalf("plugin authenticates as %q, want %q", user, want)
	}
	raw, err := clientcmd.LoadFromFile(filepath.Join(n.net, cniconf.KubeconfigFileName))
	if err != nil {
		t.Fatal(err)
	}
	for name, ai := range raw.AuthInfos {
		if ai.Token != "" || ai.TokenFile != filepath.Join(n.net, cniconf.TokenFileName) {
			t.Fatalf("user %s: token %q tokenFile %q", name, ai.Token, ai.TokenFile)
		}
	}

	// kubelet rotates the pod's token: the copy follows.
	tok2 := a.rotate(t, c, ns)
	poll.Eventually(t, 2*time.Minute, "rotated token copied", func() error {
		b, _ := os.ReadFile(filepath.Join(n.net, cniconf.TokenFileName))
		if string(b) != tok2 {
			return errors.New("old token still in place")
		}
		return nil
	})
	if _, err := n.whoAmI(t); err != nil {
		t.Fatalf("after rotation: %v", err)
	}

	// SIGTERM: the process exits cleanly and the node stays chained.
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Done():
	case <-time.After(time.Minute):
		t.Fatal("installer did not stop on SIGTERM")
	}
	if code, sig := p.ExitCode(); code != 0 || sig != 0 {
		t.Fatalf("exit code %d signal %v", code, sig)
	}
	if err := n.ready(t); err != nil {
		t.Fatalf("after SIGTERM: %v", err)
	}

	// Explicit uninstall.
	out, err := exec.Command(n.installer, n.args("uninstall")...).CombinedOutput()
	if err != nil {
		t.Fatalf("uninstall: %v\n%s", err, out)
	}
	if err := n.ready(t); err == nil {
		t.Fatal("ready after uninstall")
	}
	b, _ := os.ReadFile(filepath.Join(n.net, "10-kindnet.conflist"))
	if bytes.Contains(b, []byte("consul-cni")) {
		t.Fatalf("chain entry left after uninstall:\n%s", b)
	}
	for _, f := range []string{filepath.Join(n.bin, cniconf.PluginType), filepath.Join(n.bin, cniconf.StagedBinaryName),
		filepath.Join(n.net, cniconf.KubeconfigFileName), filepath.Join(n.net, cniconf.TokenFileName), filepath.Join(n.net, cniconf.OwnerFileName)} {
		if _, err := os.Lstat(f); err == nil {
			t.Errorf("%s left after uninstall", f)
		}
	}
}

// A rolling update with maxSurge: the old and the new installer run on the
// node together, each with a token bound to its own pod. Deleting the old
// pod kills its token; the plugin's kubeconfig must then hold the new pod's
// token (checked against the real apiserver, which rejects the old one).
func TestRollingUpdateTokenHandover(t *testing.T) {
	c := cluster.Shared(t)
	ns := setupNamespace(t, c)
	n := newInstallerHost(t)
	if err := os.WriteFile(filepath.Join(n.net, "10-kindnet.conflist"), []byte(kindnet), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	oldPod := newInstallerPod(t, c, ns, "consul-cni-old", dir)
	oldProc := n.start(t, c, oldPod)
	poll.Eventually(t, 2*time.Minute, "old installer ready", func() error { return n.ready(t) })

	newPod := newInstallerPod(t, c, ns, "consul-cni-new", dir)
	n.start(t, c, newPod)
	// Both run for several resync periods; the plugin authenticates all along.
	for i := 0; i < 5; i++ {
		if _, err := n.whoAmI(t); err != nil {
			t.Fatalf("while both installers run: %v", err)
		}
		time.Sleep(time.Second)
	}

	// kubelet rotates the old pod's token meanwhile, so the old token now
	// expires after the new one: only knowing that the old pod is gone can
	// make the new installer take over.
	oldTok := []byte(oldPod.rotate(t, c, ns))
	poll.Eventually(t, 2*time.Minute, "the old pod's rotated token in place", func() error {
		b, _ := os.ReadFile(filepath.Join(n.net, cniconf.TokenFileName))
		if !bytes.Equal(b, oldTok) {
			return errors.New("not yet")
		}
		return nil
	})
	time.Sleep(3 * time.Second) // a resync of both: the old token stays
	if b, _ := os.ReadFile(filepath.Join(n.net, cniconf.TokenFileName)); !bytes.Equal(b, oldTok) {
		t.Fatal("the installers fight over the token file while both pods run")
	}

	// The DaemonSet controller deletes the old pod; its installer stops.
	if err := c.Client.CoreV1().Pods(ns).Delete(context.Background(), oldPod.name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	oldProc.Signal(syscall.SIGTERM)
	poll.Eventually(t, 2*time.Minute, "the plugin's kubeconfig to work after the old pod is gone", func() error {
		user, err := n.whoAmI(t)
		if err != nil {
			return err
		}
		if user != "system:serviceaccount:"+ns+":consul-cni" {
			return fmt.Errorf("user %q", user)
		}
		b, _ := os.ReadFile(filepath.Join(n.net, cniconf.TokenFileName))
		if bytes.Equal(b, oldTok) {
			return errors.New("the old pod's token is still in place")
		}
		return nil
	})
	// And the old token really is dead, so the handover mattered.
	cfg := rest.AnonymousClientConfig(c.Config)
	cfg.BearerToken = string(oldTok)
	cs := kubernetes.NewForConfigOrDie(cfg)
	poll.Eventually(t, 2*time.Minute, "the old pod's token to be rejected", func() error {
		_, err := cs.AuthenticationV1().SelfSubjectReviews().Create(context.Background(), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if apierrors.IsUnauthorized(err) {
			return nil
		}
		return fmt.Errorf("old token still accepted (err %v)", err)
	})
	if err := n.ready(t); err != nil {
		t.Fatal(err)
	}
}
