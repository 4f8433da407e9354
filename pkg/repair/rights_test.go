package repair

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
)

// authorizer answers SelfSubjectAccessReviews on client: every right is
// granted except those denied holds ("create pods/eviction").
func authorizer(client *fake.Clientset, denied *atomic.Value) {
	client.PrependReactor("create", "selfsubjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		r := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SelfSubjectAccessReview).DeepCopy()
		ra := r.Spec.ResourceAttributes
		res := ra.Resource
		if ra.Subresource != "" {
			res += "/" + ra.Subresource
		}
		deny, _ := denied.Load().(string)
		r.Status.Allowed = ra.Verb+" "+res != deny
		if !r.Status.Allowed {
			r.Status.Reason = "no RBAC policy matched"
		}
		return true, r, nil
	})
}

// A controller denied a right its configuration needs (here the evict
// action's create pods/eviction) is not ready, /readyz names the right,
// and its missing_rights series is 1; once granted, at the next review,
// it is ready and the series is 0.
func TestManagerNotReadyWhileARightIsMissing(t *testing.T) {
	client := fake.NewClientset()
	var denied atomic.Value
	denied.Store("create pods/eviction")
	authorizer(client, &denied)
	cfg := DefaultManagerConfig()
	cfg.LeaderElect = false
	cfg.MetricsAddr, cfg.HealthAddr = "0", "127.0.0.1:0"
	m, err := NewManager(client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	m.rightsPeriod = 100 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	defer func() { cancel(); <-done }()

	readyz := "http://" + m.HealthAddr() + "/readyz"
	poll.Eventually(t, time.Minute, "informers synced", func() bool { return m.Informers.HasSynced() })
	poll.Eventually(t, time.Minute, "not ready, naming the right", func() bool {
		c, b := get(t, readyz)
		return c == 503 && strings.Contains(b, "missing rights: create pods/eviction")
	})
	if v := testutil.ToFloat64(m.Metrics.MissingRights.WithLabelValues("create", "pods/eviction")); v != 1 {
		t.Errorf("missing_rights{create, pods/eviction} = %v, want 1", v)
	}
	if v := testutil.ToFloat64(m.Metrics.MissingRights.WithLabelValues("watch", "pods")); v != 0 {
		t.Errorf("missing_rights{watch, pods} = %v, want 0", v)
	}

	denied.Store("")
	poll.Eventually(t, time.Minute, "ready once granted", func() bool { c, _ := get(t, readyz); return c == 200 })
	if v := testutil.ToFloat64(m.Metrics.MissingRights.WithLabelValues("create", "pods/eviction")); v != 0 {
		t.Errorf("missing_rights{create, pods/eviction} = %v after the grant, want 0", v)
	}
}

// The rights reviewed are the configuration's: the action's write and the
// node patch only when acting, never another action's.
func TestRequiredRights(t *testing.T) {
	for _, tc := range []struct {
		name     string
		mutate   func(*Config)
		want     []string
		notWants []string
	}{
		{"evict with node readiness", func(*Config) {}, []string{"list pods", "watch pods", "list nodes", "watch nodes", "create pods/eviction", "patch nodes"}, []string{"delete pods"}},
		{"delete", func(c *Config) { c.Action = judge.ActionDelete }, []string{"delete pods"}, []string{"create pods/eviction", "patch pods"}},
		{"label without node readiness", func(c *Config) { c.Action, c.NodeReadiness = judge.ActionLabel, false }, []string{"patch pods"}, []string{"patch nodes"}},
		{"dry run", func(c *Config) { c.DryRun = true }, []string{"list pods", "watch nodes"}, []string{"create pods/eviction", "patch nodes"}},
	} {
		cfg := defaultConfig()
		tc.mutate(&cfg)
		got := map[string]bool{}
		for _, r := range requiredRights(cfg) {
			got[r.String()] = true
		}
		for _, w := range tc.want {
			if !got[w] {
				t.Errorf("%s: %s not reviewed (%v)", tc.name, w, got)
			}
		}
		for _, w := range tc.notWants {
			if got[w] {
				t.Errorf("%s: %s reviewed, not needed", tc.name, w)
			}
		}
	}
}
