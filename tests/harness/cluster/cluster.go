// Package cluster runs a real Kubernetes control plane on loopback for
// integration tests and the demo: etcd (Debian's etcd-server) and
// kube-apiserver, kube-controller-manager and kube-scheduler v1.37.2 built by
// tests/kube. It generates a CA and serving certificate, static tokens for
// the admin and the control-plane components, and service-account signing
// keys; the apiserver runs with RBAC and the ServiceAccount admission plugin.
//
// Tests share one control plane per test binary (Shared, with Main as the
// body of TestMain) and isolate themselves by namespace (Namespace).
// Commands start their own with Start. Every process runs in its own process
// group with a parent-death signal (tests/harness/proc), so nothing outlives the test
// process, and Stop removes the data directory.
package cluster

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/proc"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

// ServiceCIDR is the ClusterIP range. Nothing routes it (there is no
// kube-proxy): Services exist as API objects only.
const ServiceCIDR = "198.19.0.0/16"

// KubernetesServiceIP is the ClusterIP of the "kubernetes" Service, the
// first address of ServiceCIDR, which the apiserver's certificate names.
// Nodes (real and simulated) serve the apiserver there, port 443, in their
// own network namespaces, as kube-proxy makes it reachable, so in-cluster
// clients that take KUBERNETES_SERVICE_HOST work unchanged.
var KubernetesServiceIP = netip.MustParsePrefix(ServiceCIDR).Masked().Addr().Next()

// KubeletAddressTypes is the apiserver's --kubelet-preferred-address-types:
// only the InternalIP a node reports, so a node name is never resolved.
const KubeletAddressTypes = "InternalIP"

// Issuer is the service-account token issuer (and default audience).
const Issuer = "https://kubernetes.default.svc.cluster.local"

// Options configure Start. The zero value is usable.
type Options struct {
	// KubeBinDir holds kube-apiserver, kube-controller-manager and
	// kube-scheduler. Default: $CCR_KUBE_BIN_DIR, else <repo>/.cache/kube/bin.
	KubeBinDir string
	// Etcd is the etcd executable. Default: "etcd" on PATH.
	Etcd string
	// Dir is the working directory (certificates, data, logs). Default: a
	// fresh temporary directory, removed by Stop.
	Dir string
	// Keep leaves Dir in place after Stop (also when $CCR_KEEP_CLUSTER=1).
	Keep bool
	// Verbosity is the klog level of the control-plane components.
	Verbosity int
	// StartTimeout bounds the wait for the control plane to be ready.
	// Default 3 minutes (the machines are shared and slow).
	StartTimeout time.Duration
}

// Cluster is a running control plane.
type Cluster struct {
	// Config and Client are the admin's (group system:masters).
	Config *rest.Config
	Client kubernetes.Interface
	// Kubeconfig is the path of a kubeconfig file for the admin.
	Kubeconfig string
	// Server is the apiserver URL, CAFile the CA certificate that signed
	// its serving certificate, CAData the same in PEM.
	Server string
	CAFile string
	CAData []byte
	// Dir is the working directory; component logs are Dir/<name>.log.
	Dir string

	keep     bool
	procs    []*component
	stopOnce sync.Once

	// apiserver is how kube-apiserver was started (StartAPIServer again);
	// its lock guards replacing the process of its component.
	apiserver struct {
		sync.Mutex
		bin  string
		args []string
	}
}

type component struct {
	name string
	log  string
	p    *proc.Process
}

// Start runs etcd and the control plane and waits until the apiserver is
// ready and the controllers serve the "default" namespace.
func Start(ctx context.Context, opts Options) (_ *Cluster, err error) {
	if err := opts.complete(); err != nil {
		return nil, err
	}
	c := &Cluster{keep: opts.Keep || os.Getenv("CCR_KEEP_CLUSTER") == "1"}
	if c.Dir, err = clusterDir(opts.Dir); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()

	pk, err := newPKI(c.Dir, net.IP(KubernetesServiceIP.AsSlice()))
	if err != nil {
		return nil, fmt.Errorf("certificates: %w", err)
	}
	c.CAFile, c.CAData = pk.CAFile, pk.CAPEM
	tok, err := writeTokens(c.Dir)
	if err != nil {
		return nil, err
	}
	etcdURL, err := c.startEtcd(ctx, opts.Etcd)
	if err != nil {
		return nil, err
	}
	if err := c.startAPIServer(ctx, opts, pk, tok, etcdURL); err != nil {
		return nil, err
	}
	if err := c.writeAdminConfig(tok.admin); err != nil {
		return nil, err
	}
	if err := c.startControllers(opts, pk, tok); err != nil {
		return nil, err
	}
	if err := waitHTTP(ctx, c.procs[len(c.procs)-3], c.Server+"/readyz", tok.admin, pk.CAPEM); err != nil {
		return nil, err
	}
	// Pods can be created once the service-account controller has made the
	// namespace's "default" ServiceAccount.
	if err := c.WaitForServiceAccount(ctx, "default", "default"); err != nil {
		return nil, err
	}
	return c, nil
}

