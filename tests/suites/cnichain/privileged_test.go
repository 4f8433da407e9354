//go:build privileged

package cnichain_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/iptables"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/iptables/iptablestest"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cnichain"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/sdkoracle"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

var subnetIndex atomic.Int32

// podSubnets returns a fresh pod subnet pair inside the test's slot: /25s
// below the 15th /24 (NewExternal's services).
func podSubnets(r *testnet.Range) (netip.Prefix, netip.Prefix) {
	i := int(subnetIndex.Add(1))
	if i > 27 {
		panic("out of pod subnets")
	}
	return r.Subnet4(i, 25), r.Subnet6(i)
}

var (
	probeOnce sync.Once
	probeBin  string
)

// netprobe returns the probe binary in a directory every UID can read, so
// it runs after nsenter --setuid.
func netprobe(t *testing.T) string {
	t.Helper()
	built := testbin.Package(t, "netprobe", "./tests/cmd/netprobe")
	probeOnce.Do(func() {
		dir, err := os.MkdirTemp("", "ccr-netprobe-")
		if err != nil {
			t.Fatal(err)
		}
		os.Chmod(dir, 0o755)
		b, err := os.ReadFile(built)
		if err != nil {
			t.Fatal(err)
		}
		probeBin = filepath.Join(dir, "netprobe")
		if err := os.WriteFile(probeBin, b, 0o755); err != nil {
			t.Fatal(err)
		}
	})
	return probeBin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if probeBin != "" {
		os.RemoveAll(filepath.Dir(probeBin))
	}
	os.Exit(code)
}

// serve answers every TCP connection with the name, and every datagram.
func serveTCP(t *testing.T, l net.Listener, name string) {
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, name+"\n")
			c.Close()
		}
	}()
}

func serveUDP(t *testing.T, pc net.PacketConn, name string) {
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 512)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo([]byte(name), from)
		}
	}()
}

type listenerNS interface {
	Listen(network, addr string) (net.Listener, error)
	ListenPacket(network, addr string) (net.PacketConn, error)
}

func listen(t *testing.T, ns listenerNS, network, addr, name string) {
	t.Helper()
	if network == "udp" {
		pc, err := ns.ListenPacket("udp", addr)
		if err != nil {
			t.Fatalf("listen udp %s: %v", addr, err)
		}
		serveUDP(t, pc, name)
		return
	}
	l, err := ns.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen tcp %s: %v", addr, err)
	}
	serveTCP(t, l, name)
}

