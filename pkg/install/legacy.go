package install

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/klog/v2"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/credentials"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/nodefile"
)

// legacyKubeconfigIsOurs reports whether the file under
// cniconf.LegacyKubeconfigFileName is a kubeconfig an earlier installer of
// ours wrote (and not consul-k8s's, which shares the name).
func (in *Installer) legacyKubeconfigIsOurs() bool {
	path := filepath.Join(in.cfg.NetDir, cniconf.LegacyKubeconfigFileName)
	st, err := os.Lstat(path)
	if err != nil || !st.Mode().IsRegular() {
		return false
	}
	b, err := os.ReadFile(path)
	return err == nil && credentials.Ours(b)
}

// settleLegacyKubeconfig deals with a kubeconfig of ours under the name
// earlier installers of ours used (cniconf.LegacyKubeconfigFileName, the
// name consul-k8s uses too) once our entry names the current one. It is
// removed, unless another configuration may still name it: a network
// configuration in the net dir (a list, a plugin directory, a Multus
// delegate) whose "kubeconfig" resolves to it as the plugin resolves the
// key (the file, or the newest "<name>-*"), or, with Multus, a
// NetworkAttachmentDefinition, which the installer cannot see
// (consul-k8s's hard-codes "kubeconfig": "ZZZ-consul-cni-kubeconfig").
// Kept, it is brought up to date with the current kubeconfig, so such an
// attachment authenticates as the installer's plugin does. wrote says
// what changed.
func (in *Installer) settleLegacyKubeconfig(ctx context.Context) (wrote string, err error) {
	if !in.legacyKubeconfigIsOurs() {
		return "", nil
	}
	legacy := filepath.Join(in.cfg.NetDir, cniconf.LegacyKubeconfigFileName)
	namedBy, err := credentials.NamedBy(in.cfg.NetDir, in.cfg.HostNetDir, cniconf.LegacyKubeconfigFileName)
	if err != nil {
		return "", fmt.Errorf("looking for configurations that name %s: %w", legacy, err)
	}
	if len(namedBy) == 0 && !in.cfg.Multus {
		if err := nodefile.RemoveIfExists(legacy); err != nil {
			return "", fmt.Errorf("removing the kubeconfig %s an earlier installer wrote: %w", legacy, err)
		}
		klog.FromContext(ctx).Info("Removed the plugin kubeconfig an earlier installer wrote", "file", legacy, "now", cniconf.KubeconfigFileName)
		return "removed " + cniconf.LegacyKubeconfigFileName, nil
	}
	kc, err := credentials.Kubeconfig(*in.cfg.Client, filepath.Join(in.cfg.HostNetDir, cniconf.TokenFileName))
	if err != nil {
		return "", err
	}
	if cur, err := os.ReadFile(legacy); err == nil && bytes.Equal(cur, kc) {
		return "", nil
	}
	if err := nodefile.WriteAtomic(legacy, kc, 0o600); err != nil {
		return "", fmt.Errorf("updating the kubeconfig %s other configurations name: %w", legacy, err)
	}
	klog.FromContext(ctx).Info("Keeping the plugin kubeconfig under its earlier name: other configurations name it", "file", legacy, "namedBy", namedBy, "multus", in.cfg.Multus)
	return "kept " + cniconf.LegacyKubeconfigFileName, nil
}
