package repair

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

const testLeaseNS, testLeaseName = "ns", "lease"

// leaseAPI is a fake clientset whose Leases behave like the apiserver's
// where leader election depends on it: an update must carry the stored
// resourceVersion (409 otherwise), and an outage fails every lease call.
type leaseAPI struct {
	*fake.Clientset
	down atomic.Bool
	rv   atomic.Int64
}

func newLeaseAPI() *leaseAPI {
	a := &leaseAPI{Clientset: fake.NewClientset()}
	gr := schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}
	a.PrependReactor("*", "leases", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if a.down.Load() {
			return true, nil, apierrors.NewServiceUnavailable("apiserver down")
		}
		verb := action.GetVerb()
		if verb != "create" && verb != "update" {
			return false, nil, nil
		}
		lease := action.(k8stesting.CreateAction).GetObject().(*coordinationv1.Lease)
		if verb == "update" {
			cur, err := a.Tracker().Get(gr.WithVersion("v1"), lease.Namespace, lease.Name)
			if err != nil {
				return true, nil, err
			}
			if cur.(*coordinationv1.Lease).ResourceVersion != lease.ResourceVersion {
				return true, nil, apierrors.NewConflict(gr, lease.Name, errors.New("resourceVersion changed"))
			}
		}
		lease = lease.DeepCopy()
		lease.ResourceVersion = strconv.FormatInt(a.rv.Add(1), 10)
		var err error
		if verb == "update" {
			err = a.Tracker().Update(gr.WithVersion("v1"), lease, lease.Namespace)
		} else {
			err = a.Tracker().Create(gr.WithVersion("v1"), lease, lease.Namespace)
		}
		return true, lease, err
	})
	return a
}

func (a *leaseAPI) lease(t *testing.T) *coordinationv1.Lease {
	t.Helper()
	l, err := a.CoordinationV1().Leases(testLeaseNS).Get(context.Background(), testLeaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func (a *leaseAPI) holder(t *testing.T) string {
	t.Helper()
	if h := a.lease(t).Spec.HolderIdentity; h != nil {
		return *h
	}
	return ""
}

// steal makes another replica the holder for an hour, as a competing
// leader (or an operator) writing the Lease would.
func (a *leaseAPI) steal(t *testing.T) {
	t.Helper()
	l := a.lease(t)
	thief, hour, now := "thief", int32(3600), metav1.NewMicroTime(time.Now())
	l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.RenewTime, l.Spec.AcquireTime = &thief, &hour, &now, &now
	if _, err := a.CoordinationV1().Leases(testLeaseNS).Update(context.Background(), l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func testRunner(a *leaseAPI, id string) *electedRunner {
	return newElectedRunner(leaderelection.LeaderElectionConfig{
		Lock: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: testLeaseNS, Name: testLeaseName},
			Client:     a.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: id},
		},
		LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 100 * time.Millisecond,
		Name: "test",
	})
}

// runResult runs e in the background; the channel gets Run's error.
func runResult(ctx context.Context, e *electedRunner, lead func(context.Context) error) <-chan error {
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
	e       *electedRunner
	api     *leaseAPI
	started chan struct{}
	checkAt error  // Check when lead's context ended
	holder  string // the Lease's holder when lead returned
}

func newLead(e *electedRunner, api *leaseAPI) *leadUntilDone {
	return &leadUntilDone{e: e, api: api, started: make(chan struct{})}
}

func (l *leadUntilDone) run(t *testing.T) func(context.Context) error {
	return func(ctx context.Context) error {
		close(l.started)
		<-ctx.Done()
		l.checkAt = l.e.Check(nil)
		l.api.down.Store(false) // read the Lease even during an outage
		l.holder = l.api.holder(t)
		return nil
	}
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
	api := newLeaseAPI()
	e := testRunner(api, "a")
	l := newLead(e, api)
	ctx, cancel := context.WithCancel(context.Background())
	done := runResult(ctx, e, l.run(t))
	waitStarted(t, l)
	cancel()
	if err := waitErr(t, done); err != nil {
		t.Fatalf("Run after shutdown: %v", err)
	}
	if l.holder != "a" {
		t.Fatalf("lease holder while lead was stopping = %q, want a (released before the controllers stopped)", l.holder)
	}
	if h := api.holder(t); h != "" {
		t.Fatalf("lease not released after shutdown: holder %q", h)
	}
	if l.checkAt != nil || e.Check(nil) != nil {
		t.Fatalf("health failed on a graceful shutdown: %v / %v", l.checkAt, e.Check(nil))
	}
}

// A stolen lease: Check fails from the moment lead's context ends, Run
// returns errLeaseLost only after lead returned, and the thief keeps it.
func TestElectedRunnerStolenLease(t *testing.T) {
	api := newLeaseAPI()
	e := testRunner(api, "a")
	l := newLead(e, api)
	done := runResult(context.Background(), e, l.run(t))
	waitStarted(t, l)
	if err := e.Check(nil); err != nil {
		t.Fatalf("Check while leading: %v", err)
	}
	api.steal(t)
	err := waitErr(t, done)
	if !errors.Is(err, errLeaseLost) {
		t.Fatalf("Run = %v, want errLeaseLost", err)
	}
	if l.checkAt == nil {
		t.Fatal("Check was ok while the controllers stopped after the lease was lost")
	}
	if e.Check(nil) == nil {
		t.Fatal("Check ok after the lease was lost")
	}
	if h := api.holder(t); h != "thief" {
		t.Fatalf("holder = %q, want thief", h)
	}
}

// An API outage longer than the renew deadline ends the leadership the same
// way.
func TestElectedRunnerAPIOutage(t *testing.T) {
	api := newLeaseAPI()
	e := testRunner(api, "a")
	l := newLead(e, api)
	done := runResult(context.Background(), e, l.run(t))
	waitStarted(t, l)
	api.down.Store(true)
	if err := waitErr(t, done); !errors.Is(err, errLeaseLost) {
		t.Fatalf("Run = %v, want errLeaseLost", err)
	}
	if l.checkAt == nil || e.Check(nil) == nil {
		t.Fatalf("Check ok after the lease was lost: %v / %v", l.checkAt, e.Check(nil))
	}
}

// lead failing on its own ends Run with its error and releases the lease.
func TestElectedRunnerLeadFails(t *testing.T) {
	api := newLeaseAPI()
	e := testRunner(api, "a")
	boom := errors.New("caches did not sync")
	done := runResult(context.Background(), e, func(context.Context) error { return boom })
	if err := waitErr(t, done); !errors.Is(err, boom) || errors.Is(err, errLeaseLost) {
		t.Fatalf("Run = %v, want only %v", err, boom)
	}
	if h := api.holder(t); h != "" {
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
	api := newLeaseAPI()
	holder := testRunner(api, "a")
	hl := newLead(holder, api)
	hctx, hcancel := context.WithCancel(context.Background())
	hdone := runResult(hctx, holder, hl.run(t))
	waitStarted(t, hl)

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