// probe connects from inside the pod as uid and returns the name of the
// listener that answered. Dial errors are retried for a while (IPv6
// addresses may still be tentative right after ADD).
func probe(t *testing.T, ns *testnet.Netns, uid int, network, addr string) (string, error) {
	t.Helper()
	bin := netprobe(t)
	deadline := time.Now().Add(20 * time.Second)
	for {
		var stderr strings.Builder
		cmd := ns.Command(uid, bin, network, addr)
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err == nil {
			return strings.TrimSpace(string(out)), nil
		}
		err = fmt.Errorf("%v: %s", err, strings.TrimSpace(stderr.String()))
		if time.Now().After(deadline) {
			return "", err
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// dialFrom connects from another namespace (inbound traffic).
func dialFrom(t *testing.T, ns *testnet.Netns, addr string) (string, error) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, err := ns.DialRead(addr, 5*time.Second)
		if err == nil || time.Now().After(deadline) {
			return got, err
		}
		time.Sleep(300 * time.Millisecond)
	}
}

type expect struct {
	uid           int // -1: inbound from the external namespace
	network, addr string
	want          string // listener name; "" means the probe must fail
}

func (e expect) String() string {
	who := fmt.Sprintf("uid %d", e.uid)
	if e.uid < 0 {
		who = "external"
	}
	return fmt.Sprintf("%s %s %s", who, e.network, e.addr)
}

func runExpectations(t *testing.T, pod, ext *testnet.Netns, cases []expect) {
	t.Helper()
	for _, c := range cases {
		var got string
		var err error
		if c.uid < 0 {
			got, err = dialFrom(t, ext, c.addr)
		} else if c.want == "" {
			// Expected to fail: one attempt is enough.
			var out []byte
			out, err = pod.Command(c.uid, netprobe(t), c.network, c.addr).Output()
			got = strings.TrimSpace(string(out))
		} else {
			got, err = probe(t, pod, c.uid, c.network, c.addr)
		}
		switch {
		case c.want == "" && err == nil:
			t.Errorf("%s: reached %q, want no answer", c, got)
		case c.want != "" && err != nil:
			t.Errorf("%s: %v, want %q", c, err, c.want)
		case c.want != "" && got != c.want:
			t.Errorf("%s: landed on %q, want %q", c, got, c.want)
		default:
			t.Logf("%s -> %s", c, map[bool]string{true: "no answer", false: got}[c.want == ""])
		}
	}
}

func hostPort(a netip.Addr, port int) string { return netip.AddrPortFrom(a, uint16(port)).String() }

func podIP(t *testing.T, res types.Result, v6 bool) netip.Addr {
	t.Helper()
	r, err := current.GetResult(res)
	if err != nil {
		t.Fatal(err)
	}
	for _, ip := range r.IPs {
		a, _ := netip.AddrFromSlice(ip.Address.IP)
		a = a.Unmap()
		if a.Is6() == v6 {
			return a
		}
	}
	t.Fatalf("no %v address in %v", map[bool]string{true: "IPv6", false: "IPv4"}[v6], r.IPs)
	return netip.Addr{}
}

// saveNat is the normalized nat table of a namespace.
func saveNat(t *testing.T, ns *testnet.Netns, b iptables.Variant, fam redirect.Family) string {
	t.Helper()
	out, err := (&iptables.NetnsExecutor{NetNS: ns.Path, Variant: b}).Save(context.Background(), fam)
	if err != nil {
		t.Fatal(err)
	}
	return iptablestest.Normalize(out)
}

// sdkTable runs the command sequence of Consul's SDK v0.18.1 (the oracle,
// tests/harness/sdkoracle) in a fresh namespace and returns the resulting
// nat tables.
func sdkTable(t *testing.T, r *testnet.Range, b iptables.Variant, js string, dual bool) [2]string {
	t.Helper()
	ns := r.NewNetns(t, "sdk")
	for _, c := range sdkoracle.One(t, js, dual).Commands {
		tool := b.Tool(redirect.IPv4)
		if c[0] == "ip6tables" {
			tool = b.Tool(redirect.IPv6)
		}
		if out, err := exec.Command("nsenter", append([]string{"--net=" + ns.Path, "--", tool}, c[1:]...)...).CombinedOutput(); err != nil {
			t.Fatalf("%s %v: %v: %s", tool, c[1:], err, out)
		}
	}
	return [2]string{saveNat(t, ns, b, redirect.IPv4), saveNat(t, ns, b, redirect.IPv6)}
}

func backendFor(t *testing.T, name string) iptables.Variant {
	b, auto, err := iptables.ParseVariant(name)
	if err != nil {
		t.Fatal(err)
	}
	if auto {
		b, _ = iptables.VariantDetector{}.Detect(context.Background())
	}
	return b
}

func consulEntry(t *testing.T, backend string, extra map[string]any) map[string]any {
	dir := t.TempDir()
	e := map[string]any{
		cniconf.KeyCNIBinDir: "/opt/cni/bin", cniconf.KeyCNINetDir: dir, cniconf.KeyKubeconfig: cniconf.ConsulK8sKubeconfigFileName,
		cniconf.KeyLogLevel: "debug", cniconf.KeyMultus: false, "state_dir": dir, "iptables_variant": backend,
		"log_file": filepath.Join(dir, "consul-cni.log"),
	}
	for k, v := range extra {
		if v == nil {
			delete(e, k)
		} else {
			e[k] = v
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "consul-cni.log"))
			t.Logf("consul-cni log:\n%s", b)
		}
	})
	return e
}

