package cluster

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// TB is the part of testing.TB the cluster helpers use.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Cleanup(func())
	Name() string
}

var shared struct {
	sync.Mutex
	main    bool
	started bool
	c       *Cluster
	err     error
}

// Main is the body of TestMain for packages that use Shared: it runs the
// tests, then stops the shared control plane (also on SIGINT/SIGTERM) and
// exits with the tests' code.
//
//	func TestMain(m *testing.M) { cluster.Main(m) }
func Main(m *testing.M) {
	shared.Lock()
	shared.main = true
	shared.Unlock()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, stopSignals...)
	go func() {
		s := <-sig
		fmt.Fprintf(os.Stderr, "cluster: %v: stopping the control plane\n", s)
		stopShared()
		os.Exit(1)
	}()
	code := m.Run()
	stopShared()
	os.Exit(code)
}

func stopShared() {
	shared.Lock()
	c := shared.c
	shared.Unlock()
	if c != nil {
		c.Stop()
	}
}

// Shared returns the control plane of this test binary, starting it on
// first use. It fails the test if the control plane cannot start (a missing
// binary is reported with the command that builds it).
func Shared(tb testing.TB) *Cluster {
	tb.Helper()
	shared.Lock()
	defer shared.Unlock()
	if !shared.main {
		tb.Fatalf("%v", errNotMain)
	}
	if !shared.started {
		shared.started = true
		start := time.Now()
		shared.c, shared.err = Start(context.Background(), Options{})
		if shared.err == nil {
			tb.Logf("control plane ready in %v at %s (dir %s)", time.Since(start).Round(100*time.Millisecond), shared.c.Server, shared.c.Dir)
		}
	}
	if shared.err != nil {
		tb.Fatalf("local control plane: %v", shared.err)
	}
	if ex := shared.c.Exited(); len(ex) > 0 {
		tb.Fatalf("local control plane is down: %s", strings.Join(ex, "; "))
	}
	return shared.c
}

var nonName = regexp.MustCompile(`[^a-z0-9-]+`)

// Namespace creates a fresh namespace named after the test, waits for its
// default ServiceAccount, and deletes it when the test ends.
func (c *Cluster) Namespace(tb TB) string {
	tb.Helper()
	base := strings.Trim(nonName.ReplaceAllString(strings.ToLower(tb.Name()), "-"), "-")
	if len(base) > 40 {
		base = strings.Trim(base[:40], "-")
	}
	if base == "" {
		base = "test"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: base + "-"},
	}, metav1.CreateOptions{})
	if err != nil {
		tb.Fatalf("create namespace: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = c.Client.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{})
	})
	if err := c.WaitForServiceAccount(ctx, ns.Name, "default"); err != nil {
		tb.Fatalf("namespace %s: default service account: %v", ns.Name, err)
	}
	return ns.Name
}

// ServiceAccountConfig returns a configuration authenticated by a real
// token of ServiceAccount ns/name (created if missing), from TokenRequest.
func (c *Cluster) ServiceAccountConfig(tb testing.TB, ns, name string) *rest.Config {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg, err := c.ServiceAccountRESTConfig(ctx, ns, name)
	if err != nil {
		tb.Fatalf("%v", err)
	}
	return cfg
}
