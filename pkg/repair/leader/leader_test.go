package leader

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/leader/leadertest"
)

// testActionTimeout bounds the test leaders' actions as the controller's
// are bounded.
const testActionTimeout = 10 * time.Second

func testRunner(a *leadertest.LeaseAPI, id string) *Runner {
	return New(leaderelection.LeaderElectionConfig{
		Lock: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: leadertest.Namespace, Name: leadertest.Name},
			Client:     a.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: id},
		},
		LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 100 * time.Millisecond,
		Name: "test",
	}, testActionTimeout)
}

// runResult runs e in the background; the channel gets Run's error.
func runResult(ctx context.Context, e *Runner, lead func(context.Context) error) <-chan error {
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx, lead) }()
	return done
}

func waitErr(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(time.Minute):
		t.Fatal("Run did not return")
		return nil
	}
}

// leadUntilDone is a lead function that reports that it runs, and when its
// context ends, what Check and the Lease said at that moment.
type leadUntilDone struct {
	e       *Runner
	api     *leadertest.LeaseAPI
	started chan struct{}
	checkAt error  // Check when lead's context ended
	holder  string // the Lease's holder when lead returned
}

func newLead(e *Runner, api *leadertest.LeaseAPI) *leadUntilDone {
	return &leadUntilDone{e: e, api: api, started: make(chan struct{})}
}

func (l *leadUntilDone) run(t *testing.T) func(context.Context) error {
	return func(ctx context.Context) error {
		close(l.started)
		<-ctx.Done()
		l.checkAt = l.e.Check(nil)
		l.api.Down.Store(false) // read the Lease even during an outage
		l.holder = l.api.Holder(t)
		return nil
	}
}

// leading starts a Runner for id leading with a leadUntilDone and waits
// until it leads; cancel shuts it down, done gets Run's error.
func leading(t *testing.T, api *leadertest.LeaseAPI, id string) (e *Runner, l *leadUntilDone, cancel context.CancelFunc, done <-chan error) {
	t.Helper()
	e = testRunner(api, id)
	l = newLead(e, api)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	done = runResult(ctx, e, l.run(t))
	waitStarted(t, l)
	return e, l, cancel, done
}

func waitStarted(t *testing.T, l *leadUntilDone) {
	t.Helper()
	select {
	case <-l.started:
	case <-time.After(time.Minute):
		t.Fatal("never started leading")
	}
}

// Shutdown: lead's context ends first, the lease is still held until lead
// returned, then it is released; Run returns nil and health stays ok.
func TestElectedRunnerShutdownReleasesAfterLead(t *testing.T) {
	api := leadertest.NewLeaseAPI()
	e, l, cancel, done := leading(t, api, "a")
	cancel()
	if err := waitErr(t, done); err != nil {
		t.Fatalf("Run after shutdown: %v", err)
	}
	if l.holder != "a" {
		t.Fatalf("lease holder while lead was stopping = %q, want a (released before the controllers stopped)", l.holder)
	}
	if h := api.Holder(t); h != "" {
		t.Fatalf("lease not released after shutdown: holder %q", h)
	}
	if l.checkAt != nil || e.Check(nil) != nil {
		t.Fatalf("health failed on a graceful shutdown: %v / %v", l.checkAt, e.Check(nil))
	}
}

// A stolen lease: Check fails from the moment lead's context ends, Run
// returns ErrLeaseLost only after lead returned, and the thief keeps it.
func TestElectedRunnerStolenLease(t *testing.T) {
	api := leadertest.NewLeaseAPI()
	e, l, _, done := leading(t, api, "a")
	if err := e.Check(nil); err != nil {
		t.Fatalf("Check while leading: %v", err)
	}
	api.Steal(t)
	err := waitErr(t, done)
	if !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Run = %v, want ErrLeaseLost", err)
	}
	if l.checkAt == nil {
		t.Fatal("Check was ok while the controllers stopped after the lease was lost")
	}
	if e.Check(nil) == nil {
		t.Fatal("Check ok after the lease was lost")
	}
	if h := api.Holder(t); h != "thief" {
		t.Fatalf("holder = %q, want thief", h)
	}
}

// An API outage longer than the renew deadline ends the leadership the same
// way.
func TestElectedRunnerAPIOutage(t *testing.T) {
	api := leadertest.NewLeaseAPI()
	e, l, _, done := leading(t, api, "a")
	api.Down.Store(true)
	if err := waitErr(t, done); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Run = %v, want ErrLeaseLost", err)
	}
	if l.checkAt == nil || e.Check(nil) == nil {
		t.Fatalf("Check ok after the lease was lost: %v / %v", l.checkAt, e.Check(nil))
	}
}

// lead failing on its own ends Run with its error and releases the lease.
func TestElectedRunnerLeadFails(t *testing.T) {
	api := leadertest.NewLeaseAPI()
	e := testRunner(api, "a")
	boom := errors.New("caches did not sync")
	done := runResult(context.Background(), e, func(context.Context) error { return boom })
	if err := waitErr(t, done); !errors.Is(err, boom) || errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Run = %v, want only %v", err, boom)
	}
	if h := api.Holder(t); h != "" {
		t.Fatalf("lease not released: holder %q", h)
	}
	// Returning nil while leading is an error too: nothing would act.
	e = testRunner(api, "b")
	done = runResult(context.Background(), e, func(context.Context) error { return nil })
	if err := waitErr(t, done); !errors.Is(err, errLeadStopped) {
		t.Fatalf("Run = %v, want %v", err, errLeadStopped)
	}
}

// A standby shut down while another replica holds the lease never leads
// and returns nil.
func TestElectedRunnerStandbyShutdown(t *testing.T) {
	api := leadertest.NewLeaseAPI()
	_, _, hcancel, hdone := leading(t, api, "a")

	standby := testRunner(api, "b")
	var led atomic.Bool
	ctx, cancel := context.WithCancel(context.Background())
	done := runResult(ctx, standby, func(context.Context) error { led.Store(true); return nil })
	time.Sleep(500 * time.Millisecond) // a few retry periods as a standby
	cancel()
	if err := waitErr(t, done); err != nil {
		t.Fatalf("standby Run = %v", err)
	}
	if led.Load() {
		t.Fatal("the standby led while another replica held the lease")
	}
	if err := standby.Check(nil); err != nil {
		t.Fatalf("standby Check = %v", err)
	}
	hcancel()
	if err := waitErr(t, hdone); err != nil {
		t.Fatal(err)
	}
}
