package simnode

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
)

// kubeletAPI is the part of kubelet's API the apiserver proxies that the
// simulated node serves: container logs (`kubectl logs`). It listens on the
// node's IP, which is on the host's loopback device, on a free port the
// Node reports as its kubelet endpoint; it accepts only clients with a
// certificate of the cluster's CA (the apiserver's kubelet client
// certificate). Its own serving certificate is self-signed: the apiserver
// is not given a kubelet CA, as with kubelet's default self-signed one.
type kubeletAPI struct {
	n   *Node
	l   net.Listener
	srv *http.Server
}

func startKubeletAPI(n *Node, nodeIP netip.Addr, rc *rest.Config) (*kubeletAPI, error) { // listens in the node's namespace
	ca := rc.TLSClientConfig.CAData
	if len(ca) == 0 && rc.TLSClientConfig.CAFile != "" {
		b, err := os.ReadFile(rc.TLSClientConfig.CAFile)
		if err != nil {
			return nil, err
		}
		ca = b
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, errors.New("the REST config has no CA to verify the apiserver's kubelet client certificate with")
	}
	cert, err := selfSigned(nodeIP)
	if err != nil {
		return nil, err
	}
	l, err := n.net.listen(netip.AddrPortFrom(nodeIP, 0).String())
	if err != nil {
		return nil, err
	}
	k := &kubeletAPI{n: n, l: l}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /containerLogs/{namespace}/{pod}/{container}", k.containerLogs)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	k.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, TLSConfig: &tls.Config{
		Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12,
	}}
	go func() { _ = k.srv.ServeTLS(l, "", "") }()
	return k, nil
}

// port is the kubelet endpoint port the Node reports.
func (k *kubeletAPI) port() int32 { return int32(k.l.Addr().(*net.TCPAddr).Port) }

func (k *kubeletAPI) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = k.srv.Shutdown(ctx)
}

