// Package conflisttest holds the network configurations the installer's
// tests chain into: a kindnet list as kind writes it, a consul-cni entry,
// and a way to lay files out in a net directory.
package conflisttest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
)

// Kindnet is kind's network: ptp with host-local, then portmap.
const Kindnet = `{
  "cniVersion": "0.3.1",
  "name": "kindnet",
  "plugins": [
    {"type": "ptp", "ipMasq": false, "mtu": 1500,
     "ipam": {"type": "host-local", "dataDir": "/run/cni-ipam-state", "ranges": [[{"subnet": "10.244.0.0/24"}]]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}`

// Entry is a consul-cni chain entry with the host's default directories.
var Entry = func() []byte {
	b, err := json.Marshal(struct {
		Name string `json:"name"`
		Type string `json:"type"`
		cniconf.Settings
	}{cniconf.PluginName, cniconf.PluginType, cniconf.Settings{CNIBinDir: "/opt/cni/bin", CNINetDir: "/etc/cni/net.d",
		Kubeconfig: cniconf.KubeconfigFileName, LogLevel: "info"}})
	if err != nil {
		panic(err)
	}
	return b
}()

// WriteFiles writes each file (name relative to dir, directories made as
// needed) with its content.
func WriteFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
