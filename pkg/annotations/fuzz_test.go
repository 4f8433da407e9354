package annotations

import (
	"strings"
	"testing"
)

// FuzzParseRedirectTrafficConfig: the parser never panics; an accepted
// config has its required fields, in-range ports, DNS address of the right
// family; a rejected one has an error that names the annotation. Seeds:
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
		for _, p := range append(append([]uint16(nil), cfg.ExcludeInboundPorts...), cfg.ExcludeOutboundPorts...) {
			if p == 0 {
				t.Fatalf("port 0 accepted from %q", data)
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
