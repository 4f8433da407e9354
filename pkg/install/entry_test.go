package install

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
)

// The entry carries exclude_namespaces only when it is set, and the plugin
// reads it under that key.
func TestEntryExcludeNamespaces(t *testing.T) {
	n := newHostDirs(t)
	if b := n.installer(t).Entry().JSON(); strings.Contains(string(b), "exclude_namespaces") {
		t.Fatalf("unset but written: %s", b)
	}
	b := n.installer(t, func(c *Config) { c.ExcludeNamespaces = []string{"kube-system", "infra"} }).Entry().JSON()
	var e struct {
		Exclude []string `json:"exclude_namespaces"`
	}
	if err := json.Unmarshal(b, &e); err != nil || strings.Join(e.Exclude, ",") != "kube-system,infra" {
		t.Fatalf("entry %s (%v)", b, err)
	}
}

// The entry carries backend only when it is set, under the plugin's key; a
// backend the plugin does not know is refused naming the field.
func TestEntryBackend(t *testing.T) {
	n := newHostDirs(t)
	if b := n.installer(t).Entry().JSON(); strings.Contains(string(b), `"`+cniconf.KeyBackend+`"`) {
		t.Fatalf("unset but written: %s", b)
	}
	b := n.installer(t, func(c *Config) { c.Backend = cniconf.BackendNftables }).Entry().JSON()
	var e map[string]any
	if err := json.Unmarshal(b, &e); err != nil || e[cniconf.KeyBackend] != "nftables" {
		t.Fatalf("entry %s (%v)", b, err)
	}
	cfg := Config{BinDir: "/b", NetDir: "/n", HostBinDir: "/hb", HostNetDir: "/hn", Backend: "nft"}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "Backend") || !strings.Contains(err.Error(), `"nft"`) {
		t.Fatalf("Validate = %v", err)
	}
}
