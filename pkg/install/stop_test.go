package install

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/conflist/conflisttest"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/leave"
)

// runAndStop runs the installer until its first pass, then cancels it
// (SIGTERM) and waits until Run returned.
func runAndStop(t *testing.T, in *Installer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	passed := make(chan struct{}, 1)
	done := make(chan error)
	go func() {
		done <- in.Run(ctx, func(PassResult, error) {
			select {
			case passed <- struct{}{}:
			default:
			}
		})
	}()
	<-passed
	if left, why := cniconf.ProductLeft(in.cfg.BinDir, time.Now().Add(cniconf.LeftAfter/2)); left {
		t.Errorf("a running installer's node taken for one the product left: %s", why)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// On SIGTERM the installer leaves (removes everything, entries first) only
// when the API says no installer pod will come back; staying and an API
// that cannot say keep everything, and the state file tells the plugin
// whether refused credentials may pass pods through.
func TestStopDecidesFromTheAPI(t *testing.T) {
	later := time.Now().Add(cniconf.LeftAfter + time.Second)
	for _, tc := range []struct {
		name     string
		decision leave.Decision
		err      error
		removed  bool
		leftLate bool // ProductLeft once the heartbeat is LeftAfter old
	}{
		{"leaving", leave.Decision{Leaving: true, Why: "DaemonSet ccr/consul-cni is gone"}, nil, true, false},
		{"staying", leave.Decision{Why: "DaemonSet ccr/consul-cni still targets node n1"}, nil, false, false},
		{"API unavailable", leave.Decision{}, apierrors.NewServiceUnavailable("etcd"), false, false},
		{"own credentials refused", leave.Decision{}, apierrors.NewUnauthorized("token of a deleted ServiceAccount"), false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newHostDirs(t)
			conflisttest.WriteFiles(t, n.net, map[string]string{"10-kindnet.conflist": conflisttest.Kindnet})
			asked := 0
			in := n.installer(t, func(c *Config) {
				c.Decide = func(ctx context.Context) (leave.Decision, error) {
					asked++
					if _, ok := ctx.Deadline(); !ok || ctx.Err() != nil {
						t.Errorf("decision without a live, bounded context: %v", ctx.Err())
					}
					return tc.decision, tc.err
				}
			})
			runAndStop(t, in)
			if asked != 1 {
				t.Fatalf("asked the API %d times", asked)
			}
			left, err := in.Leftovers()
			if err != nil {
				t.Fatal(err)
			}
			if tc.removed {
				if len(left) != 0 {
					t.Fatalf("left the node but kept %v", left)
				}
				return
			}
			if err := in.VerifyInstalled(); err != nil {
				t.Fatalf("kept the installation but it is broken: %v", err)
			}
			if got, why := cniconf.ProductLeft(n.bin, later); got != tc.leftLate {
				t.Fatalf("ProductLeft after LeftAfter = %v (%s), want %v", got, why, tc.leftLate)
			}
		})
	}
}
