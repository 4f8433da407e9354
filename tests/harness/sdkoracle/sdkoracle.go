// Package sdkoracle asks Consul's own SDK what it does for redirect
// configurations, so tests compare the plugin's tables with the SDK's
// rather than with a copy of its logic.
//
// Two SDK versions cannot share one go.mod, and the SDK must stay out of
// the main module, so each version lives in a small module of its own
// under tests/sdkoracle: iptables (SDK v0.18.1, package iptables, the
// version consul-k8s pins) and nftables (SDK v0.19.0, package nftables,
// which needs a newer Go than the main module: it is built with the
// toolchain its go.mod names, or $CCR_SDK_NFT_GOTOOLCHAIN). Each is a
// program reading configs as JSON lines and writing what the SDK produced;
// this package builds them with testbin and talks to them.
package sdkoracle

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
)

// Module directories (relative to the repository root) of the two oracles.
const (
	IPTablesModule = "tests/sdkoracle/iptables"
	NFTablesModule = "tests/sdkoracle/nftables"
)

// EnvNFTToolchain, when set, is the GOTOOLCHAIN the nftables oracle is
// built with (the Makefile sets it); otherwise the toolchain line of its
// go.mod is used (GOTOOLCHAIN=auto).
const EnvNFTToolchain = "CCR_SDK_NFT_GOTOOLCHAIN"

// TB is the part of testing.TB the package uses.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// Input is one configuration: the redirect-traffic-config annotation as
// written on the pod, and the dual-stack flag.
type Input struct {
	Config    json.RawMessage `json:"config"`
	DualStack bool            `json:"dualStack"`
}

// IPTablesResult is what SDK v0.18.1's iptables.Setup did for an Input:
// the commands it would have executed, in order ("iptables" or "ip6tables"
// first), and its error ("" when it accepted the config). Commands may be
// non-empty with an error (Setup stops after the IPv4 pass).
type IPTablesResult struct {
	Commands [][]string `json:"commands"`
	Error    string     `json:"error"`
}

// Family returns the commands run with tool ("iptables" or "ip6tables").
func (r IPTablesResult) Family(tool string) [][]string {
	var out [][]string
	for _, c := range r.Commands {
		if c[0] == tool {
			out = append(out, c)
		}
	}
	return out
}

// NFTablesResult is what SDK v0.19.0's nftables.Setup did for an Input:
// the script it would have piped to `nft -f -`, and its error.
type NFTablesResult struct {
	Script string `json:"script"`
	Error  string `json:"error"`
}

// IPTablesBinary builds (once per test process) the iptables oracle.
func IPTablesBinary(tb TB) string {
	tb.Helper()
	return testbin.Module(tb, "sdkoracle-iptables", IPTablesModule)
}

// NFTablesBinary builds (once per test process) the nftables oracle.
func NFTablesBinary(tb TB) string {
	tb.Helper()
	tc := os.Getenv(EnvNFTToolchain)
	if tc == "" {
		tc = "auto"
	}
	return testbin.Module(tb, "sdkoracle-nftables", NFTablesModule, "GOTOOLCHAIN="+tc)
}

// IPTables returns SDK v0.18.1's commands for each input, in one run of
// the oracle.
func IPTables(tb TB, in []Input) []IPTablesResult {
	tb.Helper()
	return query[IPTablesResult](tb, IPTablesBinary(tb), in)
}

// NFTables returns SDK v0.19.0's script for each input, in one run of the
// oracle.
func NFTables(tb TB, in []Input) []NFTablesResult {
	tb.Helper()
	return query[NFTablesResult](tb, NFTablesBinary(tb), in)
}

// Fields returns the names and Go types of the SDK Config's fields, as the
// oracle binary bin reports them.
func Fields(tb TB, bin string) map[string]string {
	tb.Helper()
	out, err := exec.Command(bin, "-fields").Output()
	if err != nil {
		tb.Fatalf("%s -fields: %v", bin, err)
	}
	m := map[string]string{}
	if err := json.Unmarshal(out, &m); err != nil {
		tb.Fatalf("%s -fields: %v", bin, err)
	}
	return m
}

func query[R any](tb TB, bin string, in []Input) []R {
	tb.Helper()
	var stdin bytes.Buffer
	enc := json.NewEncoder(&stdin)
	for _, i := range in {
		if err := enc.Encode(i); err != nil {
			tb.Fatalf("sdkoracle: encoding input: %v", err)
		}
	}
	cmd := exec.Command(bin)
	cmd.Stdin = &stdin
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		tb.Fatalf("sdkoracle: %s: %v\n%s", bin, err, stderr.Bytes())
	}
	res := make([]R, 0, len(in))
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var r R
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			tb.Fatalf("sdkoracle: %s: output line %d: %v", bin, len(res)+1, err)
		}
		res = append(res, r)
	}
	if len(res) != len(in) {
		tb.Fatalf("sdkoracle: %s: %d results for %d inputs", bin, len(res), len(in))
	}
	return res
}

// One returns SDK v0.18.1's commands for one annotation value.
func One(tb TB, config string, dualStack bool) IPTablesResult {
	tb.Helper()
	r := IPTables(tb, []Input{{Config: json.RawMessage(config), DualStack: dualStack}})[0]
	if r.Error != "" {
		tb.Fatalf("the SDK refuses %s (dual stack %v): %s", config, dualStack, r.Error)
	}
	return r
}
