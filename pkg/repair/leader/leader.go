// Package leader runs the repair controllers only while this replica holds
// a Lease, and makes sure no two replicas act at once, also when the
// leader's renewal fails.
//
// A Runner sequences the end of leading. On shutdown the controllers'
// context is canceled first and Run waits for them to return (each action
// in flight is seen through); only then is the Lease released, so a standby
// can start leading only after the last action of the old leader ended.
// client-go's ReleaseOnCancel is not used: it releases the Lease as soon as
// renewal fails, while actions may still be in flight.
//
// When renewal fails (another holder took the Lease, or the API did not
// answer within the renew deadline) the Lease is never released: it
// expires on its own, Check fails from that moment (the process should exit
// and come back as a standby) and Run returns ErrLeaseLost once the
// controllers returned. Waiting for them holds no other replica back then:
// the Lease expires a lease duration after the last renewal they saw,
// whether or not our actions have ended. So every action is fenced: the
// context given to the controllers carries the fence, the last renewal of
// ours that got through (when it was sent) plus the renew deadline plus
// half the margin to the lease duration. No other replica can take the
// Lease over before that renewal plus the lease duration, so an action that
// starts before the fence and ends by it (ActionDeadline) never overlaps
// another leader's.
package leader

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/klog/v2"
)

// ErrLeaseLost is returned by Run when this replica lost its lease (renewal
// refused or impossible for the renew deadline): the process should exit
// and be restarted, to start again as a standby.
var ErrLeaseLost = errors.New("leader election lost")

// errLeadStopped is returned when the work run as leader returned on its
// own, without shutdown or lease loss.
var errLeadStopped = errors.New("controllers stopped while leading")

// healthTolerance is how long past the lease's expiry an unrenewed lease is
// still reported healthy by the elector's watchdog.
const healthTolerance = 20 * time.Second

// stopMargin is how much longer than an action's timeout Run waits for the
// function run as leader to return once its context ended; a function that
// takes longer leaves the Lease to expire rather than be released under it.
const stopMargin = 5 * time.Second

// Runner runs a function only while this replica holds a Lease and
// sequences its end:
//   - shutdown (ctx done): the function's context is canceled, Run waits for
//     it to return (at most the action timeout and 5 s), and only then is
//     the lease released, so two replicas never act at once during a
//     graceful hand-over;
//   - lease lost (renewal refused or impossible for the renew deadline):
//     Check fails from that moment on, the function's context is canceled,
//     Run waits for it and returns ErrLeaseLost. The lease is not released
//     then (client-go's ReleaseOnCancel would release it as soon as renewal
//     failed, while actions were still in flight): it expires on its own,
//     and the function's actions are fenced to end before any other
//     replica can take it over (ActionDeadline);
//   - the function returns on its own: the lease is released and Run returns
//     its error.
//
// It is used once.
type Runner struct {
	// config holds the lock, the durations and the name; Run sets the
	// callbacks, ReleaseOnCancel and the watchdog.
	config   leaderelection.LeaderElectionConfig
	watchdog *leaderelection.HealthzAdaptor
	lost     atomic.Bool
	lock     *renewClock
	// stopTimeout bounds how long Run waits for the function run as leader
	// to return once its context ended.
	stopTimeout time.Duration
}

// New returns a Runner for config's lock, durations and name (Run sets the
// callbacks). actionTimeout bounds one action of the function run as
// leader: Run waits that long and 5 s more for the function to return
// before it leaves the Lease to expire.
func New(config leaderelection.LeaderElectionConfig, actionTimeout time.Duration) *Runner {
	lock := &renewClock{Interface: config.Lock}
	config.Lock = lock
	return &Runner{
		config: config, watchdog: leaderelection.NewLeaderHealthzAdaptor(healthTolerance), lock: lock,
		stopTimeout: actionTimeout + stopMargin,
	}
}

// fence is the time until which this replica may act as leader: when its
// last renewal that got through was sent, plus the renew deadline and half
// the margin between it and the lease duration. No other replica takes the
// lease over before that write plus the lease duration; by the renew
// deadline this one has given up leading.
func (e *Runner) fence() time.Time {
	margin := (e.config.LeaseDuration - e.config.RenewDeadline) / 2
	return e.lock.lastSent().Add(e.config.RenewDeadline + margin)
}

