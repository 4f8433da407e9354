package plugin

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// Pod is what the plugin reads of a pod.
type Pod struct {
	Namespace, Name, UID string
	Labels, Annotations  map[string]string
}

// PodClient is the part of the Kubernetes API the plugin uses: read a pod,
// merge-patch its metadata. The plugin binary implements it with a small
// REST client (restPods) so that it does not pay client-go's start-up cost
// on every CNI call; tests implement it over client-go's fake clientset.
type PodClient interface {
	GetPod(ctx context.Context, namespace, name string) (*Pod, error)
	// PatchPod applies a JSON merge patch.
	PatchPod(ctx context.Context, namespace, name string, mergePatch []byte) error
}

// APIError is an error status returned by the API server.
type APIError struct {
	Code    int
	Reason  string
	Message string
}

func (e *APIError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.Code)
	}
	if e.Reason != "" {
		return fmt.Sprintf("%s (%d %s)", msg, e.Code, e.Reason)
	}
	return fmt.Sprintf("%s (%d)", msg, e.Code)
}

// credentialsError is a local problem with the credentials (a missing
// token file): retrying the request cannot help.
type credentialsError struct{ error }

func (e *credentialsError) Unwrap() error { return e.error }

// isNotFound reports whether err is a 404 from the API server.
func isNotFound(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Code == http.StatusNotFound
}

// kubeconfig is the subset of the kubeconfig format the plugin reads:
// server, CA, TLS server name, proxy, and a token, tokenFile, client
// certificate or basic credentials. Exec plugins and auth providers are
// refused with a clear message (installers write a tokenFile).
type kubeconfig struct {
	CurrentContext string `json:"current-context"`
	Clusters       []struct {
		Name    string `json:"name"`
		Cluster struct {
			Server                   string `json:"server"`
			CertificateAuthority     string `json:"certificate-authority"`
			CertificateAuthorityData []byte `json:"certificate-authority-data"`
			InsecureSkipTLSVerify    bool   `json:"insecure-skip-tls-verify"`
			TLSServerName            string `json:"tls-server-name"`
			ProxyURL                 string `json:"proxy-url"`
		} `json:"cluster"`
	} `json:"clusters"`
	Contexts []struct {
		Name    string `json:"name"`
		Context struct {
			Cluster string `json:"cluster"`
			User    string `json:"user"`
		} `json:"context"`
	} `json:"contexts"`
	Users []struct {
		Name string `json:"name"`
		User struct {
			Token                 string          `json:"token"`
			TokenFile             string          `json:"tokenFile"`
			ClientCertificate     string          `json:"client-certificate"`
			ClientCertificateData []byte          `json:"client-certificate-data"`
			ClientKey             string          `json:"client-key"`
			ClientKeyData         []byte          `json:"client-key-data"`
			Username              string          `json:"username"`
			Password              string          `json:"password"`
			As                    string          `json:"as"`
			AsGroups              []string        `json:"as-groups"`
			AsUID                 string          `json:"as-uid"`
			Exec                  json.RawMessage `json:"exec"`
			AuthProvider          json.RawMessage `json:"auth-provider"`
		} `json:"user"`
	} `json:"users"`
}

// restPods talks to the API server over HTTPS with the credentials of a
// kubeconfig.
type restPods struct {
	server    *url.URL
	client    *http.Client
	token     string
	tokenFile string
	basicUser string
	basicPass string
	// Impersonation from the kubeconfig (as, as-groups, as-uid).
	asUser   string
	asGroups []string
	asUID    string
}

// loadKubeconfig builds the REST client from a kubeconfig file. Relative
// file references are relative to the file's directory, as in kubectl.
// The tokenFile is read on every request, so a token rotated on disk is
// picked up.
func loadKubeconfig(path string, timeout time.Duration) (*restPods, error) {
	kc, err := readKubeconfig(path)
	if err != nil {
		return nil, err
	}
	clusterName, userName, err := kc.currentContext()
	if err != nil {
		return nil, err
	}
	rel := func(p string) string {
		if p == "" || filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(filepath.Dir(path), p)
	}
	r := &restPods{}
	tlsConf := &tls.Config{MinVersion: tls.VersionTLS12}
	proxy, err := r.useCluster(kc, clusterName, tlsConf, rel)
	if err != nil {
		return nil, err
	}
	if err := r.useUser(kc, userName, tlsConf, rel); err != nil {
		return nil, err
	}
	dialer := &net.Dialer{Timeout: min(timeout, 10*time.Second), KeepAlive: 30 * time.Second}
	r.client = &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			Proxy:               proxy,
			DialContext:         dialer.DialContext,
			TLSClientConfig:     tlsConf,
			TLSHandshakeTimeout: min(timeout, 10*time.Second),
			ForceAttemptHTTP2:   true,
		},
	}
	return r, nil
}

