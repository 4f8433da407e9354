package simnode

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

// nodeNetwork is the node's own network namespace, linked to the test slot's
// router like a real node's (testnet.Range.Link) with the pod subnet routed to
// it. The node's CNI plugins run in it (ptp's host ends of the pods' veths,
// its routes and forwarding switch are the node's, not the host's), and so do
// hostNetwork containers, the probes, and the node-local endpoints (API proxy,
// kubelet API) at NodeIP on its loopback; the API proxy also at the
// kubernetes Service's address (cluster.KubernetesServiceIP). Nothing changes in the host's
// namespace.
type nodeNetwork struct {
	name, path string
}

func startNetwork(r *testnet.Range, subnet netip.Prefix, nodeIP netip.Addr) (*nodeNetwork, error) {
	name := r.NetnsName("node")
	nw := &nodeNetwork{name: name, path: filepath.Join("/run/netns", name)}
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("node network namespace %s: %v: %s", name, err, strings.TrimSpace(string(out)))
	}
	if err := r.Link(name, subnet); err != nil {
		nw.remove()
		return nil, err
	}
	for _, ip := range []netip.Addr{nodeIP, cluster.KubernetesServiceIP} {
		if out, err := exec.Command("ip", "-n", name, "addr", "add", ip.String()+"/32", "dev", "lo").CombinedOutput(); err != nil {
			nw.remove()
			return nil, fmt.Errorf("address %s in %s: %v: %s", ip, name, err, strings.TrimSpace(string(out)))
		}
	}
	return nw, nil
}

// listen opens a TCP listener inside the node's namespace.
func (nw *nodeNetwork) listen(addr string) (l net.Listener, err error) {
	err = testnet.DoIn(nw.path, func() error {
		l, err = net.Listen("tcp", addr)
		return err
	})
	return l, err
}

// dial connects from inside the node's namespace, as kubelet's probes do.
func (nw *nodeNetwork) dial(ctx context.Context, network, addr string) (c net.Conn, err error) {
	err = testnet.DoIn(nw.path, func() error {
		var d net.Dialer
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// remove deletes the namespace (its link to the router and the router's
// route to the pod subnet go with it).
func (nw *nodeNetwork) remove() {
	_ = exec.Command("ip", "netns", "del", nw.name).Run()
}
