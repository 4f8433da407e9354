package plugin

import (
	"slices"
	"testing"
)

// FuzzParseConfig: no input makes parseConfig panic, and an accepted
// configuration always has a supported version, bounded positive timeouts
// and an absolute state directory. Seeds: testdata/fuzz/FuzzParseConfig.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(conflistEntry("1.0.0", "")))
	f.Add([]byte(`{"cniVersion":"0.3.1","name":"n","type":"consul-cni","multus":true}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := parseConfig(data)
		if err != nil {
			return
		}
		if !slices.Contains(SupportedVersions, c.CNIVersion) {
			t.Fatalf("version %q accepted", c.CNIVersion)
		}
		if c.apiTimeout <= 0 || c.apiTimeout > maxTimeout || c.iptablesTimeout <= 0 || c.iptablesTimeout > maxTimeout {
			t.Fatalf("timeouts %v %v", c.apiTimeout, c.iptablesTimeout)
		}
		if c.StateDir == "" || c.StateDir[0] != '/' {
			t.Fatalf("state dir %q", c.StateDir)
		}
	})
}
