//go:build integration

package repair_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/proc"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
)

// Leader election timing of the replicas in these tests (the flags'
// defaults are 15s/10s/2s).
const (
	leaseDuration = 4 * time.Second
	renewDeadline = 3 * time.Second
	retryPeriod   = 500 * time.Millisecond
	// exitBound bounds the wait for a replica that lost its lease to exit.
	// It is not the promise under test (renew deadline plus a few seconds,
	// logged as measured) but a bound far from it: a replica that hangs
	// never exits at all.
	exitBound = renewDeadline + time.Minute
)

// replica is the repair command run as a process, as a Deployment's
// replica would be: the controller's ServiceAccount and RBAC from the
// manifests, leader election on the Lease of ns.
type replica struct {
	name            string
	args            []string
	p               *proc.Process
	exitAt          chan time.Time // receives when p exited
	log             string
	health, metrics string
}

func loopbackAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// replicaKubeconfig installs the controller's RBAC (evict) in c for ns and
// writes a kubeconfig holding its ServiceAccount's token.
func replicaKubeconfig(t testing.TB, c *cluster.Cluster, ns string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "repair.kubeconfig")
	if err := cluster.WriteKubeconfig(path, controllerConfig(t, c, ns, judge.ActionEvict), "consul-cni-repair"); err != nil {
		t.Fatal(err)
	}
	return path
}

// startReplica runs the repair binary and waits until its caches synced.
func startReplica(t testing.TB, kubeconfig, ns, name string) *replica {
	t.Helper()
	r := &replica{name: name, health: loopbackAddr(t), metrics: loopbackAddr(t)}
	r.args = []string{
		"--kubeconfig=" + kubeconfig,
		"--leader-election-namespace=" + ns,
		"--leader-election-lease-duration=" + leaseDuration.String(),
		"--leader-election-renew-deadline=" + renewDeadline.String(),
		"--leader-election-retry-period=" + retryPeriod.String(),
		"--injected-pod-selector=" + annotations.KeyInjectStatus + "=" + annotations.InjectStatusInjected + "," + testLabel + "=" + ns,
		"--node-readiness=false", "--min-pod-age=1s", "--backoff-base=200ms", "--backoff-max=2s",
		"--metrics-bind-address=" + r.metrics, "--health-probe-bind-address=" + r.health,
	}
	r.start(t)
	return r
}

func (r *replica) start(t testing.TB) {
	t.Helper()
	bin := testbin.Project(t, "repair")
	f, err := os.CreateTemp(t.TempDir(), r.name+"-*.log")
	if err != nil {
		t.Fatal(err)
	}
	r.log = f.Name()
	cmd := exec.Command(bin, r.args...)
	cmd.Stdout, cmd.Stderr = f, f
	p, err := proc.Start(cmd, "")
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	r.p, r.exitAt = p, make(chan time.Time, 1)
	go func() {
		<-p.Done()
		r.exitAt <- time.Now()
	}()
	t.Cleanup(func() {
		p.Stop(30 * time.Second)
		if t.Failed() {
			b, _ := os.ReadFile(r.log)
			t.Logf("--- %s log:\n%s", r.name, tail(string(b), 40))
		}
	})
	poll.Eventually(t, waitTimeout, r.name+" /readyz", func() (bool, error) {
		if r.exited() {
			return false, fmt.Errorf("%s exited: %v", r.name, r.p.Err())
		}
		return r.status("/readyz") == http.StatusOK, nil
	})
}