// Check is the liveness check: it fails once the lease was lost (until the
// process exits) and while the leader's renewal is overdue.
func (e *Runner) Check(r *http.Request) error {
	if e.lost.Load() {
		return ErrLeaseLost
	}
	return e.watchdog.Check(r)
}

// electedState is what the elector's callbacks and Run share.
type electedState struct {
	mu      sync.Mutex
	closed  bool // shut down, or the elector returned: never start leading
	started bool
	done    chan struct{} // closed when lead returned (if started)
	err     error         // lead's result
	ownStop bool          // lead returned while its context was live
}

// Run blocks until ctx is done (nil, or lead's error), the lease is lost
// (ErrLeaseLost) or lead returns on its own (its error).
func (e *Runner) Run(ctx context.Context, lead func(context.Context) error) error {
	// The elector outlives ctx: the lease is released only once lead
	// has returned.
	leCtx, stopElector := context.WithCancel(context.WithoutCancel(ctx))
	defer stopElector()
	st := &electedState{done: make(chan struct{})}
	stopShutdown := context.AfterFunc(ctx, func() {
		st.mu.Lock()
		defer st.mu.Unlock()
		st.closed = true
		if !st.started {
			stopElector()
		} // else lead sees ctx done, returns, and then stops the elector
	})
	defer stopShutdown()

	cfg := e.config
	cfg.ReleaseOnCancel = false // released by Run once lead returned
	cfg.WatchDog = e.watchdog
	cfg.Callbacks = leaderelection.LeaderCallbacks{
		OnStartedLeading: func(lctx context.Context) {
			defer stopElector() // whatever ended lead, give the lease up
			e.lead(ctx, lctx, st, lead)
		},
		OnStoppedLeading: func() {
			if ctx.Err() == nil {
				e.lost.Store(true)
			}
		},
	}
	le, err := leaderelection.NewLeaderElector(cfg)
	if err != nil {
		return err
	}
	le.Run(leCtx)

	st.mu.Lock()
	st.closed = true
	started := st.started
	st.mu.Unlock()
	if !started {
		if ctx.Err() != nil {
			return nil
		}
		e.lost.Store(true)
		return ErrLeaseLost
	}
	select {
	case <-st.done:
	case <-time.After(e.stopTimeout):
		// Not released: it expires, and lead's actions are fenced.
		e.lost.Store(ctx.Err() == nil)
		return fmt.Errorf("the controllers did not stop within %s after leading ended", e.stopTimeout)
	}
	if ctx.Err() != nil || st.ownStop {
		e.releaseLease(ctx)
	}
	switch {
	case ctx.Err() != nil:
		return st.err
	case st.ownStop:
		if st.err == nil {
			return errLeadStopped
		}
		return st.err
	}
	e.lost.Store(true)
	return errors.Join(ErrLeaseLost, st.err)
}

// lead runs lead with a context that ends at shutdown (ctx) or with the
// leadership (lctx, canceled by the elector when renewal failed), unless Run
// has already closed st. A lost lease is recorded before lead's context is
// canceled, so Check fails while the controllers stop.
func (e *Runner) lead(ctx, lctx context.Context, st *electedState, lead func(context.Context) error) {
	st.mu.Lock()
	if st.closed {
		st.mu.Unlock()
		return
	}
	st.started = true
	st.mu.Unlock()
	cctx, cancel := context.WithCancel(WithFence(context.WithoutCancel(lctx), e.fence))
	defer cancel()
	stopShutdown := context.AfterFunc(ctx, cancel)
	defer stopShutdown()
	stopLost := context.AfterFunc(lctx, func() {
		if ctx.Err() == nil {
			e.lost.Store(true)
		}
		cancel()
	})
	err := lead(cctx)
	own := cctx.Err() == nil
	stopLost() // from here on the elector stops because lead returned
	st.mu.Lock()
	st.err, st.ownStop = err, own
	st.mu.Unlock()
	close(st.done)
}

// releaseLease gives the lease up once lead returned (shutdown, or lead
// stopped on its own), bounded by the renew deadline; a failure leaves it
// to expire.
func (e *Runner) releaseLease(ctx context.Context) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.config.RenewDeadline)
	defer cancel()
	if err := e.lock.release(rctx); err != nil {
		klog.FromContext(ctx).Error(err, "Releasing the lease failed; it expires on its own", "lock", e.lock.Describe())
	}
}