// TestTrafficSingleStack creates pods through libcni with ptp + host-local
// (+ consul-cni) and proves with real connections where traffic lands, for
// both iptables backends. A pod created without consul-cni is the control:
// the same probes must then go straight out. The host's forwarding is off,
// as on a fresh machine: the traffic crosses only the slot's namespaces.
func TestTrafficSingleStack(t *testing.T) {
	testnet.HostForwardingOff(t)
	r := testnet.Reserve(t)
	ext := r.NewExternal(t)
	excluded := ext.AddAddress(t, false)
	listen(t, ext, "tcp", hostPort(ext.V4, 8080), "external")
	listen(t, ext, "tcp", hostPort(ext.V4, 9090), "external-9090")
	listen(t, ext, "tcp", hostPort(excluded, 8080), "external-excluded-cidr")

	cfg := fmt.Sprintf(`{"ConsulDNSIP":"127.0.0.1","ConsulDNSPort":8600,"ProxyUserID":"5995","ProxyInboundPort":20000,`+
		`"ProxyOutboundPort":15001,"ExcludeInboundPorts":["20200"],"ExcludeOutboundPorts":["9090"],`+
		`"ExcludeOutboundCIDRs":["%s/32"],"ExcludeUIDs":["5996"],"NetNS":"","IptablesProvider":null}`, excluded)

	for _, tc := range []struct {
		name, backend string
		consul        bool
	}{
		{"without consul-cni", "", false},
		{"consul-cni auto backend", "auto", true},
		{"consul-cni legacy backend", "legacy", true},
		{"consul-cni nftables backend", backendNftables, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s4, _ := podSubnets(r)
			opts := cnichain.Options{Subnet4: s4}
			if tc.consul {
				opts.Consul = entryFor(t, tc.backend)
			}
			chain := cnichain.New(t, opts)
			pod := r.NewNetns(t, "pod")
			rt := cnichain.Runtime("ctr-"+strings.ReplaceAll(tc.name, " ", "-"), pod.Path, [2]string{"CONSUL_IPTABLES_CONFIG", cfg})
			res, err := chain.Add(ctx, rt)
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			t.Cleanup(func() { chain.Del(context.Background(), rt) })
			ip := podIP(t, res, false)

			listen(t, pod, "tcp", ":15001", "outbound-listener")
			listen(t, pod, "tcp", ":20000", "inbound-listener")
			listen(t, pod, "tcp", ":8080", "app-8080")
			listen(t, pod, "tcp", ":20200", "app-20200")
			listen(t, pod, "udp", "127.0.0.1:8600", "consul-dns-udp")
			listen(t, pod, "tcp", "127.0.0.1:8600", "consul-dns-tcp")

			redirected := func(yes, no string) string {
				if tc.consul {
					return yes
				}
				return no
			}
			runExpectations(t, pod, ext.Netns, []expect{
				{1000, "tcp", hostPort(ext.V4, 8080), redirected("outbound-listener", "external")},
				{0, "tcp", hostPort(ext.V4, 8080), redirected("outbound-listener", "external")},
				{5995, "tcp", hostPort(ext.V4, 8080), "external"},                 // the proxy itself
				{5996, "tcp", hostPort(ext.V4, 8080), "external"},                 // excluded UID
				{1000, "tcp", hostPort(ext.V4, 9090), "external-9090"},            // excluded port
				{1000, "tcp", hostPort(excluded, 8080), "external-excluded-cidr"}, // excluded CIDR
				{1000, "tcp", "127.0.0.1:8080", "app-8080"},                       // loopback is not redirected
				{1000, "udp", "127.0.0.1:53", redirected("consul-dns-udp", "")},   // DNS to Consul DNS
				{1000, "tcp", "127.0.0.1:53", redirected("consul-dns-tcp", "")},
				{-1, "tcp", hostPort(ip, 8080), redirected("inbound-listener", "app-8080")},
				{-1, "tcp", hostPort(ip, 20200), "app-20200"}, // excluded inbound port
			})

			assertSingleStackTables(t, r, pod, tc.backend, cfg, tc.consul)
		})
	}
}