// KubeBinDir is where `make kube-bins` and `make kubectl` put the control
// plane and kubectl: $CCR_KUBE_BIN_DIR, else <repo>/.cache/kube/bin.
func KubeBinDir() string {
	if d := os.Getenv("CCR_KUBE_BIN_DIR"); d != "" {
		return d
	}
	return filepath.Join(testbin.RepoRoot(), ".cache", "kube", "bin")
}

// Kubectl is the kubectl tests run: $CCR_KUBECTL, else KubeBinDir's.
func Kubectl() (string, error) {
	p := os.Getenv("CCR_KUBECTL")
	if p == "" {
		p = filepath.Join(KubeBinDir(), "kubectl")
	}
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("kubectl not found at %s: build it with `make kubectl`", p)
	}
	return p, nil
}

// complete fills in the defaults and checks that the binaries exist.
func (opts *Options) complete() error {
	if opts.KubeBinDir == "" {
		opts.KubeBinDir = KubeBinDir()
	}
	for _, b := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
		if _, err := os.Stat(filepath.Join(opts.KubeBinDir, b)); err != nil {
			return fmt.Errorf("%s not found in %s: build the control plane with `make kube-bins` (a cold build takes about 15 minutes)", b, opts.KubeBinDir)
		}
	}
	if opts.Etcd == "" {
		p, err := exec.LookPath("etcd")
		if err != nil {
			return fmt.Errorf("etcd not found on PATH: install Debian's etcd-server (`make deps`)")
		}
		opts.Etcd = p
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 3 * time.Minute
	}
	return nil
}

// clusterDir creates dir, or a fresh directory owned by this process when
// dir is empty.
func clusterDir(dir string) (string, error) {
	if dir != "" {
		return dir, os.MkdirAll(dir, 0o700)
	}
	// etcd fsyncs; a tmpfs keeps it fast on shared disks.
	base := os.TempDir()
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		base = "/dev/shm"
	}
	// Directories of control planes whose test process was killed.
	proc.RemoveStale(filepath.Join(base, "ccr-cluster-*"))
	dir, err := os.MkdirTemp(base, "ccr-cluster-")
	if err != nil {
		return "", err
	}
	return dir, proc.MarkOwned(dir)
}

// tokens are the bearer tokens of the admin and the control-plane components.
type tokens struct {
	admin, kcm, sched string
	file              string
}

// writeTokens makes the tokens and the apiserver's token file in dir.
func writeTokens(dir string) (tokens, error) {
	t := tokens{admin: randomToken(), kcm: randomToken(), sched: randomToken(), file: filepath.Join(dir, "tokens.csv")}
	csv := fmt.Sprintf("%s,admin,uid-admin,\"system:masters\"\n%s,system:kube-controller-manager,uid-kcm\n%s,system:kube-scheduler,uid-scheduler\n",
		t.admin, t.kcm, t.sched)
	return t, os.WriteFile(t.file, []byte(csv), 0o600)
}

