package initcheck_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/initcheck"
)

// SentPackets sums what the namespace's interfaces other than the loopback
// sent or failed to send (transmit packets, errors, drops), from
// /proc/net/dev's format; anything it cannot read is not a count.
func TestSentPackets(t *testing.T) {
	const header = "Inter-|   Receive                                                |  Transmit\n" +
		" face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n"
	cases := []struct {
		name string
		text string
		sum  uint64
		ok   bool
	}{
		{"the loopback is left out, every other interface's transmit packets, errors and drops count", header +
			"    lo: 2806 1488 0 0 0 0 0 0 2806 1488 0 0 0 0 0 0\n" +
			"  eth0: 9000 70 1 2 0 0 0 0 5000 40 3 4 0 0 0 0\n" +
			"    d0:    0  0 0 0 0 0 0 0  100  2 0 0 0 0 0 0\n", 40 + 3 + 4 + 2, true},
		{"a namespace with the loopback alone sent nothing", header + "    lo: 1 1 0 0 0 0 0 0 1 1 0 0 0 0 0 0\n", 0, true},
		{"a line with too few counters is not read", header + "  eth0: 1 2 3\n", 0, false},
		{"a counter that is not a number is not read", header + "  eth0: 0 0 0 0 0 0 0 0 0 x 0 0 0 0 0 0\n", 0, false},
		{"a file without its header is not read", "", 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "dev")
			if err := os.WriteFile(path, []byte(tc.text), 0o644); err != nil {
				t.Fatal(err)
			}
			sum, ok := initcheck.SentPackets(path)
			if sum != tc.sum || ok != tc.ok {
				t.Fatalf("SentPackets = %d, %v; want %d, %v", sum, ok, tc.sum, tc.ok)
			}
		})
	}
	if _, ok := initcheck.SentPackets(filepath.Join(t.TempDir(), "missing")); ok {
		t.Fatal("a missing file read as a count")
	}
}
