package simnode

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os/exec"
	"strings"
	"sync"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

// The control plane listens on the host's loopback, which a pod's network
// namespace cannot reach. Each node therefore owns its NodeIP on the host's
// loopback device (the ptp gateway of its pods, so pods reach it by their
// default route) and forwards a port on it to the apiserver: the node-local
// API endpoint written into the kubeconfigs containers get.
type apiProxy struct {
	l      net.Listener
	target string
	wg     sync.WaitGroup
	addr   netip.Addr
	added  bool
}

func startAPIProxy(nodeIP netip.Addr, apiHost string) (*apiProxy, error) {
	u, err := url.Parse(apiHost)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("apiserver URL %q: %v", apiHost, err)
	}
	p := &apiProxy{target: u.Host, addr: nodeIP}
	if !nodeIP.IsLoopback() {
		out, err := exec.Command("ip", "addr", "add", nodeIP.String()+"/32", "dev", "lo").CombinedOutput()
		if err != nil && !strings.Contains(string(out), "File exists") {
			return nil, fmt.Errorf("node IP %s on lo: %v: %s", nodeIP, err, strings.TrimSpace(string(out)))
		}
		p.added = err == nil
	}
	p.l, err = net.Listen("tcp", netip.AddrPortFrom(nodeIP, 0).String())
	if err != nil {
		p.removeAddr()
		return nil, err
	}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

func (p *apiProxy) removeAddr() {
	if p.added {
		_ = exec.Command("ip", "addr", "del", p.addr.String()+"/32", "dev", "lo").Run()
	}
}

// URL is the node-local API endpoint.
func (p *apiProxy) URL() string { return "https://" + p.l.Addr().String() }

func (p *apiProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		go testnet.Relay(c, p.target)
	}
}

func (p *apiProxy) close() {
	p.l.Close()
	p.wg.Wait()
	p.removeAddr()
}
