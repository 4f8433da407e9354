package scenario

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/realnode"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
)

// RealNodes starts real nodes (tests/harness/realnode): kubelet with its
// own containerd and runc. The injected pods run the podprog image; the
// installer runs from the project's own image (`make images`), imported
// into the node's containerd.
type RealNodes struct {
	e *Env
	// podprog is tests/cmd/podprog as an image; installer and repair the
	// project's images.
	podprog, installer, repair, check realnode.Image
	cniBinDir                         string
}

// ImagesDirEnv names the directory of the project's image archives
// (`make images`); default: <repository>/bin/images.
const ImagesDirEnv = "CCR_IMAGES_DIR"

// NewRealNodes builds the images the runs need on real nodes: pause and
// podprog (tests/harness/realnode), and finds the installer's archive of
// `make images`.
func NewRealNodes(tb testbin.TB, e *Env) (*RealNodes, error) {
	tb.Helper()
	realnode.BuildImages(tb)
	rn := &RealNodes{e: e, podprog: realnode.ProgramImage(tb, "podprog"), cniBinDir: realnode.CNIPluginDir(tb)}
	dir := os.Getenv(ImagesDirEnv)
	if dir == "" {
		dir = filepath.Join(testbin.RepoRoot(), "bin", "images")
	}
	for name, img := range map[string]*realnode.Image{"consul-cni-installer": &rn.installer, "repair": &rn.repair, "consul-cni-check": &rn.check} {
		archive := filepath.Join(dir, name+".oci.tar")
		ref, err := archiveRef(archive)
		if err != nil {
			return nil, fmt.Errorf("image %s of the project (build it with `make images`): %w", name, err)
		}
		*img = realnode.Image{Ref: ref, Archive: archive}
	}
	return rn, nil
}

// archiveRef returns the name an OCI archive gives its image (the
// io.containerd.image.name annotation of index.json, as `make images`
// writes it).
func archiveRef(archive string) (string, error) {
	f, err := os.Open(archive)
	if err != nil {
		return "", err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return "", fmt.Errorf("%s: no index.json", archive)
			}
			return "", fmt.Errorf("%s: %w", archive, err)
		}
		if strings.TrimPrefix(h.Name, "./") != "index.json" {
			continue
		}
		var idx struct {
			Manifests []struct {
				Annotations map[string]string `json:"annotations"`
			} `json:"manifests"`
		}
		if err := json.NewDecoder(tr).Decode(&idx); err != nil {
			return "", fmt.Errorf("%s: index.json: %w", archive, err)
		}
		for _, m := range idx.Manifests {
			if ref := m.Annotations["io.containerd.image.name"]; ref != "" {
				return ref, nil
			}
		}
		return "", fmt.Errorf("%s: index.json names no image (annotation io.containerd.image.name)", archive)
	}
}

// Kind is "real".
func (s *RealNodes) Kind() string { return "real" }

// PodImages: every container runs the podprog image by its entrypoint.
func (s *RealNodes) PodImages() PodImages {
	return PodImages{ConnectInit: s.podprog.Ref, Dataplane: s.podprog.Ref, App: s.podprog.Ref, Entrypoint: true, Check: s.check.Ref}
}

// Start starts a real node with the images imported.
func (s *RealNodes) Start(ctx context.Context, spec NodeSpec) (Node, error) {
	n, err := realnode.Start(ctx, s.e.Cluster, s.e.Range, realnode.Options{
		Name: spec.Name, Labels: spec.Labels, Taints: spec.Taints, Logf: spec.Logf, CNIBinDir: s.cniBinDir,
		Images: []string{s.podprog.Archive, s.installer.Archive, s.repair.Archive, s.check.Archive},
	})
	if err != nil {
		return nil, err
	}
	if err := n.WaitReady(ctx); err != nil {
		n.Stop()
		return nil, err
	}
	return &realNode{Node: n, api: s.e.Cluster.Config.Host}, nil
}

