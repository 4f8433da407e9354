// Package leadertest is a Kubernetes API for leader election tests: a fake
// clientset whose Leases behave like the apiserver's where leader election
// depends on it.
package leadertest

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
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// The Lease the tests elect on.
const Namespace, Name = "ns", "lease"

// LeaseAPI is a fake clientset whose Leases behave like the apiserver's
// where leader election depends on it: an update must carry the stored
// resourceVersion (409 otherwise), and an outage (Down) fails every lease
// call.
type LeaseAPI struct {
	*fake.Clientset
	// Down set: every lease call fails with 503, as in an API outage.
	Down atomic.Bool
	rv   atomic.Int64
}

// NewLeaseAPI returns a LeaseAPI with no Lease yet.
func NewLeaseAPI() *LeaseAPI {
	a := &LeaseAPI{Clientset: fake.NewClientset()}
	gr := coordinationv1.Resource("leases")
	a.PrependReactor("*", "leases", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if a.Down.Load() {
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

// Lease is the Lease Namespace/Name as stored.
func (a *LeaseAPI) Lease(t testing.TB) *coordinationv1.Lease {
	t.Helper()
	l, err := a.CoordinationV1().Leases(Namespace).Get(context.Background(), Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// Holder is the Lease's holder identity, "" when none.
func (a *LeaseAPI) Holder(t testing.TB) string {
	t.Helper()
	if h := a.Lease(t).Spec.HolderIdentity; h != nil {
		return *h
	}
	return ""
}

// Steal makes "thief" the holder for an hour, as a competing leader (or an
// operator) writing the Lease would.
func (a *LeaseAPI) Steal(t testing.TB) {
	t.Helper()
	l := a.Lease(t)
	thief, hour, now := "thief", int32(3600), metav1.NewMicroTime(time.Now())
	l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.RenewTime, l.Spec.AcquireTime = &thief, &hour, &now, &now
	if _, err := a.CoordinationV1().Leases(Namespace).Update(context.Background(), l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}
