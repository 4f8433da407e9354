package plugin

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
)

// ErrNoKubeconfig means the configured kubeconfig does not exist at all
// (cniconf.ResolveKubeconfig): the installer removed it with the plugin
// (uninstall), or someone removed it by hand.
var ErrNoKubeconfig = cniconf.ErrNoKubeconfig

// ResolveKubeconfig is cniconf.ResolveKubeconfig (the rule the installer
// also checks before it chains the plugin: only absence is
// ErrNoKubeconfig), with one addition: a consul-k8s name
// (ZZZ-consul-cni-kubeconfig, possibly with a suffix) that resolves to
// nothing falls back to the kubeconfig this project's installer writes in
// dir, when it is there: our installer serves the entry consul-k8s's
// installer appends before that installer has written its kubeconfig, and
// the attachments of consul-k8s's NetworkAttachmentDefinition, which names
// its kubeconfig by the bare name. Ours there but unusable fails closed.
func ResolveKubeconfig(dir, name string) (string, error) {
	path, err := cniconf.ResolveKubeconfig(dir, name)
	if errors.Is(err, ErrNoKubeconfig) && !filepath.IsAbs(name) && strings.HasPrefix(name, cniconf.ConsulK8sKubeconfigFileName) {
		ours, oerr := cniconf.ResolveKubeconfig(dir, cniconf.KubeconfigFileName)
		if !errors.Is(oerr, ErrNoKubeconfig) {
			return ours, oerr
		}
	}
	return path, err
}

// NewKubeClient builds the API client from the configured kubeconfig. A
// tokenFile in the kubeconfig is read on every request, so a token rotated
// on disk keeps working. Every request is bounded by api_timeout.
func NewKubeClient(conf *Config) (PodClient, string, error) {
	path, err := ResolveKubeconfig(conf.netDir(), conf.Kubeconfig)
	if err != nil {
		return nil, "", err
	}
	c, err := loadKubeconfig(path, conf.apiTimeout)
	if err != nil {
		return nil, path, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	return c, path, nil
}
