package credentials

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/credentials/credentialstest"
)

func TestDecideKeepsTheTokenOfThePodThatStays(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	tok := credentialstest.PodToken
	oldPod := tok("consul-cni-old", "uid-old", now.Add(30*time.Minute))
	oldPodLater := tok("consul-cni-old", "uid-old", now.Add(90*time.Minute))
	newPod := tok("consul-cni-new", "uid-new", now.Add(60*time.Minute))
	newPodRotated := tok("consul-cni-new", "uid-new", now.Add(70*time.Minute))
	expired := tok("consul-cni-old", "uid-old", now.Add(-time.Minute))
	alive := func(v bool, err error) PodAlive {
		return func(_ context.Context, ns, name, uid string) (bool, error) {
			if ns != "consul-cni-repair" || name != "consul-cni-old" || uid != "uid-old" {
				return false, fmt.Errorf("asked about %s/%s %s", ns, name, uid)
			}
			return v, err
		}
	}
	for _, tc := range []struct {
		name           string
		disk, own      string
		alive          PodAlive
		write, recheck bool
	}{
		{name: "same token", disk: newPod, own: newPod, write: false},
		{name: "own token rotated", disk: newPod, own: newPodRotated, write: true},
		{name: "not a pod token on disk", disk: "static-token", own: newPod, write: true},
		{name: "not a pod token of ours", disk: newPod, own: "static-token", write: true},
		{name: "expired token of another pod", disk: expired, own: newPod, write: true},
		{name: "other pod gone", disk: oldPod, own: newPod, alive: alive(false, nil), write: true},
		{name: "other pod alive, ours expires later", disk: oldPod, own: newPod, alive: alive(true, nil), write: true, recheck: true},
		{name: "other pod alive, its token expires later", disk: oldPodLater, own: newPod, alive: alive(true, nil), write: false, recheck: true},
		{name: "API error: later expiry wins", disk: oldPodLater, own: newPod, alive: alive(false, errors.New("timeout")), write: false, recheck: true},
		{name: "no API: later expiry wins", disk: oldPod, own: newPod, write: true, recheck: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, r := Decide(context.Background(), []byte(tc.disk), []byte(tc.own), tc.alive, now)
			if w != tc.write || r != tc.recheck {
				t.Fatalf("write=%v recheck=%v, want %v %v", w, r, tc.write, tc.recheck)
			}
		})
	}
	// Both sides of a pair agree: exactly one of them wants to write.
	for _, pair := range [][2]string{{oldPod, newPod}, {oldPodLater, newPod}} {
		a, _ := Decide(context.Background(), []byte(pair[0]), []byte(pair[1]), nil, now)
		b, _ := Decide(context.Background(), []byte(pair[1]), []byte(pair[0]), nil, now)
		if a == b {
			t.Errorf("both instances decide write=%v: they would fight", a)
		}
	}
}

func TestPodOfReadsTheBoundPod(t *testing.T) {
	exp := time.Unix(1_800_000_000, 0)
	p, ok := PodOf([]byte(credentialstest.PodToken("consul-cni-abcde", "uid-1", exp) + "\n"))
	if !ok || p != (Pod{Namespace: "consul-cni-repair", Name: "consul-cni-abcde", UID: "uid-1", Expires: exp}) {
		t.Errorf("PodOf = %+v, %v", p, ok)
	}
	for _, tok := range []string{"", "static-token", "a.b.c", "a.e30.c"} {
		if p, ok := PodOf([]byte(tok)); ok {
			t.Errorf("PodOf(%q) = %+v, want not a pod-bound token", tok, p)
		}
	}
}
