// Package scenario reproduces the race this project exists for, on the
// local control plane with simulated nodes, and measures it by traffic:
// a node joins with only the primary network in its CNI configuration, a
// Deployment of pods injected the way consul-k8s's webhook injects them lands
// on it, and consul-cni is chained on that node only later. Every pod runs a
// prober that keeps opening TCP connections to a service in the "external"
// namespace: a reply from the pod's own outbound proxy listener (15001)
// means the connection was redirected (meshed), a reply from the external
// service itself means it bypassed the mesh. The external service also
// records who reached it, as a second witness.
//
// Runs: no-repair (the plugin arrives, nothing else happens), repair (the
// repair controller runs) and prevention (the node joins with the startup
// taint; the CNI DaemonSet and the controller's node readiness decide when
// pods may land). Used by the e2e tests (tests/suites/scenario) and by
// `make demo`.
package scenario

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

// TB is what the environment needs from a test or a command
// (tests/harness/lifecycle.Env).
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Cleanup(func())
}

// Binaries are the executables the scenario runs. Repair and Installer are
// empty when the tree does not have those commands.
type Binaries struct {
	PodProg, ConsulCNI, Installer, Check, Repair, Verifier string
	// CNIPlugins is the directory of the reference plugins.
	CNIPlugins string
}

// Env is what the runs share: the control plane, the test's address slot,
// the external namespace and its service, the binaries.
type Env struct {
	Cluster  *cluster.Cluster
	Range    *testnet.Range
	External *testnet.External
	// Service is the external service's address the probers dial.
	Service netip.AddrPort
	Bins    Binaries
	// Manifests is the repository's manifests/ directory.
	Manifests string
	// Logf receives progress and the nodes' logs. Default: none.
	Logf func(format string, args ...any)
	// Nodes starts the runs' nodes. Default: simulated nodes (SimNodes).
	Nodes Nodes

	ext *externalService
}

// ExternalPort is the external service's port.
const ExternalPort = 8080

// NewEnv reserves the address slot, creates the external namespace with a
// service answering "external", and builds the binaries.
func NewEnv(tb TB, c *cluster.Cluster) *Env {
	tb.Helper()
	r := testnet.Reserve(tb)
	ext := r.NewExternal(tb)
	e := &Env{Cluster: c, Range: r, External: ext, Service: netip.AddrPortFrom(ext.V4, ExternalPort),
		Manifests: filepath.Join(testbin.RepoRoot(), "manifests"), Logf: func(string, ...any) {}}
	e.Nodes = &SimNodes{e: e}
	l, err := ext.Listen("tcp", e.Service.String())
	if err != nil {
		tb.Fatalf("external service: %v", err)
	}
	e.ext = newExternalService(l)
	tb.Cleanup(e.ext.close)

	e.Bins.PodProg = testbin.Package(tb, "podprog", "./tests/cmd/podprog")
	e.Bins.CNIPlugins = testbin.CNIPluginDir(tb)
	e.Bins.ConsulCNI = testbin.Project(tb, "consul-cni")
	if has("consul-cni-installer") {
		e.Bins.Installer = testbin.Project(tb, "consul-cni-installer")
	}
	if has("consul-cni-check") {
		e.Bins.Check = testbin.Project(tb, "consul-cni-check")
	}
	if has("repair") {
		e.Bins.Repair = testbin.Project(tb, "repair")
	}
	if has("consul-cni-verifier") {
		e.Bins.Verifier = testbin.Project(tb, "consul-cni-verifier")
	}
	return e
}

// NodesEnv chooses the kind of node the runs use when the caller does not:
// "real" or "simnode" (DefaultNodes when unset).
const NodesEnv = "CCR_NODES"

// DefaultNodes is the kind of node the runs use by default.
const DefaultNodes = "real"

// NodeKinds are the kinds UseNodes knows.
var NodeKinds = []string{"real", "simnode"}

// NodesFromEnv is $CCR_NODES, else DefaultNodes.
func NodesFromEnv() string {
	if k := os.Getenv(NodesEnv); k != "" {
		return k
	}
	return DefaultNodes
}

// UseNodes makes the runs use nodes of kind, building what they need.
func (e *Env) UseNodes(tb TB, kind string) error {
	tb.Helper()
	switch kind {
	case "simnode":
		e.Nodes = &SimNodes{e: e}
		return nil
	case "real":
		rn, err := NewRealNodes(tb, e)
		if err != nil {
			return err
		}
		e.Nodes = rn
		return nil
	}
	return fmt.Errorf("node kind %q: not one of %s", kind, strings.Join(NodeKinds, ", "))
}

func has(cmd string) bool {
	_, err := os.Stat(filepath.Join(testbin.RepoRoot(), "cmd", cmd))
	return err == nil
}

// Supports reports whether the tree has what a mode needs, and what is
// missing otherwise.
func (e *Env) Supports(m Mode) error {
	switch m {
	case NoRepair:
		return nil
	case Repair, Prevention, SandboxRecreated, NodeReboot:
		var missing []string
		if e.Bins.Repair == "" {
			missing = append(missing, "cmd/repair")
		}
		if e.Bins.Installer == "" {
			missing = append(missing, "cmd/consul-cni-installer")
		}
		if _, err := os.Stat(filepath.Join(e.Manifests, "base", "cni", "daemonset.yaml")); err != nil {
			missing = append(missing, "manifests/base/cni")
		}
		if len(missing) > 0 {
			return fmt.Errorf("the %s run needs %s", m, strings.Join(missing, ", "))
		}
		return nil
	}
	return fmt.Errorf("unknown mode %q", m)
}

// externalService answers "external" and records the source address of
// every connection.
type externalService struct {
	l    net.Listener
	mu   sync.Mutex
	seen map[netip.Addr][]time.Time
	wg   sync.WaitGroup
}

func newExternalService(l net.Listener) *externalService {
	s := &externalService{l: l, seen: map[netip.Addr][]time.Time{}}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil {
				s.mu.Lock()
				s.seen[ap.Addr().Unmap()] = append(s.seen[ap.Addr().Unmap()], time.Now())
				s.mu.Unlock()
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				w := bufio.NewWriter(c)
				w.WriteString("external\n")
				w.Flush()
			}()
		}
	}()
	return s
}

// Connections returns how many connections from addr reached the external
// service at or after since.
func (e *Env) Connections(addr netip.Addr, since time.Time) int {
	e.ext.mu.Lock()
	defer e.ext.mu.Unlock()
	n := 0
	for _, t := range e.ext.seen[addr] {
		if !t.Before(since) {
			n++
		}
	}
	return n
}

func (s *externalService) close() {
	s.l.Close()
	s.wg.Wait()
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
