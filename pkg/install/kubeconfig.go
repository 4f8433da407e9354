package install

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
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
