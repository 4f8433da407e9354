package consulk8s

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"k8s.io/client-go/tools/clientcmd"
)

// Environment of a simulated node's container that runs install-cni
// through the program of tests/cmd/consulk8spod (ExecInPod).
const (
	// EnvInstallCNI and EnvSourceDir are the unpacked Binaries.
	EnvInstallCNI = "CCR_CONSUL_K8S_INSTALL_CNI"
	EnvSourceDir  = "CCR_CONSUL_K8S_SOURCE_DIR"
)

// PodEnv is what a container running install-cni through ExecInPod needs
// besides what consul-k8s's chart gives it: where the binaries are.
func (b Binaries) PodEnv() map[string]string {
	return map[string]string{EnvInstallCNI: b.InstallCNI, EnvSourceDir: b.SourceDir}
}

// ExecInPod replaces the calling process (a simulated node's container,
// whose service account comes as $KUBECONFIG with a tokenFile) with
// install-cni, args being the container's arguments after the
// "install-cni" subcommand: the token and CA are copied into a
// service-account directory that install-cni sees at
// /var/run/secrets/kubernetes.io/serviceaccount in a mount namespace of its
// own, -bin-source-dir names the unpacked plugin, and
// KUBERNETES_SERVICE_HOST/PORT and POD_UID come from the container's
// environment as kubelet and the chart set them.
func ExecInPod(args []string) error {
	b := Binaries{InstallCNI: os.Getenv(EnvInstallCNI), SourceDir: os.Getenv(EnvSourceDir)}
	if b.InstallCNI == "" || b.SourceDir == "" {
		return fmt.Errorf("$%s and $%s must name the unpacked binaries", EnvInstallCNI, EnvSourceDir)
	}
	if len(args) > 0 && args[0] == InstallCNIName {
		args = args[1:]
	}
	if os.Getenv("KUBERNETES_SERVICE_HOST") == "" || os.Getenv("KUBERNETES_SERVICE_PORT") == "" {
		return errors.New("KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set")
	}
	cfg, err := clientcmd.LoadFromFile(os.Getenv("KUBECONFIG"))
	if err != nil {
		return fmt.Errorf("the pod's KUBECONFIG: %w", err)
	}
	kctx := cfg.Contexts[cfg.CurrentContext]
	if kctx == nil || cfg.Clusters[kctx.Cluster] == nil || cfg.AuthInfos[kctx.AuthInfo] == nil {
		return fmt.Errorf("the pod's KUBECONFIG has no complete current context")
	}
	tok, err := os.ReadFile(cfg.AuthInfos[kctx.AuthInfo].TokenFile)
	if err != nil {
		return fmt.Errorf("the pod's token: %w", err)
	}
	sa, err := os.MkdirTemp("", "consul-k8s-sa-")
	if err != nil {
		return err
	}
	files := map[string][]byte{"token": []byte(strings.TrimSpace(string(tok))), "ca.crt": cfg.Clusters[kctx.Cluster].CertificateAuthorityData}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(sa, name), data, 0o600); err != nil {
			return err
		}
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		return err
	}
	argv := append([]string{"unshare", "--mount", "--propagation", "private", "sh", "-c", mountScript, sa, b.InstallCNI},
		append(args, "-bin-source-dir="+b.SourceDir)...)
	return syscall.Exec(unshare, argv, os.Environ())
}