// readKubeconfig reads and decodes a kubeconfig file (YAML or JSON).
func readKubeconfig(path string) (*kubeconfig, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	js, err := yaml.YAMLToJSON(raw)
	if err != nil {
		return nil, fmt.Errorf("not YAML: %w", err)
	}
	var kc kubeconfig
	if err := json.Unmarshal(js, &kc); err != nil {
		return nil, fmt.Errorf("not a kubeconfig: %w", err)
	}
	return &kc, nil
}

// currentContext returns the cluster and user of the current context (of
// the only context when none is current).
func (kc *kubeconfig) currentContext() (cluster, user string, err error) {
	ctxName := kc.CurrentContext
	if ctxName == "" && len(kc.Contexts) == 1 {
		ctxName = kc.Contexts[0].Name
	}
	if ctxName == "" {
		return "", "", errors.New("no current-context")
	}
	found := false
	for _, c := range kc.Contexts {
		if c.Name == ctxName {
			cluster, user, found = c.Context.Cluster, c.Context.User, true
		}
	}
	if !found {
		return "", "", fmt.Errorf("context %q not found", ctxName)
	}
	return cluster, user, nil
}

// useCluster takes the server, the certificate authority and the TLS
// settings of the named cluster, and returns its proxy (nil for none).
func (r *restPods) useCluster(kc *kubeconfig, clusterName string, tlsConf *tls.Config, rel func(string) string) (func(*http.Request) (*url.URL, error), error) {
	var proxy func(*http.Request) (*url.URL, error)
	found := false
	var err error
	for _, c := range kc.Clusters {
		if c.Name != clusterName {
			continue
		}
		found = true
		cl := c.Cluster
		if cl.Server == "" {
			return nil, fmt.Errorf("cluster %q has no server", clusterName)
		}
		if r.server, err = url.Parse(cl.Server); err != nil || (r.server.Scheme != "https" && r.server.Scheme != "http") || r.server.Host == "" {
			return nil, fmt.Errorf("cluster %q: server %q is not an http(s) URL", clusterName, cl.Server)
		}
		ca := cl.CertificateAuthorityData
		if cl.CertificateAuthority != "" {
			if ca, err = os.ReadFile(rel(cl.CertificateAuthority)); err != nil {
				return nil, fmt.Errorf("cluster %q: certificate-authority: %w", clusterName, err)
			}
		}
		if len(ca) > 0 {
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(ca) {
				return nil, fmt.Errorf("cluster %q: no PEM certificate in the certificate authority", clusterName)
			}
			tlsConf.RootCAs = pool
		}
		tlsConf.InsecureSkipVerify = cl.InsecureSkipTLSVerify
		tlsConf.ServerName = cl.TLSServerName
		if cl.ProxyURL != "" {
			u, err := url.Parse(cl.ProxyURL)
			if err != nil {
				return nil, fmt.Errorf("cluster %q: proxy-url: %w", clusterName, err)
			}
			proxy = http.ProxyURL(u)
		}
	}
	if !found {
		return nil, fmt.Errorf("cluster %q not found", clusterName)
	}
	return proxy, nil
}

