package install

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/conflist/conflisttest"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeToken builds a token shaped like a pod-bound service-account token
// (the signature is not checked by the installer).
func fakeToken(pod, uid string, exp time.Time) string {
	enc := base64.RawURLEncoding.EncodeToString
	payload := fmt.Sprintf(`{"aud":["https://kubernetes.default.svc"],"exp":%d,"iat":%d,"iss":"https://kubernetes.default.svc",
"kubernetes.io":{"namespace":"consul-cni-repair","pod":{"name":%q,"uid":%q},"serviceaccount":{"name":"consul-cni","uid":"sa"}},
"sub":"system:serviceaccount:consul-cni-repair:consul-cni"}`, exp.Unix(), exp.Add(-time.Hour).Unix(), pod, uid)
	return enc([]byte(`{"alg":"RS256","kid":"k"}`)) + "." + enc([]byte(payload)) + "." + enc([]byte("sig"))
}

func TestTokenDecision(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	oldPod := fakeToken("consul-cni-old", "uid-old", now.Add(30*time.Minute))
	oldPodLater := fakeToken("consul-cni-old", "uid-old", now.Add(90*time.Minute))
	newPod := fakeToken("consul-cni-new", "uid-new", now.Add(60*time.Minute))
	newPodRotated := fakeToken("consul-cni-new", "uid-new", now.Add(70*time.Minute))
	expired := fakeToken("consul-cni-old", "uid-old", now.Add(-time.Minute))
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
			w, r := tokenDecision(context.Background(), []byte(tc.disk), []byte(tc.own), tc.alive, now)
			if w != tc.write || r != tc.recheck {
				t.Fatalf("write=%v recheck=%v, want %v %v", w, r, tc.write, tc.recheck)
			}
		})
	}
	// Both sides of a pair agree: exactly one of them wants to write.
	for _, pair := range [][2]string{{oldPod, newPod}, {oldPodLater, newPod}} {
		a, _ := tokenDecision(context.Background(), []byte(pair[0]), []byte(pair[1]), nil, now)
		b, _ := tokenDecision(context.Background(), []byte(pair[1]), []byte(pair[0]), nil, now)
		if a == b {
			t.Errorf("both instances decide write=%v: they would fight", a)
		}
	}
}

// Two installers on one node, as during a rolling update with maxSurge:
// the token file must not flip back and forth while both run, and must hold
// the new pod's token soon after the old pod starts terminating.
func TestRollingUpdateTokenHandover(t *testing.T) {
	n := newHostDirs(t)
	conflisttest.WriteFiles(t, n.net, map[string]string{"10-kindnet.conflist": conflisttest.Kindnet})
	exp := time.Now().Add(time.Hour)
	oldTok := fakeToken("consul-cni-old", "uid-old", exp.Add(10*time.Minute)) // rotated: expires later
	newTok := fakeToken("consul-cni-new", "uid-new", exp)
	conflisttest.WriteFiles(t, n.root, map[string]string{"old/token": oldTok, "new/token": newTok})

	var oldAlive atomic.Bool
	oldAlive.Store(true)
	podAlive := func(_ context.Context, ns, name, uid string) (bool, error) {
		switch uid {
		case "uid-old":
			return oldAlive.Load(), nil
		case "uid-new":
			return true, nil
		}
		return false, nil
	}
	var mu sync.Mutex
	writes := 0
	mk := func(tokenFile string) *Installer {
		return n.installer(t, func(c *Config) {
			c.Client = &ClientSource{Server: "https://10.96.0.1:443", TokenFile: tokenFile}
			c.PodAlive = podAlive
			c.Recheck = 50 * time.Millisecond
			c.Resync = 100 * time.Millisecond
		})
	}
	count := func(st PassResult, err error) {
		for _, w := range st.Wrote {
			if w == "token" {
				mu.Lock()
				writes++
				mu.Unlock()
			}
		}
	}
	oldIn, newIn := mk(filepath.Join(n.root, "old/token")), mk(filepath.Join(n.root, "new/token"))
	ctxOld, stopOld := context.WithCancel(context.Background())
	defer stopOld()
	doneOld := make(chan struct{})
	go func() { defer close(doneOld); oldIn.Run(ctxOld, count) }()
	poll.Eventually(t, 2*time.Minute, "old installer ready", oldIn.VerifyInstalled)
	ctxNew, stopNew := context.WithCancel(context.Background())
	defer stopNew()
	doneNew := make(chan struct{})
	go func() { defer close(doneNew); newIn.Run(ctxNew, count) }()
	poll.Eventually(t, 2*time.Minute, "new installer ready", newIn.VerifyInstalled)

	// Both run for a while (many resyncs and rechecks): the token stays put.
	time.Sleep(time.Second)
	mu.Lock()
	before := writes
	mu.Unlock()
	time.Sleep(time.Second)
	mu.Lock()
	during := writes - before
	mu.Unlock()
	if during != 0 {
		t.Errorf("the token file was written %d times in 1s while both installers ran", during)
	}
	tokPath := filepath.Join(n.net, cniconf.TokenFileName)
	if b, _ := os.ReadFile(tokPath); string(b) != oldTok {
		t.Fatalf("while both run, the later-expiring token should stay")
	}

	// The old pod is deleted (SIGTERM: its installer stops, the API marks
	// it terminating).
	oldAlive.Store(false)
	stopOld()
	<-doneOld
	poll.Eventually(t, 2*time.Minute, "the new pod's token in place", func() error {
		if b, _ := os.ReadFile(tokPath); string(b) != newTok {
			return errors.New("still the old token")
		}
		return nil
	})
	if err := newIn.VerifyInstalled(); err != nil {
		t.Fatal(err)
	}
	stopNew()
	<-doneNew
}
