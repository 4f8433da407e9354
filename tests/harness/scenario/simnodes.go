package scenario

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/podnet"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/simnode"
)

// SimNodes starts simulated nodes (tests/harness/simnode): containers are
// processes of the binaries the Env built, in network namespaces made by
// the node's CNI chain.
type SimNodes struct{ e *Env }

// Kind is "simnode".
func (s *SimNodes) Kind() string { return "simnode" }

// Start starts a simulated node with a fresh root and pod subnet.
func (s *SimNodes) Start(ctx context.Context, spec NodeSpec) (Node, error) {
	e := s.e
	idx, release, err := podnet.AllocSubnet()
	if err != nil {
		return nil, err
	}
	sn := &simNode{release: release, client: e.Cluster.Client}
	if sn.root, err = simnode.NewRoot(e.Bins.CNIPlugins, e.Range, idx); err != nil {
		release()
		return nil, err
	}
	cfg := simnode.Config{
		Name: spec.Name, Client: e.Cluster.Client, RestConfig: e.Cluster.Config, Root: sn.root,
		Labels: spec.Labels, Taints: spec.Taints, Programs: s.programs(),
		Range: e.Range, PodSubnet: e.Range.Subnet4(idx, 24), SyncRetry: 2 * time.Second, Logf: spec.Logf,
	}
	if sn.Node, err = simnode.Start(ctx, cfg); err != nil {
		sn.Stop()
		return nil, err
	}
	if err := sn.WaitReady(ctx); err != nil {
		sn.Stop()
		return nil, err
	}
	return sn, nil
}

// PodImages are SimPodImages.
func (s *SimNodes) PodImages() PodImages { return SimPodImages }

// Installer leaves the DaemonSet as the manifests have it: a simulated node
// runs the installer built from this tree for its image and roots its host
// paths in the node's directory.
func (s *SimNodes) Installer(Node, *corev1.PodSpec) error { return nil }

// ControllerPod is false: the controller runs as a process of the test.
func (s *SimNodes) ControllerPod() bool { return false }

// Controller is not called for simulated nodes.
func (s *SimNodes) Controller(Node, *corev1.PodSpec) error {
	return errors.New("simulated nodes run the controller as a process")
}

// programs maps the images the runs use to the Env's binaries.
func (s *SimNodes) programs() map[string]string {
	b := s.e.Bins
	p := map[string]string{"podprog": b.PodProg, "consul-k8s-control-plane": b.PodProg, "consul-dataplane": b.PodProg}
	if b.Installer != "" {
		p["consul-cni-installer"] = b.Installer
	}
	if b.Check != "" {
		p["consul-cni-check"] = b.Check
	}
	if b.Repair != "" {
		p["repair"] = b.Repair
	}
	return p
}

// simNode is a simulated node as a run's Node.
type simNode struct {
	*simnode.Node
	root    string
	release func()
	client  kubernetes.Interface
}

func (n *simNode) PrimaryConflist() string {
	return filepath.Join(n.ConfDir(), simnode.PrimaryNetworkFile)
}

func (n *simNode) LogFiles() ([]LogFile, error) { return logFiles(simnode.LogFiles(n.root)) }

// podLogFiles lists the logs in a directory laid out as kubelet's
// podLogsDir.
func podLogFiles(dir string) ([]LogFile, error) { return logFiles(simnode.PodLogFiles(dir)) }

func logFiles(files []simnode.LogFile, err error) ([]LogFile, error) {
	out := make([]LogFile, 0, len(files))
	for _, f := range files {
		out = append(out, LogFile(f))
	}
	return out, err
}

func (n *simNode) RecreateSandbox(_ context.Context, uid types.UID) error {
	return n.Node.RecreateSandbox(uid)
}

// Reboot on a simulated node: whileDown runs first, then every pod bound
// to the node loses its sandbox and gets a new one, as after a restart of
// kubelet and containerd with the sandboxes gone. The simulated kubelet
// itself keeps running.
func (n *simNode) Reboot(ctx context.Context, whileDown func() error) error {
	l, err := n.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Name()})
	if err != nil {
		return err
	}
	if err := whileDown(); err != nil {
		return err
	}
	for _, p := range l.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		if err := n.Node.RecreateSandbox(p.UID); err != nil {
			return fmt.Errorf("reboot: pod %s/%s: %w", p.Namespace, p.Name, err)
		}
	}
	return n.WaitReady(ctx)
}

func (n *simNode) Stop() {
	if n.Node != nil {
		n.Node.Stop()
	}
	os.RemoveAll(n.root)
	n.release()
}
