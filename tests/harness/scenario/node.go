package scenario

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Node is what a run needs from the node its pods land on. The runs are
// written against it only, so they run on simulated nodes (simnode) and on
// real ones (kubelet with containerd) alike.
type Node interface {
	// Name is the Node object's name.
	Name() string
	// Root is a directory of the node's own on this machine (state the
	// test writes for the node, such as consul-cni's state directory).
	Root() string
	// ConfDir and BinDir are the host directories the node's runtime
	// reads CNI configuration and plugins from; PrimaryConflist is the
	// file of the primary network in ConfDir.
	ConfDir() string
	BinDir() string
	PrimaryConflist() string
	// APIServer is the URL a CNI plugin on the node reaches the API
	// server at.
	APIServer() string
	// LogFiles lists the container logs on the node.
	LogFiles() ([]LogFile, error)
	// RecreateSandbox makes the pod with uid lose its sandbox; the node
	// makes a new one with the CNI configuration of that moment.
	RecreateSandbox(ctx context.Context, uid types.UID) error
	// Reboot stops the node's kubelet and runtime with every sandbox
	// lost, calls whileDown, and starts them again; it returns once the
	// node is Ready again.
	Reboot(ctx context.Context, whileDown func() error) error
	// Stop stops the node and deletes its Node object.
	Stop()
}

// LogFile is one container instance's output on a node. Lines are the
// program's output, or in the CRI logging format when a kubelet wrote them
// (criLine removes the prefix).
type LogFile struct {
	Namespace, Pod string
	UID            types.UID
	Container      string
	Instance       int
	Path           string
}

// NodeSpec is the node a run asks for: it joins the cluster with only the
// primary network in its CNI configuration.
type NodeSpec struct {
	Name   string
	Labels map[string]string
	// Taints the node registers with.
	Taints []corev1.Taint
	Logf   func(format string, args ...any)
}

// Nodes starts the nodes of one kind.
type Nodes interface {
	// Kind names the kind ("simnode", "real").
	Kind() string
	// Start starts a node; it returns once the node is Ready. The node's
	// Stop undoes everything Start made.
	Start(ctx context.Context, spec NodeSpec) (Node, error)
	// PodImages are the images of the injected pods on these nodes.
	PodImages() PodImages
	// Installer adapts the pod of the installer DaemonSet (pinned to n)
	// to these nodes: the image to run, the host's CNI directories.
	Installer(n Node, spec *corev1.PodSpec) error
	// ControllerPod tells whether the repair controller runs as the
	// manifests' Deployment on these nodes (else as a process of the
	// test); Controller then adapts its pod (pinned to n, the run's flags
	// set) to these nodes.
	ControllerPod() bool
	Controller(n Node, spec *corev1.PodSpec) error
}

// NodeInfo is what the node reports of itself (the Node's
// status.nodeInfo).
type NodeInfo struct {
	Kind    string `json:"kind"`
	Kubelet string `json:"kubelet"`
	Runtime string `json:"runtime"`
}

func (r *runner) nodeInfo(ctx context.Context) *NodeInfo {
	n, err := r.cs.CoreV1().Nodes().Get(ctx, r.node.Name(), metav1.GetOptions{})
	if err != nil {
		return nil
	}
	return &NodeInfo{Kind: r.e.Nodes.Kind(), Kubelet: n.Status.NodeInfo.KubeletVersion, Runtime: n.Status.NodeInfo.ContainerRuntimeVersion}
}

// criLine returns the program's output of a container log line: a line in
// the CRI logging format ("<time> stdout|stderr F|P <output>") loses its
// prefix, any other line is returned as it is.
func criLine(l string) string {
	f := strings.SplitN(l, " ", 4)
	if len(f) == 4 && (f[1] == "stdout" || f[1] == "stderr") && (f[2] == "F" || f[2] == "P") {
		if _, err := time.Parse(time.RFC3339Nano, f[0]); err == nil {
			return f[3]
		}
	}
	return l
}

// writeFileAtomic writes a file aside and renames it into place, as a CNI
// configuration must be written.
func writeFileAtomic(file string, b []byte) error {
	tmp := filepath.Join(filepath.Dir(file), "."+filepath.Base(file)+".tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, file); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", file, err)
	}
	return nil
}