// Installer runs the installer from the project's image on the node's own
// CNI directories; the API server is reached on loopback (the node's
// hostNetwork pods share this machine's network, with no Service proxy);
// its metrics port, fixed in the manifest, is turned off so that nodes and
// other users of this machine do not collide on it.
func (s *RealNodes) Installer(n Node, spec *corev1.PodSpec) error {
	env, err := s.apiEnv()
	if err != nil {
		return err
	}
	dirs := map[string]string{"/opt/cni/bin": n.BinDir(), "/etc/cni/net.d": n.ConfDir()}
	for i := range spec.Volumes {
		if hp := spec.Volumes[i].HostPath; hp != nil && dirs[hp.Path] != "" {
			hp.Path = dirs[hp.Path]
		}
	}
	for i := range spec.Containers {
		c := &spec.Containers[i]
		c.Image = s.installer.Ref
		c.ImagePullPolicy = corev1.PullNever
		c.Args = hostDirArgs(c.Args, n)
		if c.ReadinessProbe != nil && c.ReadinessProbe.Exec != nil {
			c.ReadinessProbe.Exec.Command = hostDirArgs(c.ReadinessProbe.Exec.Command, n)
		}
		c.Env = append(c.Env, env...)
	}
	return nil
}

// ControllerPod is true: the controller runs from its image.
func (s *RealNodes) ControllerPod() bool { return true }

// Controller runs the controller from the project's image on the node's
// network, reaching the API server on loopback (it listens there only, and
// there is no Service proxy).
func (s *RealNodes) Controller(_ Node, spec *corev1.PodSpec) error {
	env, err := s.apiEnv()
	if err != nil {
		return err
	}
	spec.HostNetwork = true
	spec.DNSPolicy = corev1.DNSClusterFirstWithHostNet
	for i := range spec.Containers {
		c := &spec.Containers[i]
		c.Image = s.repair.Ref
		c.ImagePullPolicy = corev1.PullNever
		c.Env = append(c.Env, env...)
	}
	return nil
}

// apiEnv points in-cluster clients at the API server's own address, in
// place of the kubernetes Service's.
func (s *RealNodes) apiEnv() ([]corev1.EnvVar, error) {
	host, port, err := hostPort(s.e.Cluster.Config.Host)
	if err != nil {
		return nil, err
	}
	return []corev1.EnvVar{{Name: "KUBERNETES_SERVICE_HOST", Value: host}, {Name: "KUBERNETES_SERVICE_PORT", Value: port}}, nil
}

// hostDirArgs points the installer's host directory flags at the node's
// and drops the metrics address.
func hostDirArgs(args []string, n Node) []string {
	out := make([]string, 0, len(args)+2)
	for _, a := range args {
		switch {
		case strings.HasPrefix(a, "--metrics-bind-address="):
			continue
		case strings.HasPrefix(a, "--host-cni-net-dir="):
			a = "--host-cni-net-dir=" + n.ConfDir()
		case strings.HasPrefix(a, "--host-cni-bin-dir="):
			continue
		}
		out = append(out, a)
	}
	return append(out, "--host-cni-bin-dir="+n.BinDir())
}

func hostPort(url string) (string, string, error) {
	hp := strings.TrimPrefix(url, "https://")
	i := strings.LastIndexByte(hp, ':')
	if i < 0 {
		return "", "", fmt.Errorf("API server URL %q has no port", url)
	}
	if _, err := strconv.Atoi(hp[i+1:]); err != nil {
		return "", "", fmt.Errorf("API server URL %q: port: %w", url, err)
	}
	return hp[:i], hp[i+1:], nil
}

// realNode is a real node as a run's Node.
type realNode struct {
	*realnode.Node
	api string
}

func (n *realNode) Name() string            { return n.Node.Name }
func (n *realNode) Root() string            { return n.Dir }
func (n *realNode) BinDir() string          { return n.CNIBinDir() }
func (n *realNode) PrimaryConflist() string { return filepath.Join(n.ConfDir(), realnode.ConfListFile) }
func (n *realNode) APIServer() string       { return n.api }

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