// useUser takes the credentials of the named user: token or tokenFile,
// basic auth, impersonation, client certificate.
func (r *restPods) useUser(kc *kubeconfig, userName string, tlsConf *tls.Config, rel func(string) string) error {
	found := false
	var err error
	for _, u := range kc.Users {
		if u.Name != userName {
			continue
		}
		found = true
		us := u.User
		if len(us.Exec) > 0 && string(us.Exec) != "null" || len(us.AuthProvider) > 0 && string(us.AuthProvider) != "null" {
			return fmt.Errorf("user %q: exec and auth-provider credentials are not supported by consul-cni; use token, tokenFile or a client certificate", userName)
		}
		r.token, r.tokenFile = us.Token, rel(us.TokenFile)
		r.basicUser, r.basicPass = us.Username, us.Password
		r.asUser, r.asGroups, r.asUID = us.As, us.AsGroups, us.AsUID
		cert, key := us.ClientCertificateData, us.ClientKeyData
		if us.ClientCertificate != "" {
			if cert, err = os.ReadFile(rel(us.ClientCertificate)); err != nil {
				return fmt.Errorf("user %q: client-certificate: %w", userName, err)
			}
		}
		if us.ClientKey != "" {
			if key, err = os.ReadFile(rel(us.ClientKey)); err != nil {
				return fmt.Errorf("user %q: client-key: %w", userName, err)
			}
		}
		if len(cert) > 0 || len(key) > 0 {
			pair, err := tls.X509KeyPair(cert, key)
			if err != nil {
				return fmt.Errorf("user %q: client certificate: %w", userName, err)
			}
			tlsConf.Certificates = []tls.Certificate{pair}
		}
		if r.tokenFile != "" {
			if _, err := r.bearer(); err != nil {
				return fmt.Errorf("user %q: %w", userName, err)
			}
		}
	}
	if !found && userName != "" {
		return fmt.Errorf("user %q not found", userName)
	}
	return nil
}

// bearer returns the token to send: the tokenFile's current content when
// one is configured, else the inline token.
func (r *restPods) bearer() (string, error) {
	if r.tokenFile != "" {
		b, err := os.ReadFile(r.tokenFile)
		if err != nil {
			return "", &credentialsError{fmt.Errorf("tokenFile: %w", err)}
		}
		if t := strings.TrimSpace(string(b)); t != "" {
			return t, nil
		}
		return "", &credentialsError{fmt.Errorf("tokenFile %s is empty", r.tokenFile)}
	}
	return r.token, nil
}

func (r *restPods) podURL(ns, name string) string {
	u := *r.server
	u.Path = strings.TrimSuffix(u.Path, "/") + "/api/v1/namespaces/" + url.PathEscape(ns) + "/pods/" + url.PathEscape(name)
	return u.String()
}

func (r *restPods) do(ctx context.Context, method, u, contentType string, body []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "consul-cni")
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	tok, err := r.bearer()
	if err != nil {
		return nil, err
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	} else if r.basicUser != "" {
		req.SetBasicAuth(r.basicUser, r.basicPass)
	}
	if r.asUser != "" {
		req.Header.Set("Impersonate-User", r.asUser)
		for _, g := range r.asGroups {
			req.Header.Add("Impersonate-Group", g)
		}
		if r.asUID != "" {
			req.Header.Set("Impersonate-Uid", r.asUID)
		}
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return data, nil
	}
	ae := &APIError{Code: resp.StatusCode}
	var st struct {
		Kind, Reason, Message string
		Code                  int
	}
	if json.Unmarshal(data, &st) == nil && st.Kind == "Status" {
		ae.Reason, ae.Message = st.Reason, st.Message
	} else {
		ae.Message = strings.TrimSpace(string(data))
		if len(ae.Message) > 200 {
			ae.Message = ae.Message[:200] + "..."
		}
	}
	return nil, ae
}

type podJSON struct {
	Metadata struct {
		Namespace   string            `json:"namespace"`
		Name        string            `json:"name"`
		UID         string            `json:"uid"`
		Labels      map[string]string `json:"labels"`
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
}

// GetPod implements PodClient.
func (r *restPods) GetPod(ctx context.Context, ns, name string) (*Pod, error) {
	data, err := r.do(ctx, http.MethodGet, r.podURL(ns, name), "", nil)
	if err != nil {
		return nil, err
	}
	var p podJSON
	if err := json.Unmarshal(data, &p); err != nil {
		return nil, fmt.Errorf("decoding the pod: %w", err)
	}
	m := p.Metadata
	return &Pod{Namespace: m.Namespace, Name: m.Name, UID: m.UID, Labels: m.Labels, Annotations: m.Annotations}, nil
}

// PatchPod implements PodClient.
func (r *restPods) PatchPod(ctx context.Context, ns, name string, patch []byte) error {
	_, err := r.do(ctx, http.MethodPatch, r.podURL(ns, name)+"?fieldManager=consul-cni", "application/merge-patch+json", patch)
	return err
}