// assertSingleStackTables checks the pod's tables: none of ours without
// the plugin, else the nftables table or, for iptables, the nat tables the
// SDK gives for cfg.
func assertSingleStackTables(t *testing.T, r *testnet.Range, pod *testnet.Netns, backend, cfg string, consul bool) {
	t.Helper()
	if !consul {
		if got := saveNat(t, pod, iptables.VariantNFT, redirect.IPv4); strings.Contains(got, "CONSUL") {
			t.Fatalf("rules without the plugin:\n%s", got)
		}
		return
	}
	if backend == backendNftables {
		assertNftables(t, pod, cfg, false)
		return
	}
	b := backendFor(t, backend)
	want := sdkTable(t, r, b, cfg, false)
	got := [2]string{saveNat(t, pod, b, redirect.IPv4), saveNat(t, pod, b, redirect.IPv6)}
	if got != want {
		t.Errorf("pod nat tables differ from what the SDK gives\n--- pod\n%s%s--- sdk\n%s%s", got[0], got[1], want[0], want[1])
	}
}

// serveStub serves the stub at the host's address on its link to the
// slot's router: the chain's plugins run in a node namespace, from which the
// host's loopback is not reachable (a real node reaches its apiserver by a
// routable address too).
func serveStub(t testing.TB, r *testnet.Range, stub *apiStub) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(stub)
	l, err := net.Listen("tcp", netip.AddrPortFrom(r.HostAddr(), 0).String())
	if err != nil {
		t.Fatal(err)
	}
	srv.Listener.Close()
	srv.Listener = l
	srv.Start()
	return srv
}

// apiStub answers GET and merge-PATCH for pods it holds, like the API
// server does for the calls the plugin makes (the Kubernetes path itself is
// covered against a real API server by the integration tests; here it only
// carries the dual-stack annotation to the plugin).
type apiStub struct {
	mu       sync.Mutex
	pods     map[string]map[string]any
	statuses []string
}

