package install

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/conflist/conflisttest"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/credentials"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/credentials/credentialstest"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
)

// Two installers on one node, as during a rolling update with maxSurge:
// the token file must not flip back and forth while both run, and must hold
// the new pod's token soon after the old pod starts terminating.
func TestRollingUpdateTokenHandover(t *testing.T) {
	n := newHostDirs(t)
	conflisttest.WriteFiles(t, n.net, map[string]string{"10-kindnet.conflist": conflisttest.Kindnet})
	exp := time.Now().Add(time.Hour)
	oldTok := credentialstest.PodToken("consul-cni-old", "uid-old", exp.Add(10*time.Minute)) // rotated: expires later
	newTok := credentialstest.PodToken("consul-cni-new", "uid-new", exp)
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
			c.Client = &credentials.Source{Server: "https://10.96.0.1:443", TokenFile: tokenFile}
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
