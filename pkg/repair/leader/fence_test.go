package leader

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/leader/leadertest"
)

// leaseWrites records the Lease writes that got through, and fails the
// renewals of one holder (its path to the API broken) from a moment on.
type leaseWrites struct {
	mu       sync.Mutex
	failFrom string // holder whose renewals fail; "" none
	releases []time.Time
}

func (w *leaseWrites) install(api *leadertest.LeaseAPI) {
	api.PrependReactor("update", "leases", func(action k8stesting.Action) (bool, runtime.Object, error) {
		l := action.(k8stesting.UpdateAction).GetObject().(*coordinationv1.Lease)
		holder := ""
		if l.Spec.HolderIdentity != nil {
			holder = *l.Spec.HolderIdentity
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		if holder != "" && holder == w.failFrom {
			return true, nil, apierrors.NewTimeoutError("renewal timed out", 1)
		}
		if holder == "" {
			w.releases = append(w.releases, time.Now())
		}
		return false, nil, nil
	})
}

// span is when a replica led: from its lead's start to its return.
type span struct {
	mu         sync.Mutex
	start, end time.Time
}

func (s *span) get() (time.Time, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.start, s.end
}

// inFlightLead leads until its context ends, then finishes an action it
// had started, for inFlight (bounded, as the controller's actions are).
func inFlightLead(s *span, started chan<- struct{}, inFlight time.Duration) func(context.Context) error {
	return func(ctx context.Context) error {
		s.mu.Lock()
		s.start = time.Now()
		s.mu.Unlock()
		close(started)
		<-ctx.Done()
		time.Sleep(inFlight)
		s.mu.Lock()
		s.end = time.Now()
		s.mu.Unlock()
		return nil
	}
}

// When the leader's renewals fail, it stops and waits for its in-flight
// action before anything lets another replica lead: the Lease is not
// released before its controllers returned, and the standby starts
// leading only after the old leader's last action ended.
func TestRenewalFailureNeverLetsTwoLeadersAct(t *testing.T) {
	api := leadertest.NewLeaseAPI()
	w := &leaseWrites{}
	w.install(api)
	a, b := testRunner(api, "a"), testRunner(api, "b")
	var sa, sb span
	aStarted, bStarted := make(chan struct{}), make(chan struct{})
	aDone := runResult(context.Background(), a, inFlightLead(&sa, aStarted, 500*time.Millisecond))
	select {
	case <-aStarted:
	case <-time.After(time.Minute):
		t.Fatal("a never led")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	bDone := runResult(ctx, b, inFlightLead(&sb, bStarted, 0))
	w.mu.Lock()
	w.failFrom = "a"
	w.mu.Unlock()
	if err := waitErr(t, aDone); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("a: Run = %v, want ErrLeaseLost", err)
	}
	select {
	case <-bStarted:
	case <-time.After(time.Minute):
		t.Fatal("b never led")
	}
	_, aEnd := sa.get()
	bStart, _ := sb.get()
	if bStart.Before(aEnd) {
		t.Errorf("b started leading at %s, %s before a's in-flight action ended: two leaders acted at once",
			bStart.Format(time.StampMilli), aEnd.Sub(bStart))
	}
	w.mu.Lock()
	for _, r := range w.releases {
		if r.Before(aEnd) {
			t.Errorf("the Lease was released at %s, %s before a's in-flight action ended", r.Format(time.StampMilli), aEnd.Sub(r))
		}
	}
	w.mu.Unlock()
	cancel()
	if err := waitErr(t, bDone); err != nil {
		t.Fatal(err)
	}
}

// An action started before the fence ends by it, or after its timeout when
// that comes first; none may start once the fence has passed; without a
// fence (no leader election) the timeout alone bounds it.
func TestActionDeadlineIsTheFenceOrTheTimeout(t *testing.T) {
	now := time.Now()
	fenced := func(f time.Time) context.Context {
		return WithFence(context.Background(), func() time.Time { return f })
	}
	for _, c := range []struct {
		name   string
		ctx    context.Context
		want   time.Time
		wantOK bool
	}{
		{"fence before the timeout", fenced(now.Add(2 * time.Second)), now.Add(2 * time.Second), true},
		{"timeout before the fence", fenced(now.Add(time.Minute)), now.Add(testActionTimeout), true},
		{"fence passed", fenced(now.Add(-time.Millisecond)), now.Add(-time.Millisecond), false},
		{"fence now", fenced(now), now, false},
		{"no fence", context.Background(), now.Add(testActionTimeout), true},
	} {
		d, ok := ActionDeadline(c.ctx, now, testActionTimeout)
		if !d.Equal(c.want) || ok != c.wantOK {
			t.Errorf("%s: ActionDeadline = %s %v, want %s %v", c.name, d, ok, c.want, c.wantOK)
		}
	}
}

// The fence follows the renewals: the renew deadline plus half the margin
// to the lease duration after the last renewal sent.
func TestFenceFollowsTheRenewals(t *testing.T) {
	api := leadertest.NewLeaseAPI()
	e := testRunner(api, "a")
	started := make(chan struct{})
	var s span
	ctx, cancel := context.WithCancel(context.Background())
	done := runResult(ctx, e, inFlightLead(&s, started, 0))
	<-started
	time.Sleep(300 * time.Millisecond) // a few renewals (retry period 100 ms)
	sent := e.lock.lastSent()
	if f := e.fence(); !f.Equal(sent.Add(2500*time.Millisecond)) || time.Since(sent) > time.Second {
		t.Fatalf("fence %s, last renewal sent %s", f, sent)
	}
	cancel()
	if err := waitErr(t, done); err != nil {
		t.Fatal(err)
	}
}
