package plugin

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// fakeAPI records requests and answers like the API server for one pod.
type fakeAPI struct {
	mu       sync.Mutex
	requests []string // "METHOD path?query auth content-type body"
	status   int      // when set, every request fails with it
	body     string
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.requests = append(f.requests, strings.TrimSpace(r.Method+" "+r.URL.RequestURI()+" "+r.Header.Get("Authorization")+" "+r.Header.Get("Content-Type")+" "+string(b)))
	status, body := f.status, f.body
	f.mu.Unlock()
	if status != 0 {
		w.WriteHeader(status)
		io.WriteString(w, body)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"kind": "Pod", "apiVersion": "v1", "metadata": map[string]any{
		"name": "web", "namespace": "default", "uid": "u-1",
		"labels": map[string]string{"app": "web"}, "annotations": map[string]string{"a": "b"},
	}})
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

func tlsServer(t *testing.T, h http.Handler) (*httptest.Server, string) {
	srv := httptest.NewTLSServer(h)
	t.Cleanup(srv.Close)
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	return srv, string(ca)
}

func TestRESTClientGetAndPatch(t *testing.T) {
	api := &fakeAPI{}
	srv, ca := tlsServer(t, api)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "ca.crt"), ca)
	writeFile(t, filepath.Join(dir, "token"), "first\n")
	writeFile(t, filepath.Join(dir, "kc"), `apiVersion: v1
kind: Config
current-context: main
contexts:
- name: other
  context: {cluster: nowhere, user: nobody}
- name: main
  context: {cluster: c, user: u}
clusters:
- name: c
  cluster:
    server: `+srv.URL+`/prefix/
    certificate-authority: ca.crt
users:
- name: u
  user:
    tokenFile: token
`)
	c, err := loadKubeconfig(filepath.Join(dir, "kc"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	pod, err := c.GetPod(ctx, "default", "web")
	if err != nil {
		t.Fatal(err)
	}
	if pod.UID != "u-1" || pod.Name != "web" || pod.Namespace != "default" || pod.Labels["app"] != "web" || pod.Annotations["a"] != "b" {
		t.Fatalf("%+v", pod)
	}
	// The token is rotated on disk: the next request uses the new one.
	writeFile(t, filepath.Join(dir, "token"), "second")
	if err := c.PatchPod(ctx, "default", "web", statusPatch("u-1", "complete")); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"GET /prefix/api/v1/namespaces/default/pods/web Bearer first",
		`PATCH /prefix/api/v1/namespaces/default/pods/web?fieldManager=consul-cni Bearer second application/merge-patch+json {"metadata":{"annotations":{"consul.hashicorp.com/transparent-proxy-status":"complete"},"uid":"u-1"}}`,
	}
	if strings.Join(api.requests, "\n") != strings.Join(want, "\n") {
		t.Fatalf("requests\n%s\nwant\n%s", strings.Join(api.requests, "\n"), strings.Join(want, "\n"))
	}
	// A token file that disappears is a credentials problem, not retried.
	os.Remove(filepath.Join(dir, "token"))
	_, err = c.GetPod(ctx, "default", "web")
	if err == nil || retriable(err) || !strings.Contains(err.Error(), "tokenFile") {
		t.Fatalf("missing token: %v (retriable %v)", err, retriable(err))
	}
}

