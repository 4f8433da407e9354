//go:build privileged

package initcheck_test

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/initcheck"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/iptables"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/nftables"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

const probeUID = 1000

// consulOutputRules is the outbound part of the nat table consul-k8s
// writes (see the compatibility notes), enough for the probe.
func consulOutputRules(proxyUID, outbound int, excludeUIDs ...int) string {
	var b strings.Builder
	b.WriteString("*nat\n:CONSUL_PROXY_OUTPUT - [0:0]\n:CONSUL_PROXY_REDIRECT - [0:0]\n")
	fmt.Fprintf(&b, "-A CONSUL_PROXY_REDIRECT -p tcp -j REDIRECT --to-ports %d\n", outbound)
	b.WriteString("-A OUTPUT -p tcp -j CONSUL_PROXY_OUTPUT\n")
	for _, u := range excludeUIDs {
		fmt.Fprintf(&b, "-A CONSUL_PROXY_OUTPUT -m owner --uid-owner %d -j RETURN\n", u)
	}
	fmt.Fprintf(&b, "-A CONSUL_PROXY_OUTPUT -m owner --uid-owner %d -j RETURN\n", proxyUID)
	b.WriteString("-A CONSUL_PROXY_OUTPUT -d 127.0.0.1/32 -j RETURN\n")
	b.WriteString("-A CONSUL_PROXY_OUTPUT -j CONSUL_PROXY_REDIRECT\nCOMMIT\n")
	return b.String()
}

// podNetns is a namespace with a default route into a veth pair whose both
// ends stay inside it, so a connection that is not redirected goes nowhere:
// its packets arrive at the address-less peer and are dropped, never
// leaving the namespace.
func podNetns(t *testing.T, r *testnet.Range, name string, idx int) *testnet.Netns {
	t.Helper()
	ns := r.NewNetns(t, name)
	addr := testnet.Host(r.Subnet4(idx, 24), 2)
	ns.Run(t, "ip", "link", "add", "d0", "type", "veth", "peer", "name", "d1")
	ns.Run(t, "ip", "link", "set", "d0", "up")
	ns.Run(t, "ip", "link", "set", "d1", "up")
	ns.Run(t, "ip", "addr", "add", addr.String()+"/24", "dev", "d0")
	ns.Run(t, "ip", "route", "add", "default", "dev", "d0")
	return ns
}

func restore(t *testing.T, ns *testnet.Netns, rules string) {
	t.Helper()
	c := ns.Command(-1, "iptables-restore", "--noflush")
	c.Stdin = strings.NewReader(rules)
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("iptables-restore: %v: %s\n%s", err, out, rules)
	}
}

// podFiles writes a downward-API annotations file and an empty termination
// log that probeUID can read and write.
func podFiles(t *testing.T, status string) (annFile, termLog string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "consul-cni-check-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	anns := fmt.Sprintf("%s=%q\n%s=%q\n%s=%q", annotations.KeyInjectStatus, "injected",
		annotations.KeyRedirectTrafficConfig, `{"ProxyUserID":"5995","ProxyInboundPort":20000,"ProxyOutboundPort":15001,"ExcludeUIDs":["5996"]}`,
		annotations.KeyTransparentProxyStatus, status)
	annFile = filepath.Join(dir, "annotations")
	if err := os.WriteFile(annFile, []byte(anns), 0o644); err != nil {
		t.Fatal(err)
	}
	termLog = filepath.Join(dir, "termination-log")
	if err := os.WriteFile(termLog, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(termLog, probeUID, probeUID); err != nil {
		t.Fatal(err)
	}
	return annFile, termLog
}

// runCheck runs the real consul-cni-check binary inside ns as uid.
func runCheck(t *testing.T, ns *testnet.Netns, uid int, target netip.AddrPort, annFile, termLog string) (int, string) {
	t.Helper()
	bin := testbin.Project(t, "consul-cni-check")
	c := ns.Command(uid, bin, "--annotations-file", annFile, "--api=false", "--timeout", "60s",
		"--probe", "--probe-address", target.String(), "--probe-timeout", "3s", "--termination-log", termLog)
	var out bytes.Buffer
	c.Stdout, c.Stderr = &out, &out
	err := c.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	msg, _ := os.ReadFile(termLog)
	t.Logf("exit %d\noutput: %s\ntermination message: %s", code, out.String(), msg)
	return code, string(msg)
}

