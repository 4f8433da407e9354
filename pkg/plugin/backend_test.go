package plugin

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
)

func TestBackendDefaultIsIptables(t *testing.T) {
	c, err := parseConfig([]byte(conflistEntry("1.0.0", "")))
	if err != nil {
		t.Fatal(err)
	}
	if c.Backend != "iptables" || c.nftables() {
		t.Fatalf("backend %q", c.Backend)
	}
}

// TestNftablesBackend runs ADD, CHECK and DEL with backend nftables: the
// table goes to the nftables side, no iptables rule is written, and
// switching the pod between backends (a re-ADD with the other one) leaves
// nothing of the old backend.
func TestNftablesBackend(t *testing.T) {
	e := newEnv(t, injectedPod("web", nil))
	nft := conflistEntry("1.0.0", `,"backend":"nftables"`)
	ipt := conflistEntry("1.0.0", "")
	ns := filepath.Join(t.TempDir(), "netns")
	if err := os.WriteFile(ns, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	in := func(stdin string) *skel.CmdArgs { b := args(stdin, podArgs("web")); b.Netns = ns; return b }
	a := in(nft)
	if err := e.p.Add(a); err != nil {
		t.Fatal(err)
	}
	if e.nft.Table(a.Netns) == "" || e.tables() != emptyTables {
		t.Fatalf("nft table %q, iptables %v", e.nft.Table(a.Netns), e.tables())
	}
	if e.status("web") != annotations.TProxyStatusComplete {
		t.Fatal("status not complete")
	}
	if err := e.p.Check(in(nft)); err != nil {
		t.Fatal(err)
	}
	// The iptables backend's CHECK sees the other backend's table.
	if err := e.p.Check(in(ipt)); err == nil {
		t.Fatal("iptables CHECK passed with only the nftables table")
	}
	// Switch to iptables: the table goes.
	if err := e.p.Add(in(ipt)); err != nil {
		t.Fatal(err)
	}
	if e.nft.Table(a.Netns) != "" || e.tables() == emptyTables {
		t.Fatalf("after switching to iptables: nft table %q, iptables %v", e.nft.Table(a.Netns), e.tables())
	}
	// And back: the iptables rules go (FindIptablesRules reports them).
	e.nft.Iptables = redirect.Leftovers{IptablesNFT: true}
	if err := e.p.Add(a); err != nil {
		t.Fatal(err)
	}
	if e.nft.Table(a.Netns) == "" || e.tables() != emptyTables {
		t.Fatalf("after switching back: nft table %q, iptables %v", e.nft.Table(a.Netns), e.tables())
	}
	e.nft.Iptables = redirect.Leftovers{}
	if err := e.p.Del(a); err != nil {
		t.Fatal(err)
	}
	if e.nft.Table(a.Netns) != "" {
		t.Fatal("DEL left the table")
	}
}

func TestNftablesApplyFailureDoesNotComplete(t *testing.T) {
	e := newEnv(t, injectedPod("web", nil))
	e.nft.ApplyErr = errors.New("netlink: operation not supported")
	err := e.p.Add(args(conflistEntry("1.0.0", `,"backend":"nftables"`), podArgs("web")))
	if err == nil || !strings.Contains(err.Error(), "backend nftables") || !strings.Contains(err.Error(), "not supported") {
		t.Fatalf("error %v", err)
	}
	if s := e.status("web"); s != annotations.TProxyStatusWaiting {
		t.Fatalf("status %q", s)
	}
}

// With the nftables backend too, a failed `complete` patch removes the table
// and fails ADD.
func TestNftablesCompletePatchFailureRemovesTable(t *testing.T) {
	e := newEnv(t, injectedPod("web", nil))
	patches := 0
	e.client.PrependReactor("patch", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		patches++
		if patches > 1 {
			return true, nil, apierrors.NewInternalError(errors.New("etcd timeout"))
		}
		return false, nil, nil
	})
	ns := filepath.Join(t.TempDir(), "netns")
	if err := os.WriteFile(ns, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	a := args(conflistEntry("1.0.0", `,"backend":"nftables"`), podArgs("web"))
	a.Netns = ns
	err := e.p.Add(a)
	if err == nil || !strings.Contains(err.Error(), "rules applied but setting") {
		t.Fatalf("error %v", err)
	}
	if got := e.nft.Table(ns); got != "" {
		t.Fatalf("table left:\n%s", got)
	}
}
