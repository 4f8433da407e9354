package install

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/conflist"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/conflist/conflisttest"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/credentials"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/credentials/credentialstest"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/nodefile"
)

func TestCompareVersions(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want int
	}{
		{"v0.1.0", "v0.1.0", 0},
		{"v0.2.0", "v0.1.0", 1},
		{"v0.1.0", "v0.2.0", -1},
		{"v0.1.0-3-gabcdef0", "v0.1.0", 1},
		{"v0.1.0-3-gabcdef0", "v0.1.0-12-g1234567-dirty", -1},
		{"v0.1.0-3-gabcdef0", "v0.2.0", -1},
		{"v0.2.0-rc.1", "v0.2.0", -1},
		{"v0.2.0-rc.1", "v0.1.0", 1},
		{"dev", "v0.0.1", -1},
		{"v0.0.0-dev+g0123456789ab", "v0.0.1", -1},
		{"v0.0.0-dev", "v0.1.0-3-gabcdef0", -1},
		{"v0.1.0", "dev", 1},
		{"dev", "v0.0.0-dev", 0},
		{"not a version", "v0.1.0", -1},
	} {
		if got := CompareVersions(c.a, c.b); got != c.want {
			t.Errorf("CompareVersions(%q, %q) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}

const ownerTestList = `{"cniVersion":"1.0.0","name":"kindnet","plugins":[{"type":"ptp"}]}`

// twoVersions sets up a node with an older and a newer installer whose
// plugin binaries and entries differ.
func twoVersions(t *testing.T) (n node, older, newer *Installer) {
	t.Helper()
	n = newHostDirs(t)
	conflisttest.WriteFiles(t, n.root, map[string]string{
		"etc/cni/net.d/10-kindnet.conflist": ownerTestList,
		"image2/consul-cni":                 "#!/bin/sh\necho plugin v2\n",
	})
	older = n.installer(t, func(c *Config) { c.Version = "v0.1.0" })
	newer = n.installer(t, func(c *Config) {
		c.Version, c.LogLevel = "v0.2.0", "debug"
		c.PluginBinary = filepath.Join(n.root, "image2/consul-cni")
	})
	return n, older, newer
}

func TestOlderInstallerNeverOverwritesNewer(t *testing.T) {
	for _, order := range []string{"older first", "newer first"} {
		t.Run(order, func(t *testing.T) {
			n, older, newer := twoVersions(t)
			first, second := older, newer
			if order == "newer first" {
				first, second = newer, older
			}
			writes := map[*Installer]int{}
			for i := 0; i < 4; i++ {
				for _, in := range []*Installer{first, second} {
					st := reconcile(t, in)
					for _, w := range st.Wrote {
						if w == "binary" || w == "chain 10-kindnet.conflist" {
							writes[in]++
						}
					}
				}
			}
			if order == "older first" && (writes[older] != 2 || writes[newer] != 2) {
				t.Errorf("binary and entry writes: older %d, newer %d; want 2 each (one write of each file)", writes[older], writes[newer])
			}
			if order == "newer first" && (writes[older] != 0 || writes[newer] != 2) {
				t.Errorf("binary and entry writes: older %d, newer %d; want 0 and 2", writes[older], writes[newer])
			}
			if err := older.VerifyInstalled(); err != nil {
				t.Errorf("older installer not ready beside the newer one: %v", err)
			}
			if err := newer.VerifyInstalled(); err != nil {
				t.Errorf("newer installer not ready: %v", err)
			}
			if same, err := nodefile.SameContent(newer.cfg.PluginBinary, filepath.Join(n.bin, cniconf.PluginType)); err != nil || !same {
				t.Errorf("installed binary is not the newer one (same=%v, err=%v)", same, err)
			}
			b, _ := os.ReadFile(filepath.Join(n.net, "10-kindnet.conflist"))
			var l struct{ Plugins []conflist.PluginConfig }
			if err := json.Unmarshal(b, &l); err != nil || len(l.Plugins) != 2 || l.Plugins[1].LogLevel != "debug" {
				t.Errorf("chain is not the newer installer's: %s", b)
			}
			if st := reconcile(t, older); st.YieldedTo != "v0.2.0" || !st.Recheck {
				t.Errorf("older pass: YieldedTo=%q Recheck=%v, want v0.2.0 and true", st.YieldedTo, st.Recheck)
			}
		})
	}
}

func TestOlderInstallerTakesOverFromGoneOwner(t *testing.T) {
	n, older, newer := twoVersions(t)
	reconcile(t, newer)
	// The newer installer's pod is known and gone (a rollback).
	conflisttest.WriteFiles(t, n.root, map[string]string{"etc/cni/net.d/" + cniconf.OwnerFileName: `{"version":"v0.2.0","namespace":"kube-system","pod":"consul-cni-new","uid":"u-2"}`})
	var asked []string
	older.cfg.PodAlive = func(_ context.Context, ns, name, uid string) (bool, error) {
		asked = append(asked, ns+"/"+name+"/"+uid)
		return false, nil
	}
	st := reconcile(t, older)
	if st.YieldedTo != "" || len(asked) != 1 || asked[0] != "kube-system/consul-cni-new/u-2" {
		t.Fatalf("older pass: YieldedTo=%q asked=%v; want it to take over after asking about kube-system/consul-cni-new/u-2", st.YieldedTo, asked)
	}
	if same, err := nodefile.SameContent(older.cfg.PluginBinary, filepath.Join(n.bin, cniconf.PluginType)); err != nil || !same {
		t.Errorf("older installer did not take over the binary (same=%v, err=%v)", same, err)
	}
	if o, ok := readOwner(n.net); !ok || o.Version != "v0.1.0" {
		t.Errorf("owner after take-over = %+v, want v0.1.0", o)
	}
	if err := older.VerifyInstalled(); err != nil {
		t.Errorf("older installer not ready after take-over: %v", err)
	}
}

func TestDevBuildYieldsToRelease(t *testing.T) {
	_, older, newer := twoVersions(t)
	older.cfg.Version = "v0.0.0-dev+gabc"
	newer.cfg.Version = "v0.0.1"
	reconcile(t, newer)
	if st := reconcile(t, older); st.YieldedTo != "v0.0.1" || len(st.Wrote) != 0 {
		t.Errorf("dev build pass: YieldedTo=%q wrote %v; want it to yield to v0.0.1 and write nothing", st.YieldedTo, st.Wrote)
	}
}

// Two installers of one version with different entries (a rollout
// restart, or helm upgrade switching the backend): the one in place keeps
// the installation while its pod runs, the other writes nothing; once the
// first pod is being deleted the second takes over with one write of the
// list, and the first, still running, never writes back.
func TestSameVersionOverlapConverges(t *testing.T) {
	n := newHostDirs(t)
	conflisttest.WriteFiles(t, n.root, map[string]string{
		"etc/cni/net.d/10-kindnet.conflist": ownerTestList,
		"sa-a/token":                        credentialstest.PodToken("consul-cni-a", "uid-a", time.Now().Add(time.Hour)),
		"sa-b/token":                        credentialstest.PodToken("consul-cni-b", "uid-b", time.Now().Add(time.Hour)),
	})
	alive := map[string]bool{"uid-a": true, "uid-b": true}
	podAlive := func(_ context.Context, _, _, uid string) (bool, error) { return alive[uid], nil }
	mk := func(token, backend string) *Installer {
		return n.installer(t, func(c *Config) {
			c.Version, c.Backend, c.PodAlive = "v0.2.0", backend, podAlive
			c.Client = &credentials.Source{Server: "https://10.96.0.1:443", CAData: []byte("CA"), TokenFile: filepath.Join(n.root, token)}
		})
	}
	a, b := mk("sa-a/token", cniconf.BackendIptables), mk("sa-b/token", cniconf.BackendNftables)
	list := filepath.Join(n.net, "10-kindnet.conflist")
	chainWrites := func(st PassResult) int {
		w := 0
		for _, s := range st.Wrote {
			if strings.HasPrefix(s, "chain") {
				w++
			}
		}
		return w
	}
	writes := chainWrites(reconcile(t, a))
	for i := 0; i < 3; i++ {
		for _, in := range []*Installer{b, a} {
			st := reconcile(t, in)
			writes += chainWrites(st)
			if in == b && (st.YieldedTo != "v0.2.0" || len(st.Wrote) != 0) {
				t.Fatalf("second installer while the first runs: YieldedTo=%q wrote %v", st.YieldedTo, st.Wrote)
			}
		}
		if err := b.VerifyInstalled(); err != nil {
			t.Fatalf("yielding installer not ready: %v", err)
		}
	}
	alive["uid-a"] = false // the first pod's deletion starts
	for i := 0; i < 3; i++ {
		for _, in := range []*Installer{b, a} {
			writes += chainWrites(reconcile(t, in))
		}
	}
	if writes != 2 {
		t.Errorf("list writes = %d, want 2 (the first installer's, then the second's once)", writes)
	}
	var l struct{ Plugins []conflist.PluginConfig }
	raw, _ := os.ReadFile(list)
	if err := json.Unmarshal(raw, &l); err != nil || l.Plugins[len(l.Plugins)-1].Backend != cniconf.BackendNftables {
		t.Errorf("entry after the overlap: %s; want the second installer's (backend nftables)", raw)
	}
	if o, ok := readOwner(n.net); !ok || o.UID != "uid-b" {
		t.Errorf("owner = %+v, want the second installer's pod", o)
	}
}
