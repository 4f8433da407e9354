// Package credentials is what the consul-cni plugin authenticates with on a
// node, as the installer derives it: the source (the installer's own client
// configuration, FromREST), the plugin's kubeconfig rendered from it
// (Kubeconfig), and which token belongs in the plugin's token file when
// two installers run on the node at once (Decide, token.go).
//
// The plugin runs once per CNI call on the host, outside any pod, so it
// cannot read a projected service-account token itself. The installer
// copies its own pod-bound token into a file beside the kubeconfig and
// refreshes it at every pass; the kubeconfig names that file (tokenFile)
// and never embeds a token, so a rotated token reaches the plugin without
// rewriting the kubeconfig, and a kubeconfig is recognisably ours (Ours):
// consul-k8s's installer embeds its token in a kubeconfig of the same
// kind. Credentials a token file cannot carry (client certificates, exec
// and auth providers, basic authentication) are refused with an error that
// says so.
//
// The package decides and renders; it writes nothing. The installer
// (pkg/install) writes both files atomically with pkg/install/nodefile and
// orders them: the kubeconfig first (it holds no secret), and never a
// chain entry before a kubeconfig exists.
package credentials

import (
	"bytes"
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

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/conflist"
)

// Source is what the plugin's kubeconfig is derived from: the installer's
// own client configuration. The plugin authenticates with the installer's
// service-account token through a file the installer keeps refreshed; the
// kubeconfig never embeds a token.
type Source struct {
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

// FromREST derives the source from a client configuration (in-cluster, or
// a kubeconfig). Client-certificate, exec and auth-provider credentials
// cannot be handed to the plugin as a token file and are refused with an
// error that says so.
func FromREST(c *rest.Config) (Source, error) {
	if c == nil {
		return Source{}, errors.New("no client configuration")
	}
	s := Source{
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

// ReadToken reads the current token.
func (s Source) ReadToken() ([]byte, error) {
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

// Kubeconfig renders the plugin's kubeconfig. hostTokenPath is the token
// file's path as the plugin (on the host) sees it.
func Kubeconfig(s Source, hostTokenPath string) ([]byte, error) {
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

// Ours reports whether a kubeconfig is one an installer of ours wrote:
// every user authenticates with a tokenFile named cniconf.TokenFileName
// and nothing else (no embedded token, certificate, exec or auth
// provider). consul-k8s's installer embeds a token in its kubeconfig, so a
// file of its under the same name is never taken for ours. A file that
// does not parse is not ours either.
func Ours(kubeconfig []byte) bool {
	cfg, err := clientcmd.Load(kubeconfig)
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

// maxConfigDepth bounds how deep under the net dir NamedBy looks
// (<net dir>/<dir>/<dir>/<file>: plugin directories, Multus's).
const maxConfigDepth = 3

// maxConfigSize bounds the configuration files NamedBy reads.
const maxConfigSize = 1 << 20

// NamedBy lists the network configuration files under netDir (.conf,
// .conflist, .json, at most maxConfigDepth deep; paths relative to netDir)
// with a "kubeconfig" key, at any depth, that the plugin would resolve to
// the net dir's file name: the name itself (or its path in hostNetDir, the
// net dir as the plugin on the host sees it), or a name the plugin
// completes with "-*" to it.
func NamedBy(netDir, hostNetDir, name string) ([]string, error) {
	var out []string
	root := filepath.Clean(netDir)
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
		if json.Unmarshal(b, &v) == nil && namesKubeconfig(v, hostNetDir, name) {
			out = append(out, rel)
		}
		return nil
	})
	return out, err
}

// namesKubeconfig reports whether a decoded JSON value has a "kubeconfig"
// string, at any depth, that resolves to the net dir's file name.
func namesKubeconfig(v any, hostNetDir, name string) bool {
	switch t := v.(type) {
	case map[string]any:
		for k, x := range t {
			if s, ok := x.(string); ok && k == "kubeconfig" && resolvesTo(s, hostNetDir, name) {
				return true
			}
			if namesKubeconfig(x, hostNetDir, name) {
				return true
			}
		}
	case []any:
		for _, x := range t {
			if namesKubeconfig(x, hostNetDir, name) {
				return true
			}
		}
	}
	return false
}

// resolvesTo reports whether the kubeconfig key value may resolve to the
// net dir's file name, as the plugin resolves it (the file itself, or the
// newest "<value>-*").
func resolvesTo(value, hostNetDir, name string) bool {
	if value == "" {
		return false
	}
	if filepath.IsAbs(value) {
		if filepath.Dir(value) != filepath.Clean(hostNetDir) {
			return false
		}
		value = filepath.Base(value)
	}
	return value == name || strings.HasPrefix(name, value+"-")
}
