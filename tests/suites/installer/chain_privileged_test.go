//go:build privileged

package installer_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cnichain"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/proc"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

// runtimeNetwork loads the node's network the way containerd's CRI plugin
// does (go-cni, one network): the first of the sorted .conf/.conflist/.json
// files, a single network up-converted to a list.
func runtimeNetwork(t *testing.T, dir string) *libcni.NetworkConfigList {
	t.Helper()
	files, err := libcni.ConfFiles(dir, []string{".conf", ".conflist", ".json"})
	if err != nil || len(files) == 0 {
		t.Fatalf("no network configuration in %s (%v)", dir, err)
	}
	sort.Strings(files)
	if strings.HasSuffix(files[0], ".conflist") {
		l, err := libcni.ConfListFromFile(files[0])
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	c, err := libcni.ConfFromFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	l, err := libcni.ConfListFromConf(c)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func pluginTypes(l *libcni.NetworkConfigList) string {
	var ts []string
	for _, p := range l.Plugins {
		ts = append(ts, p.Network.Type)
	}
	return strings.Join(ts, ",")
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

// sandbox creates a pod network namespace and runs ADD of the runtime's
// network for it through libcni, with the plugins running in the node's
// namespace, as containerd does at sandbox creation.
func sandbox(t *testing.T, r *testnet.Range, node *testnet.Netns, binDir, netDir, name string, args ...[2]string) (*testnet.Netns, netip.Addr) {
	t.Helper()
	l := runtimeNetwork(t, netDir)
	ns := r.NewNetns(t, name)
	cni := libcni.NewCNIConfigWithCacheDir([]string{binDir}, t.TempDir(), cnichain.NodeExec(node.Path, nil))
	rt := &libcni.RuntimeConf{ContainerID: "ctr-" + name, NetNS: ns.Path, IfName: "eth0",
		Args: append([][2]string{{"IgnoreUnknown", "1"}}, args...)}
	res, err := cni.AddNetworkList(context.Background(), l, rt)
	if err != nil {
		t.Fatalf("ADD %s with chain %s: %v", name, pluginTypes(l), err)
	}
	t.Cleanup(func() { cni.DelNetworkList(context.Background(), l, rt) })
	r100, err := current.GetResult(res)
	if err != nil || len(r100.IPs) == 0 {
		t.Fatalf("ADD result %v: %v", res, err)
	}
	ip, _ := netip.AddrFromSlice(r100.IPs[0].Address.IP.To4())
	return ns, ip
}

// runCheckIn runs consul-cni-check --probe inside ns as UID 1000, as an
// init container of the pod would.
func runCheckIn(t *testing.T, ns *testnet.Netns, target netip.AddrPort) (int, string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "ccr-check-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o777)
	ann := filepath.Join(dir, "annotations")
	body := fmt.Sprintf("%s=%q\n%s=%q\n%s=%q", annotations.KeyInjectStatus, "injected",
		annotations.KeyRedirectTrafficConfig, redirectConfig, annotations.KeyTransparentProxyStatus, "complete")
	if err := os.WriteFile(ann, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	termLog := filepath.Join(dir, "termination-log")
	var out bytes.Buffer
	c := ns.Command(1000, testbin.Project(t, "consul-cni-check"), "--annotations-file", ann, "--api=false",
		"--timeout", "30s", "--probe", "--probe-address", target.String(), "--probe-timeout", "3s", "--termination-log", termLog)
	c.Stdout, c.Stderr = &out, &out
	err = c.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	msg, _ := os.ReadFile(termLog)
	t.Logf("consul-cni-check in %s: exit %d\n%s%s", ns.Name, code, out.String(), msg)
	return code, string(msg)
}

const redirectConfig = `{"ProxyUserID":"5995","ProxyInboundPort":20000,"ProxyOutboundPort":15001,"ExcludeInboundPorts":null,"ExcludeOutboundPorts":null,"ExcludeOutboundCIDRs":null,"ExcludeUIDs":["5996"]}`

// The installer against a real chain: a node whose primary CNI (ptp +
// host-local, written as a single-network .conf) is running; sandboxes are
// created through libcni from the network containerd would load. Before the
// installer, a pod is set up without consul-cni and its traffic leaves
// directly (the race); after it, the runtime's network ends with consul-cni
// and a new pod's traffic is redirected, proven by real connections (the
// init-container check's probe), while the early pod still bypasses.
func TestInstallerRealChain(t *testing.T) {
	r := testnet.Reserve(t)
	ext := r.NewExternal(t)
	// The external service: answers on 8080 with its name.
	l, err := ext.Listen("tcp", ":8080")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, "external\n")
			c.Close()
		}
	}()

	root := t.TempDir()
	binDir, netDir := filepath.Join(root, "opt/cni/bin"), filepath.Join(root, "etc/cni/net.d")
	for _, d := range []string{binDir, netDir} {
		os.MkdirAll(d, 0o755)
	}
	refDir := testbin.CNIPluginDir(t)
	for _, p := range []string{"ptp", "host-local"} {
		copyFile(t, filepath.Join(refDir, p), filepath.Join(binDir, p))
	}
	subnet := r.Subnet4(3, 24)
	node := r.NewNode(t, "node", subnet)
	primary := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"primary","type":"ptp","ipMasq":false,"mtu":1500,
 "ipam":{"type":"host-local","dataDir":%q,"ranges":[[{"subnet":%q}]],"routes":[{"dst":"0.0.0.0/0"}]}}`,
		filepath.Join(root, "ipam"), subnet.String())
	if err := os.WriteFile(filepath.Join(netDir, "10-primary.conf"), []byte(primary), 0o644); err != nil {
		t.Fatal(err)
	}
	nomad := [2]string{"CONSUL_IPTABLES_CONFIG", redirectConfig}

	// Before the installer: the runtime's network is ptp alone.
	if got := pluginTypes(runtimeNetwork(t, netDir)); got != "ptp" {
		t.Fatalf("runtime chain before install: %s", got)
	}
	early, _ := sandbox(t, r, node, binDir, netDir, "early", nomad)

	// The installer runs (plugin kubeconfig derived from a token
	// configuration; the chain below runs in Nomad mode, without the API).
	installer := testbin.Project(t, "consul-cni-installer")
	plugin := testbin.Project(t, "consul-cni")
	kc := filepath.Join(root, "installer.kubeconfig")
	os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: static}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600)
	args := func(sub string) []string {
		return []string{sub, "--cni-bin-dir", binDir, "--cni-net-dir", netDir, "--host-cni-bin-dir", binDir,
			"--host-cni-net-dir", netDir, "--plugin-binary", plugin}
	}
	cmd := exec.Command(installer, append(args("run"), "--kubeconfig", kc)...)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	p, err := proc.Start(cmd, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Stop(10 * time.Second)
		if t.Failed() {
			t.Logf("installer log:\n%s", logs.String())
		}
	})
	deadline := time.Now().Add(2 * time.Minute)
	for {
		out, err := exec.Command(installer, args("ready")...).CombinedOutput()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("installer never ready: %s", out)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// The runtime's view now ends with consul-cni.
	l2 := runtimeNetwork(t, netDir)
	if got := pluginTypes(l2); got != "ptp,consul-cni" {
		t.Fatalf("runtime chain after install: %s", got)
	}

	late, _ := sandbox(t, r, node, binDir, netDir, "late", nomad)
	target := netip.AddrPortFrom(ext.V4, 8080)

	// Ground truth by real connections: from the early pod the external
	// service answers (bypass); from the late pod the connection lands on
	// the pod's outbound port.
	dial := func(ns *testnet.Netns) (string, error) { return ns.DialRead(target.String(), 3*time.Second) }
	if got, err := dial(early); err != nil || got != "external" {
		t.Fatalf("early pod: %q, %v: want the external service (no redirection)", got, err)
	}
	outbound, err := late.Listen("tcp", ":15001")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		c, err := outbound.Accept()
		if err == nil {
			io.WriteString(c, "outbound-listener\n")
			c.Close()
		}
	}()
	if got, err := dial(late); err != nil || got != "outbound-listener" {
		t.Fatalf("late pod: %q, %v: want the outbound listener (redirected)", got, err)
	}
	outbound.Close()

	// The init-container check tells the two apart the same way.
	if code, _ := runCheckIn(t, late, netip.AddrPortFrom(ext.V4, 15002)); code != 0 {
		t.Fatalf("check in the late pod: exit %d, want 0", code)
	}
	if code, msg := runCheckIn(t, early, netip.AddrPortFrom(ext.V4, 15002)); code != annotations.InitCheckExitCode || !strings.Contains(msg, "not redirected") {
		t.Fatalf("check in the early pod: exit %d (%s), want %d", code, msg, annotations.InitCheckExitCode)
	}
}
