package install

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/klog/v2"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/conflist"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/nodefile"
)

// ClientSource is what the plugin's kubeconfig is derived from: the
// installer's own client configuration. The plugin authenticates with the
// installer's service-account token through a file the installer keeps
// refreshed; the kubeconfig never embeds a token.
type ClientSource struct {
	Server        string
	CAData        []byte
	Insecure      bool
	TLSServerName string
	// TokenFile is the installer's token (for a pod, the projected
	// service-account token that kubelet rotates). It is copied to the
	// plugin's token file at every refresh.
	TokenFile string
	// Token is used when the client configuration has a token but no file
	// (it cannot be refreshed then).
	Token string
}

// ClientSourceFromREST derives the source from a client configuration
// (in-cluster, or a kubeconfig). Client-certificate, exec and auth-provider
// credentials cannot be handed to the plugin as a token file and are
// refused with an error that says so.
func ClientSourceFromREST(c *rest.Config) (ClientSource, error) {
	if c == nil {
		return ClientSource{}, errors.New("no client configuration")
	}
	s := ClientSource{
		Server:        c.Host,
		Insecure:      c.Insecure,
		TLSServerName: c.ServerName,
		TokenFile:     c.BearerTokenFile,
		Token:         c.BearerToken,
	}
	if s.Server == "" {
		return s, errors.New("client configuration has no server")
	}
	if !strings.Contains(s.Server, "://") {
		s.Server = "https://" + s.Server
	}
	switch {
	case len(c.CAData) > 0:
		s.CAData = c.CAData
	case c.CAFile != "":
		b, err := os.ReadFile(c.CAFile)
		if err != nil {
			return s, fmt.Errorf("reading the client configuration's CA file: %w", err)
		}
		s.CAData = b
	}
	if s.TokenFile == "" && s.Token == "" {
		kind := "no token"
		switch {
		case c.CertFile != "" || len(c.CertData) > 0:
			kind = "a client certificate"
		case c.ExecProvider != nil:
			kind = "an exec credential plugin"
		case c.AuthProvider != nil:
			kind = "an auth provider"
		case c.Username != "":
			kind = "basic authentication"
		}
		return s, fmt.Errorf("client configuration for %s authenticates with %s: the plugin kubeconfig needs a bearer token (service-account token file)", s.Server, kind)
	}
	return s, nil
}

// token reads the current token.
func (s ClientSource) token() ([]byte, error) {
	if s.TokenFile != "" {
		b, err := os.ReadFile(s.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("reading service-account token: %w", err)
		}
		b = bytes.TrimSpace(b)
		if len(b) == 0 {
			return nil, fmt.Errorf("service-account token file %s is empty", s.TokenFile)
		}
		return b, nil
	}
	return []byte(strings.TrimSpace(s.Token)), nil
}

// PluginKubeconfig renders the plugin's kubeconfig. hostTokenPath is the
// token file's path as the plugin (on the host) sees it.
func PluginKubeconfig(s ClientSource, hostTokenPath string) ([]byte, error) {
	cfg := clientcmdapi.Config{
		Clusters: map[string]*clientcmdapi.Cluster{
			"local": {
				Server:                   s.Server,
				CertificateAuthorityData: s.CAData,
				InsecureSkipTLSVerify:    s.Insecure,
				TLSServerName:            s.TLSServerName,
			},
		},
		AuthInfos: map[string]*clientcmdapi.AuthInfo{
			"consul-cni": {TokenFile: hostTokenPath},
		},
		Contexts: map[string]*clientcmdapi.Context{
			"consul-cni": {Cluster: "local", AuthInfo: "consul-cni"},
		},
		CurrentContext: "consul-cni",
	}
	return clientcmd.Write(cfg)
}

// ownKubeconfig reports whether a kubeconfig is one an installer of ours
// wrote: every user authenticates with a tokenFile named
// cniconf.TokenFileName and nothing else (no embedded token, certificate,
// exec or auth provider). consul-k8s's installer embeds a token in its
// kubeconfig, so a file of its under the same name is never taken for
// ours. A file that does not parse is not ours either.
func ownKubeconfig(b []byte) bool {
	cfg, err := clientcmd.Load(b)
	if err != nil || len(cfg.AuthInfos) == 0 {
		return false
	}
	for _, a := range cfg.AuthInfos {
		switch {
		case a == nil, a.Token != "", filepath.Base(a.TokenFile) != cniconf.TokenFileName,
			a.ClientCertificate != "", len(a.ClientCertificateData) > 0, a.Exec != nil, a.AuthProvider != nil,
			a.Username != "", a.Password != "":
			return false
		}
	}
	return true
}

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
	return err == nil && ownKubeconfig(b)
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
	namedBy, err := in.configsNaming(cniconf.LegacyKubeconfigFileName)
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
	kc, err := PluginKubeconfig(*in.cfg.Client, filepath.Join(in.cfg.HostNetDir, cniconf.TokenFileName))
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

// maxConfigDepth bounds how deep under the net dir configsNaming looks
// (<net dir>/<dir>/<dir>/<file>: plugin directories, Multus's).
const maxConfigDepth = 3

// configsNaming lists the network configuration files under the net dir
// (.conf, .conflist, .json, at most maxConfigDepth deep) with a
// "kubeconfig" key, at any depth, that the plugin would resolve to the
// net dir's file name: the name itself (or its path in the host's net dir),
// or a name the plugin completes with "-*" to it.
func (in *Installer) configsNaming(name string) ([]string, error) {
	var out []string
	root := filepath.Clean(in.cfg.NetDir)
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if path == root {
				return err
			}
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if path != root && strings.Count(rel, string(filepath.Separator)) >= maxConfigDepth-1 {
				return fs.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() || !slices.Contains(conflist.Extensions, filepath.Ext(path)) {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil || len(b) > maxConfigSize {
			return nil
		}
		var v any
		if json.Unmarshal(b, &v) == nil && in.namesKubeconfig(v, name) {
			out = append(out, rel)
		}
		return nil
	})
	return out, err
}

// maxConfigSize bounds the configuration files configsNaming reads.
const maxConfigSize = 1 << 20

// namesKubeconfig reports whether a decoded JSON value has a "kubeconfig"
// string, at any depth, that resolves to the net dir's file name.
func (in *Installer) namesKubeconfig(v any, name string) bool {
	switch t := v.(type) {
	case map[string]any:
		for k, x := range t {
			if s, ok := x.(string); ok && k == "kubeconfig" && in.resolvesTo(s, name) {
				return true
			}
			if in.namesKubeconfig(x, name) {
				return true
			}
		}
	case []any:
		for _, x := range t {
			if in.namesKubeconfig(x, name) {
				return true
			}
		}
	}
	return false
}

// resolvesTo reports whether the kubeconfig key value may resolve to the
// net dir's file name, as the plugin resolves it (the file itself, or the
// newest "<value>-*").
func (in *Installer) resolvesTo(value, name string) bool {
	if value == "" {
		return false
	}
	if filepath.IsAbs(value) {
		if filepath.Dir(value) != filepath.Clean(in.cfg.HostNetDir) {
			return false
		}
		value = filepath.Base(value)
	}
	return value == name || strings.HasPrefix(name, value+"-")
}
