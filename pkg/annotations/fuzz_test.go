package annotations

import (
	"encoding/json"
	"strings"
	"testing"
)

// FuzzParseRedirectTrafficConfig: the parser never panics; an accepted
// config is one JSON value with no two keys equal under case folding, has
// its required fields, in-range ports and port ranges, lists of at most
// MaxListEntries, a DNS address of the right family; a rejected one has an
// error that names the annotation. Seeds:
// testdata/fuzz/FuzzParseRedirectTrafficConfig.
func FuzzParseRedirectTrafficConfig(f *testing.F) {
	f.Add([]byte(upstreamDefault), false)
	f.Add([]byte(`{"ProxyUserID":"1","ProxyInboundPort":2,"ConsulDNSIP":"::1"}`), true)
	f.Fuzz(func(t *testing.T, data []byte, dual bool) {
		cfg, err := ParseRedirectTrafficConfig(data, dual)
		if err != nil {
			if !strings.Contains(err.Error(), KeyRedirectTrafficConfig) {
				t.Fatalf("error does not name the annotation: %v", err)
			}
			return
		}
		if cfg.ProxyInboundPort == 0 || cfg.ProxyOutboundPort == 0 || cfg.DualStack != dual {
			t.Fatalf("accepted %+v", cfg)
		}
		for _, p := range append(append([]PortRange(nil), cfg.ExcludeInboundPorts...), cfg.ExcludeOutboundPorts...) {
			if p.First == 0 || p.First > p.Last {
				t.Fatalf("port range %+v accepted from %q", p, data)
			}
		}
		for _, n := range []int{len(cfg.ExcludeInboundPorts), len(cfg.ExcludeOutboundPorts), len(cfg.ExcludeOutboundCIDRs), len(cfg.ExcludeUIDs)} {
			if n > MaxListEntries {
				t.Fatalf("a list of %d entries accepted", n)
			}
		}
		// Accepted input is one object with no trailing data and no two
		// keys that name the same field.
		if !json.Valid(data) {
			t.Fatalf("accepted input that is not one JSON value: %q", data)
		}
		var obj map[string]json.RawMessage
		if json.Unmarshal(data, &obj) == nil {
			folded := map[string]bool{}
			for k := range obj {
				if folded[foldKey(k)] {
					t.Fatalf("accepted duplicate key %q in %q", k, data)
				}
				folded[foldKey(k)] = true
			}
		}
		if cfg.ConsulDNSIP.IsValid() && cfg.ConsulDNSIP.Is6() != dual {
			t.Fatalf("DNS IP %v accepted with dual=%v", cfg.ConsulDNSIP, dual)
		}
		for _, c := range cfg.ExcludeOutboundCIDRs {
			if c != c.Masked() || (!dual && !c.Addr().Is4()) || c.Addr().Is4In6() {
				t.Fatalf("CIDR %v accepted (dual=%v)", c, dual)
			}
		}
	})
}
