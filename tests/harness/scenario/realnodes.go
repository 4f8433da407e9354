package scenario

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/realnode"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
)

// RealNodes starts real nodes (tests/harness/realnode): kubelet with its
// own containerd and runc. The injected pods run the podprog image; the
// installer, the controller and the init-container check run from the
// project's own images (built as `make images` builds them, for this
// machine's platform, from this tree), imported into the node's
// containerd.
type RealNodes struct {
	e *Env
	// podprog is tests/cmd/podprog as an image; the others are the
	// project's images.
	podprog, installer, repair, check realnode.Image
	cniBinDir                         string
}

// projectImageTag tags the project's images the runs build.
const projectImageTag = "scenario"

// NewRealNodes builds the images the runs need on real nodes.
func NewRealNodes(tb testbin.TB, e *Env) (*RealNodes, error) {
	tb.Helper()
	realnode.BuildImages(tb)
	rn := &RealNodes{e: e, podprog: realnode.ProgramImage(tb, "podprog"), cniBinDir: realnode.CNIPluginDir(tb)}
	want := map[string]*realnode.Image{"consul-cni-installer": &rn.installer, "repair": &rn.repair, "consul-cni-check": &rn.check}
	for _, img := range realnode.ProjectImages(tb, projectImageTag) {
		name, _, _ := strings.Cut(img.Ref[strings.LastIndexByte(img.Ref, '/')+1:], ":")
		if p := want[name]; p != nil {
			*p = img
			delete(want, name)
		}
	}
	for name := range want {
		return nil, fmt.Errorf("realnode.ProjectImages built no image %s", name)
	}
	return rn, nil
}

// Kind is "real".
func (s *RealNodes) Kind() string { return "real" }

// PodImages: every container runs the podprog image by its entrypoint;
// the check runs from the project's image.
func (s *RealNodes) PodImages() PodImages {
	return PodImages{ConnectInit: s.podprog.Ref, Dataplane: s.podprog.Ref, App: s.podprog.Ref, Entrypoint: true, Check: s.check.Ref}
}

// Start starts a real node with the images imported.
func (s *RealNodes) Start(ctx context.Context, spec NodeSpec) (Node, error) {
	n, err := realnode.Start(ctx, s.e.Cluster, s.e.Range, realnode.Options{
		Name: spec.Name, Labels: spec.Labels, Taints: spec.Taints, Logf: spec.Logf, CNIBinDir: s.cniBinDir,
		Images: realnode.Archives(s.podprog, s.installer, s.repair, s.check),
	})
	if err != nil {
		return nil, err
	}
	if err := n.WaitReady(ctx); err != nil {
		n.Stop()
		return nil, err
	}
	return &realNode{Node: n}, nil
}

// Installer runs the manifest's installer from the project's image (its
// hostPaths are the node's own CNI directories).
func (s *RealNodes) Installer(_ Node, spec *corev1.PodSpec) error {
	setImage(spec, s.installer.Ref)
	return nil
}

// ControllerPod is true: the controller runs from its image.
func (s *RealNodes) ControllerPod() bool { return true }

// Controller runs the manifest's controller from the project's image.
func (s *RealNodes) Controller(_ Node, spec *corev1.PodSpec) error {
	setImage(spec, s.repair.Ref)
	return nil
}

// setImage names the imported image in every container of spec.
func setImage(spec *corev1.PodSpec, ref string) {
	for i := range spec.Containers {
		spec.Containers[i].Image = ref
		spec.Containers[i].ImagePullPolicy = corev1.PullNever
	}
}

// realNode is a real node as a run's Node.
type realNode struct {
	*realnode.Node
}

func (n *realNode) Name() string            { return n.Node.Name }
func (n *realNode) Root() string            { return n.Dir }
func (n *realNode) BinDir() string          { return n.CNIBinDir() }
func (n *realNode) PrimaryConflist() string { return filepath.Join(n.ConfDir(), realnode.ConfListFile) }

// ContainerNamespaces: the node's mount and network namespaces, and the
// API server at the kubernetes Service's address there.
func (n *realNode) ContainerNamespaces() (mountNS, netNS, apiServer string) {
	return n.MountNamespace(), n.Netns, realnode.APIServerURL()
}

// APIServer is the API server as the node's processes reach it.
func (n *realNode) APIServer() string { return realnode.APIServerURL() }

// LogFiles lists the logs kubelet writes (podLogsDir, CRI format).
func (n *realNode) LogFiles() ([]LogFile, error) {
	return podLogFiles(filepath.Join(n.Dir, "pod-logs"))
}

// RecreateSandbox kills the pod's sandbox (its pause process): kubelet
// sees it gone, stops the pod's containers and makes a new sandbox.
func (n *realNode) RecreateSandbox(ctx context.Context, uid types.UID) error {
	out, err := n.Ctr(ctx, "containers", "ls", "-q",
		fmt.Sprintf(`labels."io.kubernetes.pod.uid"==%s,labels."io.cri-containerd.kind"==sandbox`, uid))
	if err != nil {
		return err
	}
	ids := strings.Fields(out)
	if len(ids) == 0 {
		return fmt.Errorf("node %s: no sandbox of pod uid %s", n.Name(), uid)
	}
	for _, id := range ids {
		if _, err := n.Ctr(ctx, "tasks", "kill", "--signal", "SIGKILL", id); err != nil {
			return err
		}
	}
	return nil
}

// Reboot restarts kubelet and containerd with every sandbox lost
// (realnode.Node.Restart) and waits until the node is Ready again.
func (n *realNode) Reboot(ctx context.Context, whileDown func() error) error {
	if err := n.Restart(ctx, whileDown); err != nil {
		return err
	}
	return n.WaitReady(ctx)
}
