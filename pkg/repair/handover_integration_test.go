//go:build integration

package repair_test

import (
	"bytes"
	"context"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
)

// apiPath is one replica's own path to the apiserver: a TLS reverse proxy
// that can refuse its Lease requests (its renewals fail, nothing else does)
// and hold its actions (evictions, deletes) for a while before sending
// them on, as a congested link would; a held request whose client gives up
// is never sent. It notes when each action was sent to the apiserver.
type apiPath struct {
	srv        *httptest.Server
	leasesDown atomic.Bool
	hold       atomic.Int64 // nanoseconds
	mu         sync.Mutex
	arrived    []time.Time
	sent       []time.Time
}

func isAction(r *http.Request) bool {
	return r.Method == http.MethodDelete && strings.Contains(r.URL.Path, "/pods/") ||
		r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/eviction")
}

func newAPIPath(t *testing.T, upstream *rest.Config) *apiPath {
	t.Helper()
	u, err := url.Parse(upstream.Host)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := rest.TransportFor(&rest.Config{Host: upstream.Host, TLSClientConfig: upstream.TLSClientConfig})
	if err != nil {
		t.Fatal(err)
	}
	p := &apiPath{}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.Transport, rp.FlushInterval = tr, -1
	p.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p.leasesDown.Load() && strings.Contains(r.URL.Path, "/leases") {
			http.Error(w, "lease path down", http.StatusGatewayTimeout)
			return
		}
		if isAction(r) {
			// Read the body first: only then does the server notice
			// a client that gives up (its background read).
			body, err := io.ReadAll(r.Body)
			if err != nil {
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			p.mu.Lock()
			p.arrived = append(p.arrived, time.Now())
			p.mu.Unlock()
			select {
			case <-time.After(time.Duration(p.hold.Load())):
			case <-r.Context().Done():
				return // the client gave up: never sent
			}
			p.mu.Lock()
			p.sent = append(p.sent, time.Now())
			p.mu.Unlock()
		}
		rp.ServeHTTP(w, r)
	}))
	p.srv.StartTLS()
	t.Cleanup(p.srv.Close)
	return p
}

func (p *apiPath) counts() (arrived int, sent []time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.arrived), append([]time.Time(nil), p.sent...)
}

// kubeconfig writes cfg's credentials with the path as the server.
func (p *apiPath) kubeconfig(t *testing.T, cfg *rest.Config) string {
	t.Helper()
	c := rest.CopyConfig(cfg)
	c.Host = p.srv.URL
	c.TLSClientConfig = rest.TLSClientConfig{CAData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.srv.Certificate().Raw})}
	path := filepath.Join(t.TempDir(), "via-path.kubeconfig")
	if err := cluster.WriteKubeconfig(path, c, "consul-cni-repair"); err != nil {
		t.Fatal(err)
	}
	return path
}

// A leader whose renewals fail while one of its actions is still on its
// way (held by its congested path to the API) never has that action reach
// the apiserver after another replica started leading: the action is
// fenced by the leader's last renewal and given up, the Lease expires (it
// is not released under the action), and the standby, once leading,
// repairs the pod itself.
func TestIntegrationRenewalFailureNoActionAfterTheNewLeaderStarts(t *testing.T) {
	c := cluster.Shared(t)
	ns := c.Namespace(t)
	node := createNode(t, c, true)
	replicaSet(t, c, ns, "web", node, 2)
	cfg := controllerConfig(t, c, ns, judge.ActionEvict)
	path := newAPIPath(t, cfg)
	a := startReplica(t, path.kubeconfig(t, cfg), ns, "replica-a")
	leaderOf(t, a)
	b := startReplica(t, replicaKubeconfig(t, c, ns), ns, "replica-b")
	if leader, _ := leaderOf(t, a, b); leader != a {
		t.Fatal("the first replica lost the lease on its own")
	}
	// Not vacuous: the leader's actions go through its path.
	pods := podsOf(t, c.Client, ns, "web")
	first := markBroken(t, c.Client, &pods[0])
	replaced(t, c.Client, ns, "web", first.UID, len(pods))
	if _, sent := path.counts(); len(sent) != 1 {
		t.Fatalf("%d actions sent through the leader's path, want 1", len(sent))
	}

	// The next action is held longer than the lease lasts without renewal.
	path.hold.Store(int64(leaseDuration + 2*time.Second))
	pods = podsOf(t, c.Client, ns, "web")
	second := markBroken(t, c.Client, &pods[0])
	poll.Eventually(t, waitTimeout, "the leader's second action on its way", func() (bool, error) {
		n, _ := path.counts()
		return n == 2, nil
	})
	down := time.Now()
	path.leasesDown.Store(true)
	waitExit(t, a, down)
	poll.Eventually(t, waitTimeout, "the standby to lead", func() (bool, error) { return b.leading(), nil })
	l, err := c.Client.CoordinationV1().Leases(ns).Get(context.Background(), repair.Component, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if l.Spec.HolderIdentity == nil || l.Spec.AcquireTime == nil {
		t.Fatalf("lease %+v", l.Spec)
	}
	took := l.Spec.AcquireTime.Time
	t.Logf("renewals refused at %s, standby %s acquired the lease at %s (+%s)", down.Format(time.StampMilli),
		*l.Spec.HolderIdentity, took.Format(time.StampMilli), took.Sub(down).Round(time.Millisecond))
	replaced(t, c.Client, ns, "web", second.UID, len(pods))
	// Wait out the hold, so a late send would be seen.
	time.Sleep(time.Until(down.Add(leaseDuration + 3*time.Second)))
	_, sent := path.counts()
	for _, s := range sent[1:] {
		if !s.After(took) {
			continue
		}
		t.Errorf("the old leader's action reached the apiserver at %s, %s after the new leader acquired the lease",
			s.Format(time.StampMilli), s.Sub(took).Round(time.Millisecond))
	}
}