func (s *apiStub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	if len(parts) != 6 || parts[0] != "api" || parts[2] != "namespaces" || parts[4] != "pods" {
		http.NotFound(w, r)
		return
	}
	pod, ok := s.pods[parts[3]+"/"+parts[5]]
	if !ok {
		w.WriteHeader(http.StatusNotFound)
		json.NewEncoder(w).Encode(map[string]any{"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404})
		return
	}
	if r.Method == http.MethodPatch {
		var p struct {
			Metadata struct {
				Annotations map[string]string `json:"annotations"`
			} `json:"metadata"`
		}
		if err := json.NewDecoder(r.Body).Decode(&p); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		ann := pod["metadata"].(map[string]any)["annotations"].(map[string]any)
		for k, v := range p.Metadata.Annotations {
			ann[k] = v
			if k == annotations.KeyTransparentProxyStatus {
				s.statuses = append(s.statuses, v)
			}
		}
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(pod)
}

func (s *apiStub) kubeconfig(t testing.TB, dir, server string) {
	kc := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: %s\ncontexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\nusers:\n- name: u\n  user:\n    tokenFile: token\n", server)
	if err := os.WriteFile(filepath.Join(dir, cniconf.ConsulK8sKubeconfigFileName), []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte("t0k3n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestTrafficDualStack: a dual-stack pod (annotation dual-stack=true) gets
// the IPv4 pass without DNS rules and the IPv6 pass with them; IPv6 and IPv4
// traffic is redirected, DNS only over IPv6; with the node's backend and with
// legacy.
func TestTrafficDualStack(t *testing.T) {
	r := testnet.Reserve(t)
	ctx := context.Background()
	ext := r.NewExternal(t)
	excluded6 := ext.AddAddress(t, true)
	listen(t, ext, "tcp", hostPort(ext.V4, 8080), "external")
	listen(t, ext, "tcp", hostPort(ext.V6, 8080), "external6")
	listen(t, ext, "tcp", hostPort(ext.V6, 9090), "external6-9090")
	listen(t, ext, "tcp", hostPort(excluded6, 8080), "external6-excluded-cidr")

	// Dual stack with one CIDR per family (the SDK would fail on that; the
	// table comparison below uses the SDK only for the config without it).
	cfg := fmt.Sprintf(`{"ConsulDNSIP":"::1","ConsulDNSPort":8600,"ProxyUserID":"5995","ProxyInboundPort":20000,`+
		`"ExcludeInboundPorts":["20200"],"ExcludeOutboundPorts":["9090"],"ExcludeOutboundCIDRs":["%s/128"],"ExcludeUIDs":["5996"]}`, excluded6)
	// Every backend: iptables with the node's variant (auto) and legacy,
	// each with both families, and nftables with its one inet table.
	for _, backend := range []string{"auto", "legacy", backendNftables} {
		t.Run(backend, func(t *testing.T) {
			stub := dualStackPod(cfg)
			srv := serveStub(t, r, stub)
			t.Cleanup(srv.Close)
			entry := entryFor(t, backend)
			stub.kubeconfig(t, entry[cniconf.KeyCNINetDir].(string), srv.URL)

			s4, s6 := podSubnets(r)
			chain := cnichain.New(t, cnichain.Options{Subnet4: s4, Subnet6: s6, Consul: entry})
			pod := r.NewNetns(t, "pod")
			rt := cnichain.Runtime("ctr-dual-"+backend, pod.Path, [2]string{"K8S_POD_NAMESPACE", "default"}, [2]string{"K8S_POD_NAME", "web"},
				[2]string{"K8S_POD_INFRA_CONTAINER_ID", "ctr-dual-" + backend}, [2]string{"K8S_POD_UID", "u-web"})
			res, err := chain.Add(ctx, rt)
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			t.Cleanup(func() { chain.Del(context.Background(), rt) })
			if got := strings.Join(stub.statuses, ","); got != "waiting,complete" {
				t.Fatalf("status writes %q", got)
			}
			ip4, ip6 := podIP(t, res, false), podIP(t, res, true)
			assertDualStackRulesIn(t, pod, backend, cfg)

			listen(t, pod, "tcp", ":15001", "outbound-listener")
			listen(t, pod, "tcp", ":20000", "inbound-listener")
			listen(t, pod, "tcp", ":20200", "app-20200")
			listen(t, pod, "udp", "[::1]:8600", "consul-dns6-udp")
			listen(t, pod, "tcp", "[::1]:8600", "consul-dns6-tcp")
			listen(t, pod, "udp", "127.0.0.1:53", "plain-dns4") // no IPv4 DNS rules in dual stack

			runExpectations(t, pod, ext.Netns, []expect{
				{1000, "tcp", hostPort(ext.V6, 8080), "outbound-listener"},
				{5995, "tcp", hostPort(ext.V6, 8080), "external6"},
				{5996, "tcp", hostPort(ext.V6, 8080), "external6"},
				{1000, "tcp", hostPort(ext.V6, 9090), "external6-9090"},
				{1000, "tcp", hostPort(excluded6, 8080), "external6-excluded-cidr"},
				{1000, "udp", "[::1]:53", "consul-dns6-udp"},
				{1000, "tcp", "[::1]:53", "consul-dns6-tcp"},
				{1000, "tcp", hostPort(ext.V4, 8080), "outbound-listener"},
				{5995, "tcp", hostPort(ext.V4, 8080), "external"},
				{1000, "udp", "127.0.0.1:53", "plain-dns4"},
				{-1, "tcp", hostPort(ip6, 8080), "inbound-listener"},
				{-1, "tcp", hostPort(ip6, 20200), "app-20200"},
				{-1, "tcp", hostPort(ip4, 8080), "inbound-listener"},
				{-1, "tcp", hostPort(ip4, 20200), "app-20200"},
			})
		})
	}
}

// dualStackPod is an API stub holding the injected dual-stack pod
// default/web with the redirect configuration cfg.
func dualStackPod(cfg string) *apiStub {
	return &apiStub{pods: map[string]map[string]any{"default/web": {
		"kind": "Pod", "apiVersion": "v1",
		"metadata": map[string]any{"name": "web", "namespace": "default", "uid": "u-web", "annotations": map[string]any{
			annotations.KeyInjectStatus:           "injected",
			annotations.KeyTransparentProxyStatus: "enabled",
			annotations.KeyDualStack:              "true",
			annotations.KeyRedirectTrafficConfig:  cfg,
		}},
	}}}
}

// assertDualStackRulesIn checks that the rules are in the tables of the
// backend asked for: the inet table, or both families' nat tables.
func assertDualStackRulesIn(t *testing.T, pod *testnet.Netns, backend, cfg string) {
	t.Helper()
	if backend == backendNftables {
		assertNftables(t, pod, cfg, true)
		return
	}
	for _, fam := range []redirect.Family{redirect.IPv4, redirect.IPv6} {
		if tbl := saveNat(t, pod, backendFor(t, backend), fam); !strings.Contains(tbl, "-A CONSUL_PROXY_OUTPUT") {
			t.Fatalf("backend %s, %s: no rules of ours in its nat table:\n%s", backend, fam, tbl)
		}
	}
}

// TestDualStackTableMatchesSDK: the same through the Kubernetes path, with a
// config the SDK can apply, compared table by table.
func TestDualStackTableMatchesSDK(t *testing.T) {
	r := testnet.Reserve(t)
	ctx := context.Background()
	cfg := `{"ConsulDNSIP":"::1","ConsulDNSPort":8600,"ProxyUserID":"5995","ProxyInboundPort":20000,"ExcludeInboundPorts":["20200","21000"],"ExcludeOutboundPorts":["5432"],"ExcludeUIDs":["5996"]}`
	stub := &apiStub{pods: map[string]map[string]any{"default/web": {
		"kind": "Pod", "apiVersion": "v1",
		"metadata": map[string]any{"name": "web", "namespace": "default", "uid": "u-web", "annotations": map[string]any{
			annotations.KeyInjectStatus: "injected", annotations.KeyTransparentProxyStatus: "enabled",
			annotations.KeyDualStack: "true", annotations.KeyRedirectTrafficConfig: cfg,
		}},
	}}}
	srv := serveStub(t, r, stub)
	t.Cleanup(srv.Close)
	entry := consulEntry(t, "auto", nil)
	stub.kubeconfig(t, entry[cniconf.KeyCNINetDir].(string), srv.URL)
	s4, s6 := podSubnets(r)
	chain := cnichain.New(t, cnichain.Options{Subnet4: s4, Subnet6: s6, Consul: entry, CNIVersion: "0.4.0"})
	pod := r.NewNetns(t, "pod")
	rt := cnichain.Runtime("ctr-dual-sdk", pod.Path, [2]string{"K8S_POD_NAMESPACE", "default"}, [2]string{"K8S_POD_NAME", "web"})
	if _, err := chain.Add(ctx, rt); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	t.Cleanup(func() { chain.Del(context.Background(), rt) })
	b := backendFor(t, "auto")
	want := sdkTable(t, r, b, cfg, true)
	if got := [2]string{saveNat(t, pod, b, redirect.IPv4), saveNat(t, pod, b, redirect.IPv6)}; got != want {
		t.Errorf("pod nat tables differ from what the SDK gives\n--- pod\n%s%s--- sdk\n%s%s", got[0], got[1], want[0], want[1])
	}
}

// TestLifecycle: the default consul-k8s config through the whole chain,
// then a repeated ADD, CHECK before and after a rule was deleted by hand,
// DEL twice, and DEL after the namespace is gone.
func TestLifecycle(t *testing.T) {
	r := testnet.Reserve(t)
	ctx := context.Background()
	const cfg = `{"ConsulDNSIP":"127.0.0.1","ConsulDNSPort":8600,"ProxyUserID":"5995","ProxyInboundPort":20000,"ProxyOutboundPort":15001,"ExcludeInboundPorts":["20200","21000"],"ExcludeOutboundPorts":null,"ExcludeOutboundCIDRs":null,"ExcludeUIDs":["5996"],"NetNS":"","IptablesProvider":null}`
	s4, _ := podSubnets(r)
	// Nomad's way: no kubeconfig, the config comes in CNI_ARGS.
	chain := cnichain.New(t, cnichain.Options{Subnet4: s4, Consul: consulEntry(t, "auto", map[string]any{cniconf.KeyKubeconfig: nil})})
	if err := chain.Status(ctx); err != nil {
		t.Fatalf("STATUS: %v", err)
	}
	pod := r.NewNetns(t, "pod")
	rt := cnichain.Runtime("ctr-life", pod.Path, [2]string{"CONSUL_IPTABLES_CONFIG", cfg})
	res, err := chain.Add(ctx, rt)
	if err != nil {
		t.Fatalf("ADD: %v", err)
	}
	b := backendFor(t, "auto")
	want := cnichain.GoldenTable(t, "default", redirect.IPv4)
	if got := saveNat(t, pod, b, redirect.IPv4); got != want {
		t.Fatalf("nat table after ADD\n%s\nwant (default.golden)\n%s", got, want)
	}
	if err := chain.Check(ctx, rt); err != nil {
		t.Fatalf("CHECK after ADD: %v", err)
	}

	// ADD of the plugin again (what a runtime retry does): same table.
	stdout, stderr, err := chain.ExecConsul(ctx, "ADD", rt, res)
	if err != nil {
		t.Fatalf("re-ADD: %v\n%s%s", err, stdout, stderr)
	}
	var out map[string]any
	if err := json.Unmarshal(stdout, &out); err != nil || out["ips"] == nil {
		t.Fatalf("re-ADD stdout is not the result: %v\n%s", err, stdout)
	}
	if got := saveNat(t, pod, b, redirect.IPv4); got != want {
		t.Fatalf("nat table after re-ADD\n%s\nwant\n%s", got, want)
	}

	// A rule deleted by hand is reported by CHECK.
	pod.Run(t, b.Tool(redirect.IPv4), "-t", "nat", "-D", "CONSUL_PROXY_INBOUND", "-p", "tcp", "--dport", "21000", "-j", "RETURN")
	err = chain.Check(ctx, rt)
	if err == nil || !strings.Contains(err.Error(), "rule missing: -A CONSUL_PROXY_INBOUND -p tcp -m tcp --dport 21000 -j RETURN") {
		t.Fatalf("CHECK after deleting a rule: %v", err)
	}
	t.Logf("CHECK reports: %v", err)

	// DEL removes everything of ours; twice is fine.
	for i := 0; i < 2; i++ {
		if err := chain.Del(ctx, rt); err != nil {
			t.Fatalf("DEL #%d: %v", i+1, err)
		}
	}
	if got := saveNat(t, pod, b, redirect.IPv4); strings.Contains(got, "CONSUL") {
		t.Fatalf("rules after DEL:\n%s", got)
	}

	// DEL of a sandbox whose namespace is already gone.
	pod2 := r.NewNetns(t, "pod")
	rt2 := cnichain.Runtime("ctr-life-2", pod2.Path, [2]string{"CONSUL_IPTABLES_CONFIG", cfg})
	if _, err := chain.Add(ctx, rt2); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("ip", "netns", "del", pod2.Name).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if err := chain.Del(ctx, rt2); err != nil {
		t.Fatalf("DEL with the netns gone: %v", err)
	}
	if _, _, err := chain.ExecConsul(ctx, "DEL", &libcni.RuntimeConf{ContainerID: "ctr-life-3", IfName: "eth0"}, nil); err != nil {
		t.Fatalf("DEL without a netns: %v", err)
	}
}

// TestFailedAddLeavesNothing: an invalid configuration fails ADD with an
// error naming the field; the namespace has no rule of ours.
func TestFailedAddLeavesNothing(t *testing.T) {
	r := testnet.Reserve(t)
	ctx := context.Background()
	s4, _ := podSubnets(r)
	chain := cnichain.New(t, cnichain.Options{Subnet4: s4, Consul: consulEntry(t, "auto", nil)})
	pod := r.NewNetns(t, "pod")
	rt := cnichain.Runtime("ctr-bad", pod.Path, [2]string{"CONSUL_IPTABLES_CONFIG", `{"ProxyUserID":"5995","ProxyInboundPort":20000,"ExcludeOutboundCIDRs":["10.0.0.0/8,-j,ACCEPT"]}`})
	_, err := chain.Add(ctx, rt)
	if err == nil || !strings.Contains(err.Error(), "ExcludeOutboundCIDRs[0]") {
		t.Fatalf("ADD error %v", err)
	}
	t.Logf("ADD fails with: %v", err)
	t.Cleanup(func() { chain.Del(context.Background(), rt) })
	if got := saveNat(t, pod, backendFor(t, "auto"), redirect.IPv4); strings.Contains(got, "CONSUL") {
		t.Fatalf("rules after a failed ADD:\n%s", got)
	}
}

// TestStatusPassesWhileCredentialsFailADDClosed: with a 1.1.0 conflist,
// STATUS passes whether the kubeconfig is missing (uninstalled) or present
// with credentials that cannot be read (a failing STATUS would make the
// runtime report the node's network not ready, and the node's pods would be
// evicted), while ADD for an injected pod fails closed: no rule, no status
// write, no result.
func TestStatusPassesWhileCredentialsFailADDClosed(t *testing.T) {
	r := testnet.Reserve(t)
	s4, _ := podSubnets(r)
	entry := consulEntry(t, "auto", nil)
	chain := cnichain.New(t, cnichain.Options{Subnet4: s4, Consul: entry})
	if err := chain.Status(context.Background()); err != nil {
		t.Fatalf("STATUS without kubeconfig: %v", err)
	}
	stub := &apiStub{pods: map[string]map[string]any{"default/web": {
		"kind": "Pod", "apiVersion": "v1",
		"metadata": map[string]any{"name": "web", "namespace": "default", "uid": "u-web", "annotations": map[string]any{
			annotations.KeyInjectStatus: "injected", annotations.KeyTransparentProxyStatus: "enabled",
			annotations.KeyRedirectTrafficConfig: `{"ProxyUserID":"5995","ProxyInboundPort":20000}`,
		}},
	}}}
	srv := serveStub(t, r, stub)
	t.Cleanup(srv.Close)
	dir := entry[cniconf.KeyCNINetDir].(string)
	stub.kubeconfig(t, dir, srv.URL)
	if err := os.Remove(filepath.Join(dir, "token")); err != nil {
		t.Fatal(err)
	}
	if err := chain.Status(context.Background()); err != nil {
		t.Fatalf("STATUS with unreadable credentials: %v", err)
	}
	pod := r.NewNetns(t, "pod")
	rt := cnichain.Runtime("ctr-creds", pod.Path, [2]string{"K8S_POD_NAMESPACE", "default"}, [2]string{"K8S_POD_NAME", "web"})
	_, err := chain.Add(context.Background(), rt)
	if err == nil || !strings.Contains(err.Error(), "tokenFile") {
		t.Fatalf("ADD for an injected pod with unreadable credentials: %v", err)
	}
	t.Cleanup(func() { chain.Del(context.Background(), rt) })
	if got := saveNat(t, pod, backendFor(t, "auto"), redirect.IPv4); strings.Contains(got, "CONSUL") {
		t.Fatalf("rules after a failed ADD:\n%s", got)
	}
	if len(stub.statuses) != 0 {
		t.Fatalf("status written: %v", stub.statuses)
	}
}