func selfSigned(ip netip.Addr) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now().Add(-time.Hour)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(now.UnixNano()),
		Subject:      pkix.Name{CommonName: "simnode@" + ip.String()},
		NotBefore:    now,
		NotAfter:     now.Add(10 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{ip.AsSlice()},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// logQuery is what containerLogs supports of kubelet's parameters.
type logQuery struct {
	previous, follow bool
	tailLines        int64 // -1: all
	limitBytes       int64 // 0: no limit
}

func parseLogQuery(r *http.Request) (logQuery, error) {
	q := logQuery{tailLines: -1}
	v := r.URL.Query()
	for _, k := range []string{"sinceSeconds", "sinceTime", "timestamps", "stream"} {
		if s := v.Get(k); s != "" && s != "false" && !(k == "stream" && s == "All") {
			return q, fmt.Errorf("%s=%s: not supported by the simulated node (its logs carry no timestamps and mix both streams)", k, s)
		}
	}
	var err error
	if s := v.Get("previous"); s != "" {
		if q.previous, err = strconv.ParseBool(s); err != nil {
			return q, fmt.Errorf("previous=%q: %v", s, err)
		}
	}
	if s := v.Get("follow"); s != "" {
		if q.follow, err = strconv.ParseBool(s); err != nil {
			return q, fmt.Errorf("follow=%q: %v", s, err)
		}
	}
	if s := v.Get("tailLines"); s != "" {
		if q.tailLines, err = strconv.ParseInt(s, 10, 64); err != nil || q.tailLines < 0 {
			return q, fmt.Errorf("tailLines=%q: want a number >= 0", s)
		}
	}
	if s := v.Get("limitBytes"); s != "" {
		if q.limitBytes, err = strconv.ParseInt(s, 10, 64); err != nil || q.limitBytes < 1 {
			return q, fmt.Errorf("limitBytes=%q: want a number >= 1", s)
		}
	}
	return q, nil
}

// containerLogs serves one container instance's output: the current (or
// last) instance, or with previous=true the one before it.
func (k *kubeletAPI) containerLogs(w http.ResponseWriter, r *http.Request) {
	ns, pod, ctr := r.PathValue("namespace"), r.PathValue("pod"), r.PathValue("container")
	q, err := parseLogQuery(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f, err := k.n.logFile(ns, pod, ctr, q.previous)
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	b, err := os.ReadFile(f.Path)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	offset := int64(len(b))
	if q.tailLines >= 0 {
		b = lastLines(b, q.tailLines)
	}
	out := io.Writer(w)
	if q.limitBytes > 0 {
		out = &limitWriter{w: w, n: q.limitBytes}
	}
	w.Header().Set("Content-Type", "text/plain")
	if _, err := out.Write(b); err != nil || !q.follow {
		return
	}
	k.follow(r.Context(), w, out, f, offset)
}

// follow streams what is appended to f until the client goes away, the
// container is restarted (a newer instance exists) or the pod is gone from
// the node.
func (k *kubeletAPI) follow(ctx context.Context, w http.ResponseWriter, out io.Writer, f LogFile, offset int64) {
	flusher, _ := w.(http.Flusher)
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		if flusher != nil {
			flusher.Flush()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		file, err := os.Open(f.Path)
		if err != nil {
			return
		}
		n, _ := file.Seek(offset, io.SeekStart)
		if n == offset {
			var copied int64
			copied, err = io.Copy(out, file)
			offset += copied
		}
		file.Close()
		if err != nil {
			return
		}
		if cur, cerr := k.n.logFile(f.Namespace, f.Pod, f.Container, false); cerr != nil || cur.Path != f.Path || !k.n.hasPod(f.UID) {
			return
		}
	}
}

func lastLines(b []byte, n int64) []byte {
	if n == 0 {
		return nil
	}
	end := len(b)
	if end > 0 && b[end-1] == '\n' {
		end--
	}
	for i := end - 1; i >= 0; i-- {
		if b[i] == '\n' {
			n--
			if n == 0 {
				return b[i+1:]
			}
		}
	}
	return b
}

type limitWriter struct {
	w io.Writer
	n int64
}

var errLimit = errors.New("limitBytes reached")

func (l *limitWriter) Write(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, errLimit
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.w.Write(p)
	l.n -= int64(n)
	if err == nil && l.n <= 0 {
		err = errLimit
	}
	return n, err
}

// logFile finds a container's log: of the pod of that name running on the
// node now, else of the last one of that name that ran here.
func (n *Node) logFile(ns, pod, ctr string, previous bool) (LogFile, error) {
	files, err := n.LogFiles()
	if err != nil {
		return LogFile{}, err
	}
	live := n.podUID(ns, pod)
	var mine []LogFile
	for _, f := range files {
		if f.Namespace == ns && f.Pod == pod && f.Container == ctr && (live == "" || f.UID == live) {
			mine = append(mine, f)
		}
	}
	if live == "" && len(mine) > 0 {
		// The pod left the node: its last run, by file age.
		sort.SliceStable(mine, func(i, j int) bool { return modTime(mine[i].Path).Before(modTime(mine[j].Path)) })
		last := mine[len(mine)-1].UID
		kept := mine[:0]
		for _, f := range mine {
			if f.UID == last {
				kept = append(kept, f)
			}
		}
		mine = kept
	}
	want := len(mine) - 1
	if previous {
		want--
	}
	if want < 0 {
		what := "container"
		if previous {
			what = "previous terminated container"
		}
		return LogFile{}, fmt.Errorf("%s %q in pod %s/%s not found on node %s", what, ctr, ns, pod, n.cfg.Name)
	}
	return mine[want], nil
}

func modTime(path string) time.Time {
	st, err := os.Stat(path)
	if err != nil {
		return time.Time{}
	}
	return st.ModTime()
}

// podUID is the UID of the pod ns/name running on the node ("" if none).
func (n *Node) podUID(ns, name string) types.UID {
	n.mu.Lock()
	defer n.mu.Unlock()
	for uid, w := range n.workers {
		w.mu.Lock()
		p := w.latest
		w.mu.Unlock()
		if p.Namespace == ns && p.Name == name {
			return uid
		}
	}
	return ""
}

func (n *Node) hasPod(uid types.UID) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	_, ok := n.workers[uid]
	return ok
}
