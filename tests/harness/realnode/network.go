package realnode

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

// netnsFile in the node's directory names its network namespace, for the
// sweep of a killed run.
const netnsFile = "netns"

// setupNetwork makes the node's network namespace, linked to the slot's
// router like every namespace of the harness (testnet.Range.Link: eth0, the
// default routes, forwarding on inside the node, the node's subnet routed to
// it), with the node IP on eth0 and the apiserver forwarded at
// cluster.KubernetesServiceIP:443. Nothing changes in the host's namespace.
func (n *Node) setupNetwork(r *testnet.Range) error {
	n.netnsName = r.NetnsName("node")
	n.Netns = filepath.Join("/run/netns", n.netnsName)
	if err := os.WriteFile(filepath.Join(n.Dir, netnsFile), []byte(n.netnsName), 0o644); err != nil {
		return err
	}
	if err := ipCmd("netns", "add", n.netnsName); err != nil {
		return err
	}
	if err := r.Link(n.netnsName, n.Subnet); err != nil {
		return err
	}
	ns := n.netnsName
	for _, s := range [][]string{
		{"-n", ns, "addr", "add", n.IP.String() + "/32", "dev", "eth0"},
		{"-n", ns, "addr", "add", cluster.KubernetesServiceIP.String() + "/32", "dev", "lo"},
	} {
		if err := ipCmd(s...); err != nil {
			return err
		}
	}
	api, err := startAPIForward(n.Netns, n.c.Server)
	if err != nil {
		return err
	}
	n.api = api
	return nil
}

// removeNetwork deletes the node's namespace (its link to the router and the
// router's route to it go with it).
func removeNetwork(dir string) {
	b, err := os.ReadFile(filepath.Join(dir, netnsFile))
	if err == nil && len(b) > 0 {
		_ = ipCmd("netns", "del", strings.TrimSpace(string(b)))
	}
}

func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// apiForward accepts connections at cluster.KubernetesServiceIP:443 in a node's
// namespace and relays them to the apiserver on the host's loopback.
type apiForward struct {
	l      net.Listener
	target string
	wg     sync.WaitGroup
}

func startAPIForward(netnsPath, server string) (*apiForward, error) {
	u, err := url.Parse(server)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("apiserver URL %q: %v", server, err)
	}
	f := &apiForward{target: u.Host}
	err = testnet.DoIn(netnsPath, func() (err error) {
		f.l, err = net.Listen("tcp", netip.AddrPortFrom(cluster.KubernetesServiceIP, 443).String())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("apiserver forward in %s: %w", netnsPath, err)
	}
	f.wg.Add(1)
	go f.serve()
	return f, nil
}

func (f *apiForward) serve() {
	defer f.wg.Done()
	for {
		c, err := f.l.Accept()
		if err != nil {
			return
		}
		go testnet.Relay(c, f.target) // dials in the host's namespace: serve never entered another
	}
}

func (f *apiForward) close() {
	f.l.Close()
	f.wg.Wait()
}

// APIServerURL is the apiserver as seen from inside the node (kubelet's
// kubeconfig, in-cluster clients).
func APIServerURL() string {
	return "https://" + netip.AddrPortFrom(cluster.KubernetesServiceIP, 443).String()
}