// restart runs the replica again after it exited, as kubelet would.
func (r *replica) restart(t testing.TB) {
	t.Helper()
	r.start(t)
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func (r *replica) exited() bool {
	select {
	case <-r.p.Done():
		return true
	default:
		return false
	}
}

var probeClient = &http.Client{Timeout: 2 * time.Second}

// status is the HTTP status of path on the health address, 0 when nothing
// answers.
func (r *replica) status(path string) int {
	resp, err := probeClient.Get("http://" + r.health + path)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// leading reads consul_cni_repair_leader from /metrics.
func (r *replica) leading() bool {
	resp, err := probeClient.Get("http://" + r.metrics + "/metrics")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == "consul_cni_repair_leader" {
			v, _ := strconv.ParseFloat(f[1], 64)
			return v == 1
		}
	}
	return false
}

// healthWatch polls a replica's /healthz until it exits.
type healthWatch struct {
	mu    sync.Mutex
	codes []int
	done  chan struct{}
}

func watchHealth(r *replica) *healthWatch {
	w := &healthWatch{done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for !r.exited() {
			c := r.status("/healthz")
			w.mu.Lock()
			if n := len(w.codes); n == 0 || w.codes[n-1] != c {
				w.codes = append(w.codes, c)
			}
			w.mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	}()
	return w
}

// check asserts that once /healthz stopped answering 200 it never did
// again (it fails from the loss until the exit, then nothing answers).
func (w *healthWatch) check(t *testing.T, name string) {
	t.Helper()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	failed := false
	for _, c := range w.codes {
		if c != http.StatusOK {
			failed = true
		} else if failed {
			t.Fatalf("%s: /healthz answered 200 again after failing (sequence %v)", name, w.codes)
		}
	}
	t.Logf("%s: /healthz sequence until exit: %v (0 = no answer)", name, w.codes)
}

// waitExit waits for r to exit and asserts code 1 and the log's reason.
func waitExit(t *testing.T, r *replica, since time.Time) {
	t.Helper()
	var at time.Time
	select {
	case at = <-r.exitAt:
	case <-time.After(exitBound):
		t.Fatalf("%s still runs %s after losing its lease", r.name, exitBound)
	}
	code, sig := r.p.ExitCode()
	t.Logf("%s exited with code %d %s after the lease was taken or the API stopped (renew deadline %s)",
		r.name, code, at.Sub(since).Round(10*time.Millisecond), renewDeadline)
	if code != 1 {
		t.Fatalf("%s exit code %d (signal %v), want 1", r.name, code, sig)
	}
	b, _ := os.ReadFile(r.log)
	if !strings.Contains(string(b), "Lease lost") {
		t.Fatalf("%s's log does not say the lease was lost:\n%s", r.name, tail(string(b), 20))
	}
}

// leaderOf waits until exactly one of rs leads and returns it and the others.
func leaderOf(t *testing.T, rs ...*replica) (*replica, []*replica) {
	t.Helper()
	var leader *replica
	var others []*replica
	poll.Eventually(t, waitTimeout, "exactly one leader", func() (bool, error) {
		leader, others = nil, nil
		for _, r := range rs {
			if r.leading() {
				if leader != nil {
					return false, nil
				}
				leader = r
			} else {
				others = append(others, r)
			}
		}
		return leader != nil, nil
	})
	return leader, others
}

// stealLease makes another holder own the Lease for d, as a competing
// replica would.
func stealLease(t *testing.T, client kubernetes.Interface, ns string, d time.Duration) time.Time {
	t.Helper()
	ctx := context.Background()
	// The leader renews the same object meanwhile: read it again on a
	// conflict, as any writer of a Lease must.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		l, err := client.CoordinationV1().Leases(ns).Get(ctx, repair.Component, metav1.GetOptions{})
		if err != nil {
			return err
		}
		thief, secs, now := "thief", int32(d/time.Second), metav1.NewMicroTime(time.Now())
		l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.RenewTime, l.Spec.AcquireTime = &thief, &secs, &now, &now
		_, err = client.CoordinationV1().Leases(ns).Update(ctx, l, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return time.Now()
}

// repairsAfterTakeover asserts that a pod of the ReplicaSet web broken now
// is evicted (by the leader: only it acts) and replaced.
func repairsAfterTakeover(t *testing.T, c *cluster.Cluster, ns string) {
	t.Helper()
	pods := podsOf(t, c.Client, ns, "web")
	if len(pods) == 0 {
		t.Fatal("no pod of web")
	}
	p := markBroken(t, c.Client, &pods[0])
	replaced(t, c.Client, ns, "web", p.UID, len(pods))
}

// A stolen lease ends the leader's process (code 1, /healthz failing from
// the loss until the exit); the standby takes over once the lease expires
// and repairs a pod broken afterwards; the restarted replica is a healthy
// standby.
func TestIntegrationLeaseStolenEndsProcess(t *testing.T) {
	c := cluster.Shared(t)
	ns := c.Namespace(t)
	node := createNode(t, c, true)
	replicaSet(t, c, ns, "web", node, 2)
	kc := replicaKubeconfig(t, c, ns)
	a := startReplica(t, kc, ns, "replica-a")
	leaderOf(t, a)
	b := startReplica(t, kc, ns, "replica-b")
	if leader, _ := leaderOf(t, a, b); leader != a {
		t.Fatal("the first replica lost the lease on its own")
	}

	w := watchHealth(a)
	stolen := stealLease(t, c.Client, ns, 2*leaseDuration)
	waitExit(t, a, stolen)
	w.check(t, a.name)
	if b.exited() {
		t.Fatalf("the standby exited: %v", b.p.Err())
	}

	poll.Eventually(t, waitTimeout, "the standby to lead", func() (bool, error) { return b.leading(), nil })
	repairsAfterTakeover(t, c, ns)

	a.restart(t)
	if leader, _ := leaderOf(t, a, b); leader != b || a.status("/healthz") != http.StatusOK {
		t.Fatal("the restarted replica is not a healthy standby")
	}
}

// An API outage longer than the renew deadline ends the leader's process
// (code 1, /healthz failing until the exit) while the standby keeps running
// and stays healthy; once the apiserver is back, the standby takes over and
// repairs, and the restarted replica is a healthy standby.
func TestIntegrationAPIOutageEndsLeaderProcess(t *testing.T) {
	// The outage must not hit the other tests' shared control plane.
	ctx := context.Background()
	c, err := cluster.Start(ctx, cluster.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	ns := c.Namespace(t)
	node := createNode(t, c, true)
	replicaSet(t, c, ns, "web", node, 2)
	kc := replicaKubeconfig(t, c, ns)
	a := startReplica(t, kc, ns, "replica-a")
	b := startReplica(t, kc, ns, "replica-b")
	leader, others := leaderOf(t, a, b)
	standby := others[0]

	w := watchHealth(leader)
	down := time.Now()
	c.StopAPIServer() // returns once kube-apiserver ended its graceful termination
	t.Logf("kube-apiserver stopped in %s", time.Since(down).Round(10*time.Millisecond))
	waitExit(t, leader, down)
	w.check(t, leader.name)
	// Down for longer than the renew deadline (and the lease) in any case.
	if d := time.Until(down.Add(leaseDuration + renewDeadline)); d > 0 {
		time.Sleep(d)
	}
	if standby.exited() {
		t.Fatalf("the standby exited during the outage: %v", standby.p.Err())
	}
	if s := standby.status("/healthz"); s != http.StatusOK {
		t.Fatalf("the standby's /healthz = %d during the outage, want 200", s)
	}
	if err := c.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("apiserver down for %s", time.Since(down).Round(100*time.Millisecond))

	poll.Eventually(t, waitTimeout, "the standby to lead", func() (bool, error) { return standby.leading(), nil })
	repairsAfterTakeover(t, c, ns)
	leader.restart(t)
	if l, _ := leaderOf(t, a, b); l != standby || leader.status("/healthz") != http.StatusOK {
		t.Fatal("the restarted replica is not a healthy standby")
	}
}
