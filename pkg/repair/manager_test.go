package repair

import (
	"context"
	"errors"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/leader"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/leader/leadertest"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The manager serves health, readiness and metrics, leads through a Lease,
// and on shutdown stops its controllers before releasing the lease.
func TestManagerLeadsServesAndReleasesOnShutdown(t *testing.T) {
	client := fake.NewClientset()
	cfg := DefaultManagerConfig()
	cfg.LeaseNamespace = "ns"
	cfg.Identity = "replica-a"
	cfg.MetricsAddr = "127.0.0.1:0"
	cfg.HealthAddr = "127.0.0.1:0"
	cfg.LeaseDuration, cfg.RenewDeadline, cfg.RetryPeriod = 3*time.Second, 2*time.Second, 200*time.Millisecond
	m, err := NewManager(client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()

	health := "http://" + m.HealthAddr()
	poll.Eventually(t, time.Minute, "readyz", func() bool { c, _ := get(t, health+"/readyz"); return c == 200 })
	if c, b := get(t, health+"/healthz"); c != 200 {
		t.Fatalf("healthz %d %s", c, b)
	}
	poll.Eventually(t, time.Minute, "leadership", func() bool {
		_, b := get(t, "http://"+m.MetricsAddr()+"/metrics")
		return strings.Contains(b, "consul_cni_repair_leader 1")
	})
	_, body := get(t, "http://"+m.MetricsAddr()+"/metrics")
	for _, want := range []string{"consul_cni_repair_build_info{", "consul_cni_repair_workqueue_depth{name=\"pods\"}", "consul_cni_repair_skipped_total{reason=\"bare_pod\"} 0", "process_resident_memory_bytes"} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	lease, err := client.CoordinationV1().Leases("ns").Get(context.Background(), Component, metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != "replica-a" {
		t.Fatalf("lease: %+v %v", lease, err)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after shutdown: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	lease, err = client.CoordinationV1().Leases("ns").Get(context.Background(), Component, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := lease.Spec.HolderIdentity; h != nil && *h != "" {
		t.Fatalf("lease still held by %q after shutdown", *h)
	}
	if c, _ := get(t, health+"/healthz"); c == 200 {
		t.Fatal("health server still up after shutdown")
	}
}

// A lost lease ends Run with leader.ErrLeaseLost, every informer stopped
// and the servers closed, so the process exits and is restarted as a standby.
func TestManagerLostLeaseStopsEverything(t *testing.T) {
	baseline := runtime.NumGoroutine()
	api := leadertest.NewLeaseAPI()
	cfg := DefaultManagerConfig()
	cfg.LeaseNamespace, cfg.LeaseName = leadertest.Namespace, leadertest.Name
	cfg.Identity = "replica-a"
	cfg.MetricsAddr = "0"
	cfg.HealthAddr = "127.0.0.1:0"
	cfg.NodeReadiness = true
	cfg.LeaseDuration, cfg.RenewDeadline, cfg.RetryPeriod = 3*time.Second, 2*time.Second, 200*time.Millisecond
	m, err := NewManager(api, cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- m.Run(context.Background()) }()
	health := "http://" + m.HealthAddr()
	poll.Eventually(t, time.Minute, "leadership", func() bool { return testutil.ToFloat64(m.Metrics.Leader) == 1 })
	poll.Eventually(t, time.Minute, "readyz", func() bool { c, _ := get(t, health+"/readyz"); return c == 200 })

	api.Steal(t)
	select {
	case err := <-done:
		if !errors.Is(err, leader.ErrLeaseLost) {
			t.Fatalf("Run = %v, want leader.ErrLeaseLost", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Run did not return after the lease was lost")
	}
	for name, inf := range map[string]cache.SharedIndexInformer{"pods": m.Informers.Pods, "nodes": m.Informers.Nodes, "cni pods": m.Informers.CNIPods} {
		if !inf.IsStopped() {
			t.Errorf("%s informer still running", name)
		}
	}
	if v := testutil.ToFloat64(m.Metrics.Leader); v != 0 {
		t.Errorf("leader gauge = %v after the lease was lost", v)
	}
	if c, _ := get(t, health+"/healthz"); c == 200 {
		t.Error("healthz still answers 200 after Run returned")
	}
	if h := api.Holder(t); h != "thief" {
		t.Errorf("holder = %q, want thief", h)
	}
	http.DefaultClient.CloseIdleConnections()
	poll.Eventually(t, time.Minute, "every goroutine Run started to end", func() bool { return runtime.NumGoroutine() <= baseline })
}
