package conflist

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/conflist/conflisttest"
)

// types returns the plugin types of a configuration list in order.
func types(t *testing.T, data []byte) []string {
	t.Helper()
	var l struct {
		Plugins []struct {
			Type string `json:"type"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(data, &l); err != nil {
		t.Fatalf("output is not a configuration list: %v\n%s", err, data)
	}
	var out []string
	for _, p := range l.Plugins {
		out = append(out, p.Type)
	}
	return out
}

func TestChainInline(t *testing.T) {
	chained, _, err := ChainInline([]byte(conflisttest.Kindnet), conflisttest.Entry)
	if err != nil {
		t.Fatal(err)
	}
	otherEntry := PluginConfig{Name: cniconf.PluginName, Type: cniconf.PluginType, Settings: cniconf.Settings{LogLevel: "debug"}}.JSON()
	for _, tc := range []struct {
		name        string
		in          string
		wantTypes   string
		wantChanged bool
		wantErr     string
	}{
		{name: "conflisttest.Kindnet", in: conflisttest.Kindnet, wantTypes: "ptp,portmap,consul-cni", wantChanged: true},
		{name: "already chained", in: string(chained), wantTypes: "ptp,portmap,consul-cni", wantChanged: false},
		{name: "not last", in: `{"name":"n","cniVersion":"1.0.0","plugins":[{"type":"ptp"},` + string(conflisttest.Entry) + `,{"type":"portmap"}]}`,
			wantTypes: "ptp,portmap,consul-cni", wantChanged: true},
		{name: "duplicated", in: `{"name":"n","plugins":[` + string(conflisttest.Entry) + `,{"type":"ptp"},` + string(conflisttest.Entry) + `]}`,
			wantTypes: "ptp,consul-cni", wantChanged: true},
		{name: "last but other settings", in: `{"name":"n","plugins":[{"type":"ptp"},` + string(otherEntry) + `]}`,
			wantTypes: "ptp,consul-cni", wantChanged: true},
		{name: "same entry, other key order and spacing", in: `{"name":"n","plugins":[{"type":"ptp"},
			{"multus":false,"type":"consul-cni","log_level":"info","kubeconfig":"` + cniconf.KubeconfigFileName + `",
			 "cni_net_dir":"/etc/cni/net.d","cni_bin_dir":"/opt/cni/bin","name":"consul-cni"}]}`,
			wantTypes: "ptp,consul-cni", wantChanged: false},
		{name: "empty plugin list", in: `{"name":"n","plugins":[]}`, wantTypes: "consul-cni", wantChanged: true},
		{name: "not an object", in: `[1,2]`, wantErr: "not a JSON object"},
		{name: "plugins not a list", in: `{"name":"n","plugins":{"type":"ptp"}}`, wantErr: `"plugins" is not a list`},
		{name: "bad JSON", in: `{"name":`, wantErr: "not a JSON object"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, changed, err := ChainInline([]byte(tc.in), conflisttest.Entry)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want it to mention %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if changed != tc.wantChanged {
				t.Errorf("changed = %v, want %v", changed, tc.wantChanged)
			}
			if got := strings.Join(types(t, out), ","); got != tc.wantTypes {
				t.Errorf("plugin types = %s, want %s", got, tc.wantTypes)
			}
			if !changed && string(out) != tc.in {
				t.Errorf("unchanged input was rewritten")
			}
			// Idempotent: a second pass changes nothing.
			again, changed2, err := ChainInline(out, conflisttest.Entry)
			if err != nil || changed2 || string(again) != string(out) {
				t.Errorf("second pass: changed=%v err=%v", changed2, err)
			}
		})
	}
}

func TestChainInlineKeepsEverythingElse(t *testing.T) {
	in := `{"cniVersion":"1.1.0","cniVersions":["0.4.0","1.1.0"],"name":"big","disableCheck":true,"x-vendor":{"a":[1,2,3]},
	  "plugins":[{"type":"bridge","mtu":9001,"big":12345678901234567890,"f":1.50,"s":"<&>"}]}`
	out, _, err := ChainInline([]byte(in), conflisttest.Entry)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"cniVersions"`, `"disableCheck": true`, `"x-vendor"`, `12345678901234567890`, `1.50`, `"<&>"`, `9001`} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lost %s:\n%s", want, out)
		}
	}
	back, changed, err := UnchainInline(out)
	if err != nil || !changed {
		t.Fatalf("UnchainInline: changed=%v err=%v", changed, err)
	}
	if !SameJSON(back, []byte(in)) {
		t.Errorf("chain then unchain is not the original:\n%s", back)
	}
}

func TestUnchainInline(t *testing.T) {
	out, changed, err := UnchainInline([]byte(conflisttest.Kindnet))
	if err != nil || changed || string(out) != conflisttest.Kindnet {
		t.Fatalf("list without consul-cni: changed=%v err=%v", changed, err)
	}
	in := `{"name":"n","plugins":[` + string(conflisttest.Entry) + `,{"type":"ptp"},` + string(conflisttest.Entry) + `]}`
	out, changed, err = UnchainInline([]byte(in))
	if err != nil || !changed {
		t.Fatalf("changed=%v err=%v", changed, err)
	}
	if got := strings.Join(types(t, out), ","); got != "ptp" {
		t.Errorf("types = %s", got)
	}
}

