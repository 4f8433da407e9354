package simnode

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"sync"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

// The control plane listens on the host's loopback, which a pod's network
// namespace cannot reach. Each node therefore listens at its NodeIP in its
// own network namespace (the ptp gateway of its pods, so pods reach it by
// their default route) and relays to the apiserver from the host's
// namespace: the node-local API endpoint written into the kubeconfigs
// containers get. It also listens at the kubernetes Service's address, port
// 443 (the address the apiserver's certificate names, as kube-proxy makes
// it reachable), for programs that write a kubeconfig from
// KUBERNETES_SERVICE_HOST and _PORT.
type apiProxy struct {
	l, svc net.Listener
	target string
	wg     sync.WaitGroup
}

func startAPIProxy(nw *nodeNetwork, nodeIP netip.Addr, apiHost string) (*apiProxy, error) {
	u, err := url.Parse(apiHost)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("apiserver URL %q: %v", apiHost, err)
	}
	p := &apiProxy{target: u.Host}
	if p.l, err = nw.listen(netip.AddrPortFrom(nodeIP, 0).String()); err != nil {
		return nil, err
	}
	if p.svc, err = nw.listen(netip.AddrPortFrom(cluster.KubernetesServiceIP, 443).String()); err != nil {
		p.l.Close()
		return nil, err
	}
	p.wg.Add(2)
	go p.serve(p.l)
	go p.serve(p.svc)
	return p, nil
}

// URL is the node-local API endpoint.
func (p *apiProxy) URL() string { return "https://" + p.l.Addr().String() }

// ServiceURL is the API endpoint at the kubernetes Service's address.
func (p *apiProxy) ServiceURL() string { return "https://" + p.svc.Addr().String() }

func (p *apiProxy) serve(l net.Listener) {
	defer p.wg.Done()
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go testnet.Relay(c, p.target) // dials in the host's namespace: serve never entered another
	}
}

func (p *apiProxy) close() {
	p.l.Close()
	p.svc.Close()
	p.wg.Wait()
}