func TestProbeRealNetns(t *testing.T) {
	r := testnet.Reserve(t)
	target := netip.AddrPortFrom(testnet.Host(r.Subnet4(5, 24), 7), 15002)

	t.Run("redirect rules in place", func(t *testing.T) {
		ns := podNetns(t, r, "chk-ok", 1)
		restore(t, ns, consulOutputRules(5995, 15001, 5996))
		ann, tl := podFiles(t, "complete")
		if code, msg := runCheck(t, ns, probeUID, target, ann, tl); code != 0 {
			t.Fatalf("exit %d with the rules in place: %s", code, msg)
		}
	})

	// The probe works with both backends: the iptables nat table and the
	// table inet consul_tproxy (SO_ORIGINAL_DST reads the same conntrack
	// entry either way).
	for i, backend := range []string{cniconf.BackendIptables, cniconf.BackendNftables} {
		t.Run("the full consul-k8s rule set applied by the "+backend+" backend", func(t *testing.T) {
			ns := podNetns(t, r, "chk-"+backend[:3], 5+i*5)
			tc, err := annotations.ParseRedirectTrafficConfig([]byte(`{"ConsulDNSIP":"127.0.0.1","ConsulDNSPort":8600,
			"ProxyUserID":"5995","ProxyInboundPort":20000,"ProxyOutboundPort":15001,"ExcludeInboundPorts":["20200"],
			"ExcludeOutboundPorts":["9090"],"ExcludeOutboundCIDRs":["10.0.0.0/8"],"ExcludeUIDs":["5996"]}`), false)
			if err != nil {
				t.Fatal(err)
			}
			if backend == cniconf.BackendNftables {
				err = nftables.Apply(context.Background(), ns.Path, nftables.Build(tc))
			} else {
				ex := &iptables.NetnsExecutor{NetNS: ns.Path, Variant: iptables.VariantDefault}
				err = iptables.Apply(context.Background(), ex, iptables.Build(tc))
			}
			if err != nil {
				t.Fatal(err)
			}
			ann, tl := podFiles(t, "complete")
			if code, msg := runCheck(t, ns, probeUID, target, ann, tl); code != 0 {
				t.Fatalf("exit %d with the rules in place: %s", code, msg)
			}
		})
	}

	t.Run("no redirect rules: bypass detected", func(t *testing.T) {
		ns := podNetns(t, r, "chk-bypass", 2)
		// The status says complete, but the namespace has no rules: only
		// the probe can tell.
		ann, tl := podFiles(t, "complete")
		code, msg := runCheck(t, ns, probeUID, target, ann, tl)
		if code != annotations.InitCheckExitCode {
			t.Fatalf("exit %d, want %d", code, annotations.InitCheckExitCode)
		}
		if !strings.Contains(msg, "not redirected") {
			t.Errorf("termination message %q", msg)
		}
	})

	// A rule in the pod dropping the probe ahead of the redirect (an egress
	// policy, raw table) leaves nothing to judge: no packet leaves the
	// namespace, whether the redirect is there or not, so the check says so
	// (exit 1), never the race's code. Without that rule the same missing
	// redirect sends the SYN out of d0 (the row above: exit 88).
	for i, redirected := range []bool{true, false} {
		name := "a rule dropping the probe ahead of the redirect: could not judge, redirect in place"
		if !redirected {
			name = "a rule dropping the probe ahead of the redirect: could not judge, no redirect either"
		}
		t.Run(name, func(t *testing.T) {
			ns := podNetns(t, r, fmt.Sprintf("chk-drop%d", i), 12+i)
			// The fresh veths' IPv6 solicitations would count as sent:
			// the namespace is older than its interfaces in a pod.
			ns.Run(t, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1")
			if redirected {
				restore(t, ns, consulOutputRules(5995, 15001, 5996))
			}
			ns.Run(t, "iptables", "-t", "raw", "-A", "OUTPUT", "-p", "tcp", "-d", target.Addr().String(),
				"--dport", fmt.Sprint(target.Port()), "-j", "DROP")
			ann, tl := podFiles(t, "complete")
			code, msg := runCheck(t, ns, probeUID, target, ann, tl)
			if code != initcheck.ExitConfig {
				t.Fatalf("exit %d, want %d (could not judge), never the race's %d", code, initcheck.ExitConfig, annotations.InitCheckExitCode)
			}
			if !strings.Contains(msg, "no packet left the pod's network namespace") {
				t.Errorf("termination message %q does not name the cause", msg)
			}
		})
	}

	t.Run("rules that exempt the probe's UID", func(t *testing.T) {
		// The annotation does not know about this exemption, so the check
		// runs the probe, which must see through it.
		ns := podNetns(t, r, "chk-exempt", 3)
		restore(t, ns, consulOutputRules(5995, 15001, 5996, probeUID))
		ann, tl := podFiles(t, "complete")
		if code, _ := runCheck(t, ns, probeUID, target, ann, tl); code != annotations.InitCheckExitCode {
			t.Fatalf("exit %d, want %d", code, annotations.InitCheckExitCode)
		}
	})

	t.Run("refuses to probe as the proxy UID", func(t *testing.T) {
		ns := podNetns(t, r, "chk-proxyuid", 4)
		restore(t, ns, consulOutputRules(5995, 15001, 5996))
		ann, tl := podFiles(t, "complete")
		os.Chown(tl, annotations.ProxyUID, annotations.ProxyUID)
		code, msg := runCheck(t, ns, annotations.ProxyUID, target, ann, tl)
		if code != 1 || !strings.Contains(msg, "refusing") {
			t.Fatalf("exit %d (%s), want 1 and a refusal", code, msg)
		}
	})
}