func TestConvertSingle(t *testing.T) {
	for _, tc := range []struct {
		name, in, wantName, wantVersion, wantErr string
	}{
		{name: "flannel", in: `{"name":"cbr0","cniVersion":"0.3.1","type":"flannel","delegate":{"hairpinMode":true,"isDefaultGateway":true}}`,
			wantName: "cbr0", wantVersion: "0.3.1"},
		{name: "no version", in: `{"name":"net","type":"bridge","bridge":"cni0"}`, wantName: "net"},
		{name: "no type", in: `{"name":"net","plugins":[{"type":"ptp"}]}`, wantErr: "type"},
		{name: "bad JSON", in: `{"name":"net",`, wantErr: "error parsing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := ConvertSingle([]byte(tc.in), conflisttest.Entry)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var l struct {
				Name       string            `json:"name"`
				CNIVersion string            `json:"cniVersion"`
				Plugins    []json.RawMessage `json:"plugins"`
			}
			if err := json.Unmarshal(out, &l); err != nil {
				t.Fatal(err)
			}
			if l.Name != tc.wantName || l.CNIVersion != tc.wantVersion || len(l.Plugins) != 2 {
				t.Fatalf("got %s", out)
			}
			if !SameJSON(l.Plugins[0], []byte(tc.in)) || !SameJSON(l.Plugins[1], conflisttest.Entry) {
				t.Errorf("plugins are not [original, consul-cni]:\n%s", out)
			}
		})
	}
}

func TestPrimary(t *testing.T) {
	for _, tc := range []struct {
		name        string
		files       map[string]string
		want        string // base name, "" for none
		wantInvalid int
	}{
		{name: "empty dir", files: nil, want: ""},
		{name: "only non-config files", files: map[string]string{
			cniconf.KubeconfigFileName: "x", cniconf.TokenFileName: "t", ".10-x.conflist.123.tmp": "{", "README": "hi"}, want: ""},
		{name: "lexical order", files: map[string]string{"20-b.conflist": conflisttest.Kindnet, "10-a.conflist": conflisttest.Kindnet}, want: "10-a.conflist"},
		{name: "conf before conflist", files: map[string]string{
			"10-flannel.conf": `{"name":"cbr0","type":"flannel"}`, "10-flannel.conflist": conflisttest.Kindnet}, want: "10-flannel.conf"},
		{name: "json counts", files: map[string]string{"05-net.json": `{"name":"j","type":"bridge"}`, "10-a.conflist": conflisttest.Kindnet}, want: "05-net.json"},
		{name: "invalid files skipped", files: map[string]string{
			"00-broken.conflist":  `{"name":`,
			"01-noplugins.conf":   `{"name":"x","plugins":[{"type":"ptp"}]}`,
			"02-empty.conflist":   `{"name":"e","plugins":[]}`,
			"03-noname.conflist":  `{"plugins":[{"type":"ptp"}]}`,
			"04-notype.conflist":  `{"name":"x","plugins":[{"mtu":1}]}`,
			"05-missing.conflist": `{"name":"nothing-anywhere"}`,
			"10-good.conflist":    conflisttest.Kindnet,
		}, want: "10-good.conflist", wantInvalid: 6},
		{name: "directories ignored", files: map[string]string{"00-dir.conflist/x": "", "10-a.conflist": conflisttest.Kindnet}, want: "10-a.conflist"},
		{name: "plugins from the plugin directory", files: map[string]string{
			"10-dir.conflist": `{"name":"dirnet","cniVersion":"1.1.0"}`, "dirnet/10-ptp.conf": `{"type":"ptp"}`}, want: "10-dir.conflist"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			conflisttest.WriteFiles(t, dir, tc.files)
			cands, err := ScanConfDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			p, bad, ok := Primary(cands)
			got := ""
			if ok {
				got = filepath.Base(p.Path)
			}
			if got != tc.want {
				t.Fatalf("primary = %q, want %q (candidates %+v)", got, tc.want, cands)
			}
			if len(bad) != tc.wantInvalid {
				t.Errorf("%d invalid before the primary, want %d", len(bad), tc.wantInvalid)
			}
		})
	}
	if c, err := ScanConfDir(filepath.Join(t.TempDir(), "absent")); err != nil || len(c) != 0 {
		t.Errorf("missing dir: %v %v", c, err)
	}
}

func TestPluginDirEntryName(t *testing.T) {
	for _, tc := range []struct {
		foreign []string
		want    string
	}{
		{nil, "zzz-consul-cni.conf"},
		{[]string{"/d/10-ptp.conf", "/d/20-portmap.conf"}, "zzz-consul-cni.conf"},
		{[]string{"/d/zzzz.conf"}, "zzzz.conf-zzz-consul-cni.conf"},
	} {
		got := PluginDirEntryName(tc.foreign)
		if got != tc.want {
			t.Errorf("PluginDirEntryName(%v) = %q, want %q", tc.foreign, got, tc.want)
		}
		for _, f := range tc.foreign {
			if filepath.Base(f) >= got {
				t.Errorf("%q does not sort after %q", got, f)
			}
		}
	}
}

func FuzzChainInline(f *testing.F) {
	f.Add([]byte(conflisttest.Kindnet))
	f.Add([]byte(`{"name":"n","plugins":[` + string(conflisttest.Entry) + `,{"type":"ptp"}]}`))
	f.Add([]byte(`{"name":"n"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		out, _, err := ChainInline(data, conflisttest.Entry)
		if err != nil {
			return
		}
		l, err := DecodeList(out)
		if err != nil {
			t.Fatalf("output does not decode: %v", err)
		}
		n := 0
		for _, p := range l.plugins {
			if pluginType(p) == cniconf.PluginType {
				n++
			}
		}
		if n != 1 || pluginType(l.plugins[len(l.plugins)-1]) != cniconf.PluginType {
			t.Fatalf("not exactly one consul-cni, last: %s", out)
		}
		again, changed, err := ChainInline(out, conflisttest.Entry)
		if err != nil || changed || string(again) != string(out) {
			t.Fatalf("not idempotent: changed=%v err=%v", changed, err)
		}
	})
}