// startAPIServer starts kube-apiserver and waits until it is live.
func (c *Cluster) startAPIServer(ctx context.Context, opts Options, pk *pki, tok tokens, etcdURL string) error {
	// The apiserver's port is picked free and may be taken by another
	// process before the apiserver binds it: retry with another one.
	for attempt := 1; ; attempt++ {
		port, err := testnet.FreePort()
		if err != nil {
			return err
		}
		c.Server = "https://127.0.0.1:" + strconv.Itoa(port)
		args := []string{
			"--etcd-servers=" + etcdURL,
			"--bind-address=127.0.0.1",
			"--advertise-address=127.0.0.1",
			"--endpoint-reconciler-type=none",
			"--secure-port=" + strconv.Itoa(port),
			"--tls-cert-file=" + pk.ServingCert,
			"--tls-private-key-file=" + pk.ServingKey,
			"--client-ca-file=" + pk.CAFile,
			"--token-auth-file=" + tok.file,
			"--authorization-mode=RBAC",
			"--service-account-key-file=" + pk.SAPublic,
			"--service-account-signing-key-file=" + pk.SAPrivate,
			"--service-account-issuer=" + Issuer,
			"--service-cluster-ip-range=" + ServiceCIDR,
			"--allow-privileged=true",
			// Kubelets (simulated nodes) by the InternalIP they report,
			// never by resolving a node name: nothing leaves the machine.
			"--kubelet-preferred-address-types=" + KubeletAddressTypes,
			"--kubelet-client-certificate=" + pk.KubeletClientCert,
			"--kubelet-client-key=" + pk.KubeletClientKey,
			"--profiling=false",
			"--enable-priority-and-fairness=false",
			"--v=" + strconv.Itoa(opts.Verbosity),
		}
		c.apiserver.bin, c.apiserver.args = filepath.Join(opts.KubeBinDir, "kube-apiserver"), args
		comp, err := c.start("kube-apiserver", c.apiserver.bin, args)
		if err != nil {
			return err
		}
		err = waitHTTP(ctx, comp, c.Server+"/livez", tok.admin, pk.CAPEM)
		if err == nil {
			return nil
		}
		if attempt == 3 || ctx.Err() != nil || !strings.Contains(c.tail(comp), "address already in use") {
			return err
		}
		comp.p.Stop(5 * time.Second)
		c.procs = c.procs[:len(c.procs)-1]
	}
}

// writeAdminConfig sets the admin's Config, Client and Kubeconfig.
func (c *Cluster) writeAdminConfig(adminToken string) (err error) {
	c.Config = &rest.Config{
		Host:            c.Server,
		BearerToken:     adminToken,
		TLSClientConfig: rest.TLSClientConfig{CAData: c.CAData},
		QPS:             100,
		Burst:           200,
	}
	if c.Client, err = kubernetes.NewForConfig(c.Config); err != nil {
		return err
	}
	c.Kubeconfig = filepath.Join(c.Dir, "admin.kubeconfig")
	return WriteKubeconfig(c.Kubeconfig, c.Config, "admin")
}

// startControllers starts kube-controller-manager and kube-scheduler.
func (c *Cluster) startControllers(opts Options, pk *pki, tok tokens) error {
	kcmKubeconfig := filepath.Join(c.Dir, "kube-controller-manager.kubeconfig")
	schedKubeconfig := filepath.Join(c.Dir, "kube-scheduler.kubeconfig")
	if err := WriteKubeconfig(kcmKubeconfig, c.tokenConfig(tok.kcm), "system:kube-controller-manager"); err != nil {
		return err
	}
	if err := WriteKubeconfig(schedKubeconfig, c.tokenConfig(tok.sched), "system:kube-scheduler"); err != nil {
		return err
	}
	if _, err := c.start("kube-controller-manager", filepath.Join(opts.KubeBinDir, "kube-controller-manager"), []string{
		"--kubeconfig=" + kcmKubeconfig,
		"--leader-elect=false",
		"--secure-port=0",
		"--use-service-account-credentials=true",
		"--service-account-private-key-file=" + pk.SAPrivate,
		"--root-ca-file=" + pk.CAFile,
		"--profiling=false",
		"--v=" + strconv.Itoa(opts.Verbosity),
	}); err != nil {
		return err
	}
	_, err := c.start("kube-scheduler", filepath.Join(opts.KubeBinDir, "kube-scheduler"), []string{
		"--kubeconfig=" + schedKubeconfig,
		"--leader-elect=false",
		"--secure-port=0",
		"--profiling=false",
		"--v=" + strconv.Itoa(opts.Verbosity),
	})
	return err
}

func (c *Cluster) tokenConfig(token string) *rest.Config {
	return &rest.Config{Host: c.Server, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: c.CAData}}
}