func TestRESTClientErrors(t *testing.T) {
	api := &fakeAPI{}
	srv, ca := tlsServer(t, api)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "kc"), `{"apiVersion":"v1","kind":"Config","current-context":"c",
"contexts":[{"name":"c","context":{"cluster":"c","user":"u"}}],
"clusters":[{"name":"c","cluster":{"server":"`+srv.URL+`","certificate-authority-data":"`+base64.StdEncoding.EncodeToString([]byte(ca))+`"}}],
"users":[{"name":"u","user":{"username":"admin","password":"pw"}}]}`)
	c, err := loadKubeconfig(filepath.Join(dir, "kc"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, tc := range []struct {
		status    int
		body      string
		want      string
		notFound  bool
		retriable bool
	}{
		{404, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"pods \"web\" not found","reason":"NotFound","code":404}`, `pods "web" not found (404 NotFound)`, true, false},
		{403, `{"kind":"Status","message":"forbidden: RBAC","reason":"Forbidden","code":403}`, "forbidden: RBAC (403 Forbidden)", false, false},
		{503, `upstream connect error`, "upstream connect error (503)", false, true},
		{429, `{"kind":"Status","message":"slow down","reason":"TooManyRequests","code":429}`, "slow down", false, true},
		{504, `{"kind":"Status","message":"timeout","reason":"Timeout","code":504}`, "timeout", false, true},
	} {
		api.status, api.body = tc.status, tc.body
		_, err := c.GetPod(ctx, "default", "web")
		if err == nil || !strings.Contains(err.Error(), tc.want) || isNotFound(err) != tc.notFound || retriable(err) != tc.retriable {
			t.Errorf("status %d: %v (notFound %v retriable %v)", tc.status, err, isNotFound(err), retriable(err))
		}
	}
	if !strings.HasPrefix(api.requests[0], "GET /api/v1/namespaces/default/pods/web Basic ") {
		t.Fatalf("basic auth not sent: %s", api.requests[0])
	}
	// Connection refused is retriable.
	srv.Close()
	_, err = c.GetPod(ctx, "default", "web")
	if err == nil || !retriable(err) {
		t.Fatalf("closed server: %v", err)
	}
}

func TestRESTClientRejectsUntrustedServer(t *testing.T) {
	srv, _ := tlsServer(t, &fakeAPI{})
	otherCA := selfSignedCA(t)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "kc"), "current-context: c\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n"+
		"clusters: [{name: c, cluster: {server: '"+srv.URL+"', certificate-authority-data: '"+base64.StdEncoding.EncodeToString([]byte(otherCA))+"'}}]\n"+
		"users: [{name: u, user: {token: t}}]\n")
	c, err := loadKubeconfig(filepath.Join(dir, "kc"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetPod(context.Background(), "default", "web"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("untrusted server accepted: %v", err)
	}
}

// selfSignedCA returns a CA certificate that signed nothing the test
// servers use.
func selfSignedCA(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "other-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

func TestLoadKubeconfigErrors(t *testing.T) {
	for _, tc := range []struct{ name, kc, want string }{
		{"not yaml", "\t:::", "not YAML"},
		{"no context", "clusters: []\n", "no current-context"},
		{"unknown context", "current-context: x\ncontexts: [{name: other, context: {cluster: c}}]\n", `context "x" not found`},
		{"unknown cluster", "current-context: x\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n", `cluster "c" not found`},
		{"bad server", "current-context: x\ncontexts: [{name: x, context: {cluster: c}}]\nclusters: [{name: c, cluster: {server: 'ftp://x'}}]\n", "not an http(s) URL"},
		{"exec user", "current-context: x\ncontexts: [{name: x, context: {cluster: c, user: u}}]\nclusters: [{name: c, cluster: {server: 'https://x'}}]\nusers: [{name: u, user: {exec: {command: aws}}}]\n", "exec and auth-provider credentials are not supported"},
		{"missing token file", "current-context: x\ncontexts: [{name: x, context: {cluster: c, user: u}}]\nclusters: [{name: c, cluster: {server: 'https://x'}}]\nusers: [{name: u, user: {tokenFile: nope}}]\n", "tokenFile"},
		{"missing ca file", "current-context: x\ncontexts: [{name: x, context: {cluster: c, user: u}}]\nclusters: [{name: c, cluster: {server: 'https://x', certificate-authority: nope.crt}}]\n", "certificate-authority"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "kc")
			writeFile(t, path, tc.kc)
			_, err := loadKubeconfig(path, time.Second)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}

func TestRetryStopsAtTheDeadline(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	calls := 0
	n, err := retry(ctx, 100, 20*time.Millisecond, func(context.Context) error {
		calls++
		return errors.New("connection refused")
	})
	if err == nil || n != calls || calls > 4 {
		t.Fatalf("n=%d calls=%d err=%v", n, calls, err)
	}
}

// TestLoadsKubeconfigWrittenByClientcmd: what the installer writes
// (client-go's clientcmd.Write: CA data, TLS server name, tokenFile) is read
// and works.
func TestLoadsKubeconfigWrittenByClientcmd(t *testing.T) {
	api := &fakeAPI{}
	srv, ca := tlsServer(t, api)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "tok"), "from-file")
	out, err := clientcmd.Write(clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{"local": {Server: srv.URL, CertificateAuthorityData: []byte(ca), TLSServerName: "example.com"}},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{"consul-cni": {TokenFile: filepath.Join(dir, "tok")}},
		Contexts:       map[string]*clientcmdapi.Context{"consul-cni": {Cluster: "local", AuthInfo: "consul-cni"}},
		CurrentContext: "consul-cni",
	})
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "kc"), string(out))
	c, err := loadKubeconfig(filepath.Join(dir, "kc"), 5*time.Second)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	// httptest's certificate is valid for example.com: the TLS server name
	// from the kubeconfig is what makes the handshake succeed.
	if _, err := c.GetPod(context.Background(), "default", "web"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(api.requests[0], "Bearer from-file") {
		t.Fatalf("request %s", api.requests[0])
	}
}
