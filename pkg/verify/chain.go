package verify

import (
	"fmt"
	"path/filepath"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/conflist"
)

// ChainIn returns a check of the node's CNI chain in the configuration
// directory dir, judged as the runtime loads it (conflist.ScanConfDir,
// conflist.Primary): OK when the runtime's network ends with one consul-cni
// entry, ours or consul-k8s's (both have that type).
func ChainIn(dir string) func() ChainState {
	return func() ChainState {
		cands, err := conflist.ScanConfDir(dir)
		if err != nil {
			return ChainState{Detail: err.Error()}
		}
		primary, _, ok := conflist.Primary(cands)
		if !ok {
			return ChainState{Detail: "no valid CNI network configuration in " + dir}
		}
		e := conflist.FindEntry(primary.Network)
		if !e.Last {
			return ChainState{Detail: fmt.Sprintf("the runtime's network %s does not end with one %s entry (%d of %d plugins are %s)",
				filepath.Base(primary.Path), cniconf.PluginType, e.Count, e.Plugins, cniconf.PluginType)}
		}
		return ChainState{OK: true, Detail: filepath.Base(primary.Path) + " ends with " + cniconf.PluginType}
	}
}