func (c *Cluster) startEtcd(ctx context.Context, bin string) (string, error) {
	for attempt := 1; ; attempt++ {
		client, err := testnet.FreePort()
		if err != nil {
			return "", err
		}
		peer, err := testnet.FreePort()
		if err != nil {
			return "", err
		}
		cu := fmt.Sprintf("http://127.0.0.1:%d", client)
		pu := fmt.Sprintf("http://127.0.0.1:%d", peer)
		data := filepath.Join(c.Dir, fmt.Sprintf("etcd-%d", attempt))
		comp, err := c.start("etcd", bin, []string{
			"--name=default",
			"--data-dir=" + data,
			"--listen-client-urls=" + cu,
			"--advertise-client-urls=" + cu,
			"--listen-peer-urls=" + pu,
			"--initial-advertise-peer-urls=" + pu,
			"--initial-cluster=default=" + pu,
			"--initial-cluster-state=new",
			"--logger=zap",
			"--log-outputs=stderr",
			"--quota-backend-bytes=4294967296",
		})
		if err != nil {
			return "", err
		}
		err = waitHTTP(ctx, comp, cu+"/health", "", nil)
		if err == nil {
			return cu, nil
		}
		if attempt == 3 || ctx.Err() != nil || !strings.Contains(c.tail(comp), "address already in use") {
			return "", err
		}
		comp.p.Stop(5 * time.Second)
		c.procs = c.procs[:len(c.procs)-1]
	}
}

func (c *Cluster) start(name, bin string, args []string) (*component, error) {
	logPath := filepath.Join(c.Dir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Dir = c.Dir
	p, err := proc.Start(cmd, "")
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	comp := &component{name: name, log: logPath, p: p}
	c.procs = append(c.procs, comp)
	return comp, nil
}

// waitHTTP polls url until it answers 200 (and "true" health for etcd) or the
// component exits.
func waitHTTP(ctx context.Context, comp *component, url, token string, caPEM []byte) error {
	tr := &http.Transport{}
	if caPEM != nil {
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(caPEM)
		tr.TLSClientConfig = &tls.Config{RootCAs: pool}
	}
	hc := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	defer tr.CloseIdleConnections()
	var last string
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		select {
		case <-comp.p.Done():
			return false, fmt.Errorf("%s exited (%v)", comp.name, comp.p.Err())
		default:
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := hc.Do(req)
		if err != nil {
			last = err.Error()
			return false, nil
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		last = fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(b)))
		return resp.StatusCode == http.StatusOK && !bytes.Contains(b, []byte(`"health":"false"`)), nil
	})
	if err != nil {
		return fmt.Errorf("waiting for %s at %s (last answer: %s): %w\n--- %s (last lines of %s):\n%s",
			comp.name, url, last, err, comp.name, comp.log, tailFile(comp.log, 30))
	}
	return nil
}

func (c *Cluster) tail(comp *component) string { return tailFile(comp.log, 30) }

