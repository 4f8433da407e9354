// Package registry runs a real OCI registry for tests: Debian's
// docker-registry (distribution 2.8) on a loopback port of the host, with
// its storage in the test's temporary directory, spoken to over plain HTTP
// (as go-containerregistry, helm --plain-http and containerd do for a
// loopback registry). Forward makes it reachable at the same address from
// inside another network namespace (a real node's containerd pulls from
// there), the way realnode forwards the apiserver.
package registry

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/proc"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

// Command is the registry's program (package docker-registry; `make
// registry-bin` installs it).
const Command = "docker-registry"

// Registry is a running registry.
type Registry struct {
	// Host is its address, 127.0.0.1:<port>: the registry part of image
	// references and of oci:// chart references.
	Host string
	// Storage is its storage directory.
	Storage string
	p       *proc.Process
	log     string
}

const config = `version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
http:
  addr: %s
`

// Start runs a registry for the test, stopped at its end.
func Start(t testing.TB) *Registry {
	t.Helper()
	bin, err := exec.LookPath(Command)
	if err != nil {
		t.Fatalf("%s not found (make registry-bin installs Debian's docker-registry): %v", Command, err)
	}
	port, err := testnet.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	r := &Registry{Host: "127.0.0.1:" + strconv.Itoa(port), Storage: filepath.Join(dir, "storage"), log: filepath.Join(dir, "registry.log")}
	cfg := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(config, r.Storage, r.Host)), 0o644); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(r.log)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(bin, "serve", cfg)
	cmd.Stdout, cmd.Stderr = logf, logf
	if r.p, err = proc.Start(cmd, ""); err != nil {
		t.Fatalf("start %s: %v", Command, err)
	}
	t.Cleanup(func() { r.p.Stop(5 * time.Second) })
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + r.Host + "/v2/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return r
			}
		}
		select {
		case <-r.p.Done():
			t.Fatalf("%s exited: %v\n%s", Command, r.p.Err(), r.Log())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not serving on %s: %v\n%s", Command, r.Host, err, r.Log())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Log returns what the registry logged.
func (r *Registry) Log() string {
	b, _ := os.ReadFile(r.log)
	return string(b)
}

// Forward makes the registry reachable at r.Host inside the network
// namespace netnsPath (its own loopback), relaying each connection to the
// registry on the host's loopback, until the test ends.
func (r *Registry) Forward(t testing.TB, netnsPath string) {
	t.Helper()
	r.forward(t, netnsPath, testnet.Relay)
}

// forward listens at r.Host inside the network namespace netnsPath and
// hands each connection to relay with the registry's address (relay dials
// from the host's namespace), until the test ends.
func (r *Registry) forward(t testing.TB, netnsPath string, relay func(c net.Conn, target string)) {
	t.Helper()
	var l net.Listener
	err := testnet.DoIn(netnsPath, func() (err error) {
		l, err = net.Listen("tcp", r.Host)
		return err
	})
	if err != nil {
		t.Fatalf("registry forward in %s: %v", netnsPath, err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go relay(c, r.Host)
		}
	}()
	t.Cleanup(func() {
		l.Close()
		wg.Wait()
	})
}
