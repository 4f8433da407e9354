// Package podnet is what every test node, simulated (tests/harness/simnode)
// or real (tests/harness/realnode), shares about its pod network, so the two
// node harnesses import it rather than each other:
//
//   - the node's pod subnet: a /24 of the test process's address slot
//     (tests/harness/testnet), handed out by AllocSubnet from one table, so a
//     simulated and a real node of the same process never share one;
//   - its primary network: the conflist Conflist writes (ptp with host-local
//     in that /24, no masquerading), made of the reference plugins Plugins
//     names;
//   - the plugins' installation into the node's CNI bin directory
//     (CopyExecutable, atomic, so a runtime never executes half a file).
package podnet

import (
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"sync"
)

// Pod subnets: /24s 0..13 of the slot (14 holds the external services and
// 15 the host links of tests/harness/testnet).
const maxSubnets = 14

// NetworkName is the network name of the primary conflist.
const NetworkName = "ccr-pods"

// Plugins are the reference CNI plugins the primary network runs (loopback
// for the network containerd's CRI plugin always sets up first).
var Plugins = []string{"ptp", "host-local", "loopback"}

var (
	subnetMu   sync.Mutex
	subnetUsed [maxSubnets]bool
)

// AllocSubnet reserves a free pod subnet index of the slot (the i of
// testnet.Range.Subnet4(i, 24)), released by the returned function.
func AllocSubnet() (int, func(), error) {
	subnetMu.Lock()
	defer subnetMu.Unlock()
	for i := range subnetUsed {
		if !subnetUsed[i] {
			subnetUsed[i] = true
			return i, func() { subnetMu.Lock(); subnetUsed[i] = false; subnetMu.Unlock() }, nil
		}
	}
	return 0, nil, fmt.Errorf("all %d pod subnets of the address slot are in use", maxSubnets)
}

// Conflist is the primary network's conflist: ptp (MTU 1500, no
// masquerading) with host-local giving addresses of subnet, its state in
// dataDir, and a default route through the node.
func Conflist(dataDir string, subnet netip.Prefix) []byte {
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       NetworkName,
		"plugins": []any{
			map[string]any{
				"type":   "ptp",
				"ipMasq": false,
				"mtu":    1500,
				"ipam": map[string]any{
					"type":    "host-local",
					"ranges":  [][]map[string]string{{{"subnet": subnet.Masked().String()}}},
					"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
					"dataDir": dataDir,
				},
			},
		},
	}
	b, _ := json.MarshalIndent(conf, "", "  ")
	return append(b, '\n')
}

// CopyExecutable copies an executable atomically (write aside, rename).
func CopyExecutable(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp := dst + ".tmp"
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		os.Remove(tmp)
		return err
	}
	if err := out.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, dst)
}
