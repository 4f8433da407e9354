package annotations

import (
	"net/netip"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

const upstreamDefault = `{"ConsulDNSIP":"127.0.0.1","ConsulDNSPort":8600,"ProxyUserID":"5995","ProxyInboundPort":20000,
 "ProxyOutboundPort":15001,"ExcludeInboundPorts":["20200","21000"],"ExcludeOutboundPorts":null,
 "ExcludeOutboundCIDRs":null,"ExcludeUIDs":["5996"],"NetNS":"","IptablesProvider":null}`

func TestParseUpstreamDefault(t *testing.T) {
	got, err := ParseRedirectTrafficConfig([]byte(upstreamDefault), false)
	if err != nil {
		t.Fatal(err)
	}
	want := TrafficConfig{
		ConsulDNSIP:         netip.MustParseAddr("127.0.0.1"),
		ConsulDNSPort:       8600,
		ProxyUserID:         5995,
		ProxyInboundPort:    20000,
		ProxyOutboundPort:   15001,
		ExcludeInboundPorts: []PortRange{{20200, 20200}, {21000, 21000}},
		ExcludeUIDs:         []uint32{5996},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
}

func TestParseCaseInsensitiveUnknownKeysDefaults(t *testing.T) {
	got, err := ParseRedirectTrafficConfig([]byte(`{"proxyuserid":"1","PROXYINBOUNDPORT":2,"NftablesProvider":{"x":1},"excludeoutboundcidrs":["10.1.2.3/8","192.168.0.1"]}`), false)
	if err != nil {
		t.Fatal(err)
	}
	if got.ProxyUserID != 1 || got.ProxyInboundPort != 2 || got.ProxyOutboundPort != DefaultProxyOutboundPort {
		t.Fatalf("unexpected %+v", got)
	}
	want := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.168.0.1/32")}
	if !reflect.DeepEqual(got.ExcludeOutboundCIDRs, want) {
		t.Fatalf("cidrs %v, want %v", got.ExcludeOutboundCIDRs, want)
	}
	if got.ConsulDNSIP.IsValid() {
		t.Fatalf("DNS IP should be unset, got %v", got.ConsulDNSIP)
	}
}

func TestValidationErrorsNameFieldAndValue(t *testing.T) {
	base := `"ProxyUserID":"5995","ProxyInboundPort":20000`
	cases := []struct {
		name, json string
		dual       bool
		want       []string // substrings of the error
	}{
		{"missing uid", `{"ProxyInboundPort":20000}`, false, []string{"ProxyUserID is required to set up traffic redirection"}},
		{"missing inbound", `{"ProxyUserID":"5995"}`, false, []string{"ProxyInboundPort is required to set up traffic redirection"}},
		{"uid not digits", `{"ProxyUserID":"-1","ProxyInboundPort":20000}`, false, []string{"ProxyUserID", `"-1"`}},
		{"uid too big", `{"ProxyUserID":"4294967296","ProxyInboundPort":20000}`, false, []string{"ProxyUserID", "4294967296"}},
		{"uid as number", `{"ProxyUserID":5995,"ProxyInboundPort":20000}`, false, []string{"ProxyUserID", "number"}},
		{"inbound out of range", `{"ProxyUserID":"1","ProxyInboundPort":70000}`, false, []string{"ProxyInboundPort", "70000"}},
		{"outbound negative", `{` + base + `,"ProxyOutboundPort":-5}`, false, []string{"ProxyOutboundPort", "-5"}},
		{"dns port", `{` + base + `,"ConsulDNSPort":65536}`, false, []string{"ConsulDNSPort", "65536"}},
		{"port with newline", `{` + base + `,"ExcludeInboundPorts":["80\n-A OUTPUT -j ACCEPT"]}`, false, []string{"ExcludeInboundPorts[0]", `"80\n-A OUTPUT -j ACCEPT"`}},
		{"port with space", `{` + base + `,"ExcludeOutboundPorts":["443","80 -j ACCEPT"]}`, false, []string{"ExcludeOutboundPorts[1]"}},
		{"port option-like", `{` + base + `,"ExcludeOutboundPorts":["--help"]}`, false, []string{"ExcludeOutboundPorts[0]", "--help"}},
		{"port zero", `{` + base + `,"ExcludeInboundPorts":["0"]}`, false, []string{"ExcludeInboundPorts[0]", `"0"`}},
		{"port range reversed", `{` + base + `,"ExcludeInboundPorts":["90:80"]}`, false, []string{"ExcludeInboundPorts[0]", `"90:80"`, "a:b"}},
		{"port range empty", `{` + base + `,"ExcludeInboundPorts":["80:80"]}`, false, []string{"ExcludeInboundPorts[0]", `"80:80"`}},
		{"port range open end", `{` + base + `,"ExcludeOutboundPorts":["80:"]}`, false, []string{"ExcludeOutboundPorts[0]", `"80:"`}},
		{"port range open start", `{` + base + `,"ExcludeOutboundPorts":[":80"]}`, false, []string{"ExcludeOutboundPorts[0]", `":80"`}},
		{"port range zero", `{` + base + `,"ExcludeOutboundPorts":["0:80"]}`, false, []string{"ExcludeOutboundPorts[0]", `"0:80"`}},
		{"port range too big", `{` + base + `,"ExcludeOutboundPorts":["80:65536"]}`, false, []string{"ExcludeOutboundPorts[0]", `"80:65536"`}},
		{"port range three parts", `{` + base + `,"ExcludeOutboundPorts":["80:90:100"]}`, false, []string{"ExcludeOutboundPorts[0]", `"80:90:100"`}},
		{"port range dash", `{` + base + `,"ExcludeOutboundPorts":["80-90"]}`, false, []string{"ExcludeOutboundPorts[0]", `"80-90"`}},
		{"port range injection", `{` + base + `,"ExcludeOutboundPorts":["80:90 -j ACCEPT"]}`, false, []string{"ExcludeOutboundPorts[0]"}},
		{"port range in UIDs", `{` + base + `,"ExcludeUIDs":["5996:5999"]}`, false, []string{"ExcludeUIDs[0]", "5996:5999"}},
		{"uid list", `{` + base + `,"ExcludeUIDs":["5996","root"]}`, false, []string{"ExcludeUIDs[1]", "root"}},
		{"cidr junk", `{` + base + `,"ExcludeOutboundCIDRs":["10.0.0.0/8 ! -d 1.1.1.1"]}`, false, []string{"ExcludeOutboundCIDRs[0]"}},
		{"cidr v6 single", `{` + base + `,"ExcludeOutboundCIDRs":["fd00::/8"]}`, false, []string{"ExcludeOutboundCIDRs[0]", "single-stack"}},
		{"dns ip junk", `{` + base + `,"ConsulDNSIP":"localhost"}`, false, []string{"ConsulDNSIP", "unable to parse consulDNSIP"}},
		{"dns v6 single", `{` + base + `,"ConsulDNSIP":"::1"}`, false, []string{"ConsulDNSIP", "for non dual stack setup ipv4 consulDNSIP required"}},
		{"dns v4 dual", `{` + base + `,"ConsulDNSIP":"127.0.0.1"}`, true, []string{"ConsulDNSIP", "for dual stack ipv6 consulDNSIP required"}},
		{"bad json", `{"ProxyUserID":`, false, []string{"invalid JSON"}},
		{"trailing", `{` + base + `} {}`, false, []string{"trailing data", "offset 48", `"{}"`}},
		{"trailing brace", `{` + base + `}}`, false, []string{"trailing data", "offset 47", `"}"`}},
		{"trailing bracket", `{` + base + `}]`, false, []string{"trailing data", `"]"`}},
		{"trailing text", `{` + base + "}\n x", false, []string{"trailing data", "offset 49", `"x"`}},
		{"duplicate key in other case", `{` + base + `,"proxyuserid":"0"}`, false, []string{`"ProxyUserID"`, `"proxyuserid"`, "same field"}},
		{"duplicate key same case", `{"ProxyInboundPort":20000,"ProxyUserID":"5995","ProxyUserID":"0"}`, false, []string{`"ProxyUserID"`, "same field"}},
		{"duplicate key by unicode folding", `{` + base + `,"ProxyU\u017FerID":"0"}`, false, []string{`"ProxyUserID"`, "same field"}},
		{"duplicate unknown key", `{` + base + `,"IptablesProvider":null,"iptablesprovider":null}`, false, []string{"same field"}},
		{"empty", ``, false, []string{"empty"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseRedirectTrafficConfig([]byte(tc.json), tc.dual)
			if err == nil {
				t.Fatal("expected an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// An annotation with a value that encoding/json matches to a field only by
// Unicode folding ("ſ" folds to "s") is what the Go SDK would read, so it
// is accepted like any other spelling; only two spellings at once are not.
func TestUnicodeFoldedKeyAlone(t *testing.T) {
	got, err := ParseRedirectTrafficConfig([]byte(`{"ProxyU\u017FerID":"7","ProxyInboundPort":20000}`), false)
	if err != nil || got.ProxyUserID != 7 {
		t.Fatalf("got %+v, %v", got, err)
	}
}

func TestPortRanges(t *testing.T) {
	got, err := ParseRedirectTrafficConfig([]byte(`{"ProxyUserID":"5995","ProxyInboundPort":20000,`+
		`"ExcludeInboundPorts":["20200:20300","21000"],"ExcludeOutboundPorts":["1:65535","8000:8001"]}`), false)
	if err != nil {
		t.Fatal(err)
	}
	if want := []PortRange{{20200, 20300}, {21000, 21000}}; !reflect.DeepEqual(got.ExcludeInboundPorts, want) {
		t.Fatalf("inbound %v, want %v", got.ExcludeInboundPorts, want)
	}
	if want := []PortRange{{1, 65535}, {8000, 8001}}; !reflect.DeepEqual(got.ExcludeOutboundPorts, want) {
		t.Fatalf("outbound %v, want %v", got.ExcludeOutboundPorts, want)
	}
	for r, s := range map[PortRange]string{{80, 80}: "80", {8000, 8100}: "8000:8100", {1, 65535}: "1:65535"} {
		if r.String() != s {
			t.Errorf("%+v renders %q, want %q", r, r.String(), s)
		}
	}
	r := PortRange{8000, 8100}
	if !r.Contains(8000) || !r.Contains(8100) || r.Contains(7999) || r.Contains(8101) {
		t.Error("Contains")
	}
	if !PortsContain(got.ExcludeInboundPorts, 20250) || PortsContain(got.ExcludeInboundPorts, 20301) {
		t.Error("PortsContain")
	}
}

func TestListBound(t *testing.T) {
	list := func(n int, item func(i int) string) string {
		var s []string
		for i := 0; i < n; i++ {
			s = append(s, `"`+item(i)+`"`)
		}
		return "[" + strings.Join(s, ",") + "]"
	}
	port := func(i int) string { return strconv.Itoa(1 + i) }
	cidr := func(i int) string { return "10." + strconv.Itoa(i/256) + "." + strconv.Itoa(i%256) + ".0/24" }
	for _, field := range []struct {
		name string
		item func(int) string
	}{{"ExcludeInboundPorts", port}, {"ExcludeOutboundPorts", port}, {"ExcludeOutboundCIDRs", cidr}, {"ExcludeUIDs", port}} {
		doc := func(n int) []byte {
			return []byte(`{"ProxyUserID":"5995","ProxyInboundPort":20000,"` + field.name + `":` + list(n, field.item) + `}`)
		}
		if _, err := ParseRedirectTrafficConfig(doc(MaxListEntries), false); err != nil {
			t.Errorf("%s with %d entries: %v", field.name, MaxListEntries, err)
		}
		_, err := ParseRedirectTrafficConfig(doc(MaxListEntries+1), false)
		if err == nil || !strings.Contains(err.Error(), field.name) || !strings.Contains(err.Error(), "MaxListEntries (1024)") ||
			!strings.Contains(err.Error(), "1025 entries") {
			t.Errorf("%s with %d entries: %v", field.name, MaxListEntries+1, err)
		}
	}
}

func TestDualStackAcceptsBothFamilies(t *testing.T) {
	got, err := ParseRedirectTrafficConfig([]byte(`{"ProxyUserID":"5995","ProxyInboundPort":20000,"ConsulDNSIP":"::1","ExcludeOutboundCIDRs":["10.0.0.0/8","fd00::1/8"]}`), true)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.ExcludeOutboundCIDRs) != 2 || got.ExcludeOutboundCIDRs[1].String() != "fd00::/8" {
		t.Fatalf("cidrs %v", got.ExcludeOutboundCIDRs)
	}
}

func TestPodPredicates(t *testing.T) {
	inj := map[string]string{KeyInjectStatus: InjectStatusInjected}
	tp := map[string]string{KeyInjectStatus: InjectStatusInjected, KeyTransparentProxyStatus: TProxyStatusEnabled}
	if !IsInjected(inj, nil) || !IsInjected(nil, inj) || IsInjected(nil, nil) {
		t.Fatal("IsInjected")
	}
	if !IsInjected(nil, map[string]string{KeyMeshInjectStatus: "injected"}) {
		t.Fatal("mesh-inject-status")
	}
	if UsesTransparentProxy(nil, inj) || !UsesTransparentProxy(nil, tp) || UsesTransparentProxy(nil, map[string]string{KeyTransparentProxyStatus: "enabled"}) {
		t.Fatal("UsesTransparentProxy")
	}
	if !IsComplete("complete") || !IsComplete("completed") || IsComplete("enabled") || IsComplete("waiting") {
		t.Fatal("IsComplete")
	}
	for v, want := range map[string]bool{"": false, "true": true, "True": true, "false": false} {
		got, err := DualStack(map[string]string{KeyDualStack: v})
		if err != nil || got != want {
			t.Fatalf("DualStack(%q) = %v, %v", v, got, err)
		}
	}
	if _, err := DualStack(map[string]string{KeyDualStack: "yes"}); err == nil || !strings.Contains(err.Error(), KeyDualStack) {
		t.Fatalf("DualStack(yes) error %v", err)
	}
	if v, err := DualStack(nil); v || err != nil {
		t.Fatal("missing dual-stack must mean single stack")
	}
}
