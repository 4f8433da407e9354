package scenario

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/proc"
)

// The node verifier's identity, as manifests/base/verifier makes it.
const (
	verifierNamespace = "consul-cni-repair"
	verifierAccount   = "consul-cni-verifier"
)

// startVerifier runs the node verifier (Config.Verifier) for the run's
// node as its DaemonSet pod would: in the node's mount namespace, reading
// the node's runtime and CNI directory, with a token of its ServiceAccount
// bound to the Node, which names the node as the pod-bound token does (the
// admission policy of manifests/base/verifier lets it write only that
// node's pods and Node). The first call applies that identity and policy.
// The process stops with the node when it reboots (killVerifier) and is
// started again once the node is back, as kubelet restarts the pod.
func (r *runner) startVerifier(ctx context.Context) error {
	n, ok := r.node.(*realNode)
	if !ok {
		return fmt.Errorf("the node verifier runs on real nodes, not on %s nodes", r.e.Nodes.Kind())
	}
	if r.e.Bins.Verifier == "" {
		return errors.New("consul-cni-verifier is not in this tree")
	}
	if r.verifier == nil {
		if err := ApplyManifests(ctx, r.cs, r.e.Manifests, "base/namespace.yaml", "base/verifier/rbac.yaml",
			"base/verifier/admission-policy.yaml"); err != nil {
			return err
		}
		r.verifier = &verifierRun{}
		r.onCleanup(r.stopVerifier)
	}
	kc, err := r.verifierKubeconfig(ctx)
	if err != nil {
		return err
	}
	log, err := os.OpenFile(filepath.Join(r.dir, "verifier.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := n.Command(r.e.Bins.Verifier, "--node-name="+n.Name(), "--cri-socket="+n.CRISocket(), "--host-root=/",
		"--cni-net-dir="+n.ConfDir(), "--kubeconfig="+kc, "--interval=1s", "-v=2")
	cmd.Stdout, cmd.Stderr = log, log
	if r.verifier.p, err = proc.Start(cmd, ""); err != nil {
		return err
	}
	r.logf("node verifier runs on %s", n.Name())
	return nil
}

// verifierRun is the node verifier's process of the run.
type verifierRun struct {
	p *proc.Process
}

// verifierKubeconfig writes a kubeconfig with a fresh Node-bound token of
// the verifier's ServiceAccount and returns its path.
func (r *runner) verifierKubeconfig(ctx context.Context) (string, error) {
	no, err := r.cs.CoreV1().Nodes().Get(ctx, r.node.Name(), metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	tr, err := r.cs.CoreV1().ServiceAccounts(verifierNamespace).CreateToken(ctx, verifierAccount, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3600)),
			BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Node", APIVersion: "v1", Name: no.Name, UID: no.UID}},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token of %s/%s bound to node %s: %w", verifierNamespace, verifierAccount, no.Name, err)
	}
	kc := filepath.Join(r.dir, "verifier.kubeconfig")
	cfg := &rest.Config{Host: r.e.Cluster.Server, BearerToken: tr.Status.Token,
		TLSClientConfig: rest.TLSClientConfig{CAData: r.e.Cluster.CAData}}
	return kc, cluster.WriteKubeconfig(kc, cfg, verifierAccount)
}

// killVerifier ends the verifier as a node that loses power does.
func (r *runner) killVerifier() {
	if v := r.verifier; v != nil && v.p != nil {
		v.p.Stop(0)
		v.p = nil
	}
}

// stopVerifier stops the verifier and logs the end of its log.
func (r *runner) stopVerifier() {
	if v := r.verifier; v != nil && v.p != nil {
		v.p.Stop(5 * time.Second)
		v.p = nil
	}
	if b, err := os.ReadFile(filepath.Join(r.dir, "verifier.log")); err == nil {
		r.logf("node verifier log:\n%s", tail(string(b), 25))
	}
}
