package leader

import (
	"context"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// renewClock is the leader's lock, noting when each of its own writes that
// got through was sent. Another replica takes the Lease over only once it
// saw no renewal for the lease duration, counted from when it observed the
// last one, which is after that write was sent: so until sent + lease
// duration no other replica leads.
type renewClock struct {
	resourcelock.Interface
	mu   sync.Mutex
	sent time.Time
}

func (l *renewClock) note(sent time.Time, rec resourcelock.LeaderElectionRecord, err error) error {
	if err == nil && rec.HolderIdentity == l.Identity() {
		l.mu.Lock()
		l.sent = sent
		l.mu.Unlock()
	}
	return err
}

// Create implements resourcelock.Interface.
func (l *renewClock) Create(ctx context.Context, rec resourcelock.LeaderElectionRecord) error {
	sent := time.Now()
	return l.note(sent, rec, l.Interface.Create(ctx, rec))
}

// Update implements resourcelock.Interface.
func (l *renewClock) Update(ctx context.Context, rec resourcelock.LeaderElectionRecord) error {
	sent := time.Now()
	return l.note(sent, rec, l.Interface.Update(ctx, rec))
}

// lastSent is when the last write of ours that got through was sent.
func (l *renewClock) lastSent() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sent
}

// release gives the Lease up when this replica still holds it, as
// client-go's ReleaseOnCancel does (a one-second lease with no holder); the
// write carries the resourceVersion read, so it fails rather than clobber
// another holder's record.
func (l *renewClock) release(ctx context.Context) error {
	rec, _, err := l.Get(ctx)
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}
	if rec.HolderIdentity != l.Identity() {
		return nil
	}
	now := metav1.Now()
	return l.Interface.Update(ctx, resourcelock.LeaderElectionRecord{
		LeaderTransitions: rec.LeaderTransitions, LeaseDurationSeconds: 1, RenewTime: now, AcquireTime: now,
	})
}

// fenceKey carries the leader's fence in the controllers' context.
type fenceKey struct{}

// WithFence returns ctx carrying fence: the time until which an action
// started as leader may run. Run gives the function it runs as leader such
// a context.
func WithFence(ctx context.Context, fence func() time.Time) context.Context {
	return context.WithValue(ctx, fenceKey{}, fence)
}

// ActionDeadline is when an action started now must be over: now + timeout,
// or earlier the fence ctx carries (no replica can have taken the Lease
// over before it). ok is false when the fence has passed: this replica may
// no longer be the only leader, and must not act. A ctx without a fence
// (no leader election) bounds the action by timeout alone.
func ActionDeadline(ctx context.Context, now time.Time, timeout time.Duration) (deadline time.Time, ok bool) {
	deadline = now.Add(timeout)
	fence, _ := ctx.Value(fenceKey{}).(func() time.Time)
	if fence == nil {
		return deadline, true
	}
	f := fence()
	if !now.Before(f) {
		return f, false
	}
	if f.Before(deadline) {
		deadline = f
	}
	return deadline, true
}
