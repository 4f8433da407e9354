//go:build privileged

package sdkcorpus_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/nftables"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/sdkoracle"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

// oursStricterNFTables are the mutations whose value SDK v0.19.0 accepts
// (it resolves and normalises more than the annotation parser takes) but
// the plugin refuses on purpose.
var oursStricterNFTables = map[string]string{
	"port-service-name": "the SDK resolves service names through /etc/services",
	"port-zero":         "the SDK takes port 0, which no TCP connection uses",
	"range-equal":       "the SDK takes a:a, a range of one port; write the port",
	"range-open":        "the SDK completes an open range a: to a-65535",
	"port-space":        "the SDK trims spaces around a port",
	"cidr-wrong-family": "the SDK puts an IPv6 CIDR in a single-stack (IPv4) pod's table",
}

func nftablesAllowed(c sdkoracle.Case, outcome string) bool {
	switch outcome {
	case equal, bothReject:
		return true
	case sdkOnly:
		return oursStricterNFTables[c.Mutation] != ""
	}
	return false
}

type nftWorker struct{ sdk, ours *testnet.Netns }

// TestNFTablesCorpusMatchesSDK applies each configuration of the corpus
// with SDK v0.19.0's own script (`nft -f -`, as the SDK applies it) in one
// namespace and with the native backend (pkg/redirect/nftables over
// netlink) in another, and compares `nft -j list table inet consul_tproxy`
// with handles and the listing's metainfo left out.
func TestNFTablesCorpusMatchesSDK(t *testing.T) {
	r := requireNft(t)
	cases := sdkoracle.Corpus(*corpusSeed, *corpusN)
	in := make([]sdkoracle.Input, len(cases))
	for i, c := range cases {
		in[i] = c.Input()
	}
	sdk := sdkoracle.NFTables(t, in)
	start := time.Now()
	res := pool(t, len(cases), func(w int) nftWorker {
		return nftWorker{r.NewNetns(t, fmt.Sprintf("nsdk%d", w)), r.NewNetns(t, fmt.Sprintf("nours%d", w))}
	}, func(w nftWorker, i int) result {
		return w.run(cases[i], sdk[i])
	})
	report(t, cases, res, nftablesAllowed, time.Since(start))
}

// TestNFTablesOracleScriptsApply runs the SDK side alone over the corpus:
// every script SDK v0.19.0 produces for a valid configuration must apply
// with nft and list the table with its seven chains.
func TestNFTablesOracleScriptsApply(t *testing.T) {
	r := requireNft(t)
	cases := sdkoracle.Corpus(*corpusSeed, min(*corpusN, 200))
	var in []sdkoracle.Input
	for _, c := range cases {
		if c.Mutation == "" {
			in = append(in, c.Input())
		}
	}
	ns := r.NewNetns(t, "nsdk")
	for i, res := range sdkoracle.NFTables(t, in) {
		if res.Error != "" {
			t.Errorf("the SDK refuses the valid %s: %s", in[i].Config, res.Error)
			continue
		}
		if msg := applyScript(ns.Path, res.Script); msg != "" {
			t.Errorf("nft -f refuses the SDK's script for %s: %s", in[i].Config, msg)
			continue
		}
		js, err := listTable(ns.Path)
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count("\n"+js, "\n"+`{"chain":{`); n != 7 {
			t.Errorf("%d chains after the SDK's script for %s:\n%s", n, in[i].Config, js)
		}
		flushRuleset(ns.Path)
	}
}

func requireNft(t *testing.T) *testnet.Range {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("nft not installed (make deps)")
	}
	return requireRoot(t)
}

func (w nftWorker) run(c sdkoracle.Case, sdk sdkoracle.NFTablesResult) result {
	defer flushRuleset(w.sdk.Path)
	defer flushRuleset(w.ours.Path)
	oursErr := ""
	if cfg, err := annotations.ParseRedirectTrafficConfig([]byte(c.JSON), c.DualStack); err != nil {
		oursErr = err.Error()
	} else if err := nftables.Apply(context.Background(), w.ours.Path, nftables.Build(cfg)); err != nil {
		oursErr = err.Error()
	}
	sdkErr := sdk.Error
	if sdkErr == "" {
		sdkErr = applyScript(w.sdk.Path, sdk.Script)
	}
	switch {
	case oursErr != "" && sdkErr != "":
		return result{outcome: bothReject}
	case oursErr != "":
		return result{outcome: sdkOnly, detail: "ours: " + oursErr}
	case sdkErr != "":
		return result{outcome: oursOnly, detail: "sdk: " + sdkErr}
	}
	ours, err1 := listTable(w.ours.Path)
	theirs, err2 := listTable(w.sdk.Path)
	if err1 != nil || err2 != nil {
		return result{outcome: differ, detail: fmt.Sprintf("listing: ours %v, sdk %v", err1, err2)}
	}
	if ours != theirs {
		return result{outcome: differ, detail: "nft -j list table inet consul_tproxy:\n" + lineDiff(ours, theirs) + "sdk script:\n" + sdk.Script}
	}
	return result{outcome: equal}
}

// applyScript pipes the script to `nft -f -` in the namespace, as the SDK's
// executor does; it returns nft's complaint, "" on success.
func applyScript(ns, script string) string {
	var msg string
	err := redirect.InNetns(ns, func() error {
		cmd := exec.Command("nft", "-f", "-")
		cmd.Stdin = strings.NewReader(script)
		if out, err := cmd.CombinedOutput(); err != nil {
			msg = fmt.Sprintf("nft -f: %v: %s", err, strings.TrimSpace(string(out)))
		}
		return nil
	})
	if err != nil {
		return err.Error()
	}
	return msg
}

func flushRuleset(ns string) {
	redirect.InNetns(ns, func() error { return exec.Command("nft", "flush", "ruleset").Run() })
}

// listTable is `nft -j list table inet consul_tproxy` normalised for
// comparison: one line per listed object (table, chain, rule) in nft's
// order, keys sorted, without handles and without the metainfo object
// (nft's version).
func listTable(ns string) (string, error) {
	var out []byte
	err := redirect.InNetns(ns, func() error {
		var err error
		out, err = exec.Command("nft", "-j", "list", "table", "inet", nftables.TableName).Output()
		return err
	})
	if err != nil {
		return "", fmt.Errorf("nft -j list table: %w", err)
	}
	return NormalizeNftJSON(out)
}

// NormalizeNftJSON is the comparison form of an `nft -j list` output.
func NormalizeNftJSON(in []byte) (string, error) {
	var doc struct {
		Nftables []map[string]any `json:"nftables"`
	}
	if err := json.Unmarshal(in, &doc); err != nil {
		return "", err
	}
	var b strings.Builder
	for _, obj := range doc.Nftables {
		if _, ok := obj["metainfo"]; ok {
			continue
		}
		line, err := json.Marshal(stripHandles(obj))
		if err != nil {
			return "", err
		}
		b.Write(line)
		b.WriteByte('\n')
	}
	return b.String(), nil
}

func stripHandles(v any) any {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			if k == "handle" {
				delete(v, k)
				continue
			}
			v[k] = stripHandles(e)
		}
	case []any:
		for i, e := range v {
			v[i] = stripHandles(e)
		}
	}
	return v
}