func tailFile(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	var lines []string
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for s.Scan() {
		lines = append(lines, s.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// Exited returns a description of every component that is no longer
// running; an empty result means all are up.
func (c *Cluster) Exited() []string {
	c.apiserver.Lock()
	defer c.apiserver.Unlock()
	var out []string
	for _, comp := range c.procs {
		select {
		case <-comp.p.Done():
			out = append(out, fmt.Sprintf("%s exited (%v); log %s", comp.name, comp.p.Err(), comp.log))
		default:
		}
	}
	return out
}

// Stop stops the components in reverse order of start (SIGTERM, then
// SIGKILL after a grace period) and removes the working directory unless
// asked to keep it. It is safe to call more than once.
func (c *Cluster) Stop() {
	c.stopOnce.Do(func() {
		c.apiserver.Lock()
		defer c.apiserver.Unlock()
		for i := len(c.procs) - 1; i >= 0; i-- {
			c.procs[i].p.Stop(10 * time.Second)
		}
		if c.Dir != "" && !c.keep {
			_ = os.RemoveAll(c.Dir)
		}
	})
}

// StopAPIServer stops kube-apiserver (SIGTERM, then SIGKILL after 10 s)
// and leaves etcd and the other components running: an API outage, until
// StartAPIServer. Exited reports it meanwhile.
func (c *Cluster) StopAPIServer() {
	c.apiserver.Lock()
	defer c.apiserver.Unlock()
	if comp := c.component("kube-apiserver"); comp != nil {
		comp.p.Stop(10 * time.Second)
	}
}

// StartAPIServer starts kube-apiserver again after StopAPIServer, with the
// same flags (address, port, certificates, tokens, etcd), and waits until
// it is ready. Its log is appended to the first run's.
func (c *Cluster) StartAPIServer(ctx context.Context) error {
	c.apiserver.Lock()
	defer c.apiserver.Unlock()
	old := c.component("kube-apiserver")
	if old == nil {
		return errors.New("kube-apiserver was never started")
	}
	select {
	case <-old.p.Done():
	default:
		return errors.New("kube-apiserver is running")
	}
	f, err := os.OpenFile(old.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(c.apiserver.bin, c.apiserver.args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Dir = c.Dir
	p, err := proc.Start(cmd, "")
	f.Close()
	if err != nil {
		return fmt.Errorf("restart kube-apiserver: %w", err)
	}
	old.p = p // Stop and Exited follow the new process
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	return waitHTTP(ctx, old, c.Server+"/readyz", c.Config.BearerToken, c.CAData)
}

// APIServerFlags returns the flags kube-apiserver was started with.
func (c *Cluster) APIServerFlags() []string {
	c.apiserver.Lock()
	defer c.apiserver.Unlock()
	return append([]string(nil), c.apiserver.args...)
}

// component returns the started component of that name (nil if none).
func (c *Cluster) component(name string) *component {
	for _, comp := range c.procs {
		if comp.name == name {
			return comp
		}
	}
	return nil
}

// WaitForServiceAccount waits until the ServiceAccount exists (namespaces
// get their "default" one from kube-controller-manager).
func (c *Cluster) WaitForServiceAccount(ctx context.Context, ns, name string) error {
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().ServiceAccounts(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			return true, nil
		}
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, nil // the apiserver may still be settling; keep polling until the timeout
	})
}

// ConfigFor returns an admin-based configuration that impersonates user
// (with groups), so RBAC decides exactly as it would for that user.
func (c *Cluster) ConfigFor(user string, groups ...string) *rest.Config {
	cfg := rest.CopyConfig(c.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	return cfg
}

// ServiceAccountToken creates the ServiceAccount ns/name if it does not exist
// and returns a token for it from the TokenRequest API.
func (c *Cluster) ServiceAccountToken(ctx context.Context, ns, name string, ttl time.Duration) (string, error) {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	if _, err := c.Client.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("create service account %s/%s: %w", ns, name, err)
	}
	secs := int64(ttl / time.Second)
	tr, err := c.Client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &secs},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token for service account %s/%s: %w", ns, name, err)
	}
	return tr.Status.Token, nil
}

// ServiceAccountRESTConfig is a configuration that authenticates with a real
// service-account token (no impersonation).
func (c *Cluster) ServiceAccountRESTConfig(ctx context.Context, ns, name string) (*rest.Config, error) {
	tok, err := c.ServiceAccountToken(ctx, ns, name, time.Hour)
	if err != nil {
		return nil, err
	}
	cfg := c.tokenConfig(tok)
	cfg.QPS, cfg.Burst = 50, 100
	return cfg, nil
}

// WriteKubeconfig writes cfg (server, CA, and a bearer token or token file)
// as a kubeconfig file with a single context.
func WriteKubeconfig(path string, cfg *rest.Config, user string) error {
	ca := cfg.TLSClientConfig.CAData
	if len(ca) == 0 && cfg.TLSClientConfig.CAFile != "" {
		b, err := os.ReadFile(cfg.TLSClientConfig.CAFile)
		if err != nil {
			return err
		}
		ca = b
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["local"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: ca, TLSServerName: cfg.TLSClientConfig.ServerName}
	kc.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken, TokenFile: cfg.BearerTokenFile}
	if cfg.Impersonate.UserName != "" {
		kc.AuthInfos[user].Impersonate = cfg.Impersonate.UserName
		kc.AuthInfos[user].ImpersonateGroups = cfg.Impersonate.Groups
	}
	kc.Contexts["local"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: user}
	kc.CurrentContext = "local"
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return clientcmd.WriteToFile(*kc, path)
}

var errNotMain = errors.New("cluster.Shared needs cluster.Main as the body of TestMain, so the control plane is stopped when the tests end")

// signals the foreground users of Start may want to stop on.
var stopSignals = []os.Signal{os.Interrupt, syscall.SIGTERM}
