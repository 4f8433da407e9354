//go:build privileged

package sdkcorpus_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/iptables"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/iptables/iptablestest"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/sdkoracle"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

// oursStricterIPTables are the mutations whose value the iptables tools
// accept but the plugin refuses on purpose (it never hands an annotation
// string to iptables unchecked): the SDK applies these, the plugin fails
// closed.
var oursStricterIPTables = map[string]string{
	"uid-name":          "iptables resolves user names in --uid-owner; the annotation carries numeric UIDs",
	"port-service-name": "iptables resolves service names in --dport",
	"port-zero":         "iptables takes port 0 in --dport, which no TCP connection uses",
	"range-equal":       "iptables takes a:a, a range of one port; write the port",
	"range-open":        "iptables takes an open range a: (a to 65535)",
	"port-space":        "iptables skips leading spaces in a port",
	"cidr-garbage":      "iptables takes a comma-separated list of addresses in -d (a rule each)",
}

// iptablesAllowed is the policy: valid configs give equal tables (a
// dual-stack CIDR list, which the SDK cannot apply, family by family);
// invalid ones are refused by both, except the documented stricter checks.
func iptablesAllowed(c sdkoracle.Case, outcome string) bool {
	switch outcome {
	case equal, bothReject:
		return true
	case splitEqual:
		return c.Mutation == ""
	case sdkOnly:
		return oursStricterIPTables[c.Mutation] != ""
	}
	return false
}

type iptWorker struct {
	sdk, ours *testnet.Netns
	variant   iptables.Variant
}

// TestIPTablesCorpusMatchesSDK applies each configuration of the corpus
// with SDK v0.18.1's own commands (one iptables exec per rule, as the SDK
// runs them) in one namespace and through pkg/redirect/iptables (the plugin's
// parse, build and atomic restore) in another, with the host's iptables
// variant, and compares the IPv4 and IPv6 nat tables.
func TestIPTablesCorpusMatchesSDK(t *testing.T) {
	r := requireRoot(t)
	variant, auto, err := iptables.ParseVariant(*corpusVariant)
	if err != nil {
		t.Fatalf("-corpus.iptables-variant: %v", err)
	}
	why := "-corpus.iptables-variant"
	if auto {
		variant, why = iptables.VariantDetector{}.Detect(context.Background())
	}
	cases := sdkoracle.Corpus(*corpusSeed, *corpusN)
	in := make([]sdkoracle.Input, 0, 3*len(cases))
	for _, c := range cases {
		v4, v6 := splitCIDRs(t, c)
		in = append(in, c.Input(), v4, v6)
	}
	sdk := sdkoracle.IPTables(t, in)
	start := time.Now()
	res := pool(t, len(cases), func(w int) iptWorker {
		return iptWorker{r.NewNetns(t, fmt.Sprintf("sdk%d", w)), r.NewNetns(t, fmt.Sprintf("ours%d", w)), variant}
	}, func(w iptWorker, i int) result {
		return w.run(cases[i], sdk[3*i], sdk[3*i+1], sdk[3*i+2])
	})
	t.Logf("iptables variant %s (%s)", variant, why)
	report(t, cases, res, iptablesAllowed, time.Since(start))
}

// splitCIDRs returns the case with only its IPv4 and only its IPv6
// excluded CIDRs (the case itself when it has no CIDR list).
func splitCIDRs(t *testing.T, c sdkoracle.Case) (v4, v6 sdkoracle.Input) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(c.JSON), &m); err != nil {
		return c.Input(), c.Input()
	}
	key := ""
	for k := range m {
		if strings.EqualFold(k, "ExcludeOutboundCIDRs") {
			key = k
		}
	}
	var cidrs []string
	if key == "" || json.Unmarshal(m[key], &cidrs) != nil || len(cidrs) == 0 {
		return c.Input(), c.Input()
	}
	var l4, l6 []string
	for _, s := range cidrs {
		if p, err := netip.ParsePrefix(s); err == nil && p.Addr().Is6() {
			l6 = append(l6, s)
		} else if a, err := netip.ParseAddr(s); err == nil && a.Is6() {
			l6 = append(l6, s)
		} else {
			l4 = append(l4, s)
		}
	}
	with := func(l []string) sdkoracle.Input {
		n := map[string]json.RawMessage{}
		for k, v := range m {
			n[k] = v
		}
		n[key], _ = json.Marshal(l)
		b, err := json.Marshal(n)
		if err != nil {
			t.Fatal(err)
		}
		return sdkoracle.Input{Config: b, DualStack: c.DualStack}
	}
	return with(l4), with(l6)
}

func (w iptWorker) run(c sdkoracle.Case, sdk, sdk4, sdk6 sdkoracle.IPTablesResult) result {
	defer w.reset()
	oursErr := w.applyOurs(c)
	sdkErr := sdk.Error
	if sdkErr == "" {
		sdkErr = w.replay(sdk.Commands)
	}
	switch {
	case oursErr != "" && sdkErr != "":
		return result{outcome: bothReject}
	case oursErr != "":
		return result{outcome: sdkOnly, detail: "ours: " + oursErr}
	case sdkErr != "" && c.DualStack && sdk.Error == "" && sdk4.Error == "" && sdk6.Error == "":
		// The SDK hands every CIDR to both tools; compare family by family
		// with the SDK given only that family's CIDRs.
		w.resetSDK()
		if err := w.replay(append(sdk4.Family("iptables"), sdk6.Family("ip6tables")...)); err != "" {
			return result{outcome: oursOnly, detail: "sdk: " + sdkErr + "\nsdk, one family at a time: " + err}
		}
		if d := w.compare(); d != "" {
			return result{outcome: differ, detail: d}
		}
		return result{outcome: splitEqual}
	case sdkErr != "":
		return result{outcome: oursOnly, detail: "sdk: " + sdkErr}
	}
	if d := w.compare(); d != "" {
		return result{outcome: differ, detail: d}
	}
	return result{outcome: equal}
}

// applyOurs is the plugin's path: parse and validate the annotation, build
// the rule sets, apply them atomically.
func (w iptWorker) applyOurs(c sdkoracle.Case) string {
	cfg, err := annotations.ParseRedirectTrafficConfig([]byte(c.JSON), c.DualStack)
	if err != nil {
		return err.Error()
	}
	ex := &iptables.NetnsExecutor{NetNS: w.ours.Path, Variant: w.variant}
	if err := iptables.Apply(context.Background(), ex, iptables.Build(cfg)); err != nil {
		return err.Error()
	}
	return ""
}

// replay applies the SDK's commands in its namespace. The SDK runs one
// iptables process per command; here the same commands, in the same order,
// go through one restore per family (a line per command, grouped by table),
// which leaves the same rules in the kernel for a tenth of the processes
// (command by command, 2,000 configurations on two backends took 12
// minutes). Only whether the SDK's commands apply matters to an outcome,
// not how far they got, so a refused restore counts as the SDK failing; the
// message names the command the tool refused.
func (w iptWorker) replay(cmds [][]string) string {
	var msg string
	err := redirect.InNetns(w.sdk.Path, func() error {
		for _, fam := range redirect.Families {
			tool := "iptables"
			if fam == redirect.IPv6 {
				tool = "ip6tables"
			}
			var own [][]string
			for _, c := range cmds {
				if c[0] == tool {
					own = append(own, c)
				}
			}
			if len(own) == 0 {
				continue
			}
			in, lineCmd := restoreInput(own)
			cmd := exec.Command(w.variant.Command(fam, "restore"), "--noflush")
			cmd.Stdin = strings.NewReader(in)
			if out, err := cmd.CombinedOutput(); err != nil {
				msg = fmt.Sprintf("%s: %v: %s", refused(own, lineCmd, out), err, strings.TrimSpace(string(out)))
				return nil
			}
		}
		return nil
	})
	if err != nil {
		return err.Error()
	}
	return msg
}

// restoreInput writes commands of one tool ([tool, args...], "-t TABLE"
// anywhere in args, filter by default) as restore input: a section per
// table, in the order the tables first appear, each command a line in its
// order. lineCmd maps an input line (1-based) to its command's index, -1
// for the section lines.
func restoreInput(cmds [][]string) (string, []int) {
	type line struct {
		text string
		cmd  int
	}
	sections := map[string][]line{}
	var tables []string
	for i, c := range cmds {
		table, args := "filter", []string(nil)
		for j := 1; j < len(c); j++ {
			if (c[j] == "-t" || c[j] == "--table") && j+1 < len(c) {
				table = c[j+1]
				j++
				continue
			}
			args = append(args, restoreQuote(c[j]))
		}
		if _, ok := sections[table]; !ok {
			tables = append(tables, table)
		}
		sections[table] = append(sections[table], line{strings.Join(args, " "), i})
	}
	var b strings.Builder
	lineCmd := []int{-1} // line numbers start at 1
	for _, t := range tables {
		b.WriteString("*" + t + "\n")
		lineCmd = append(lineCmd, -1)
		for _, l := range sections[t] {
			b.WriteString(l.text + "\n")
			lineCmd = append(lineCmd, l.cmd)
		}
		b.WriteString("COMMIT\n")
		lineCmd = append(lineCmd, -1)
	}
	return b.String(), lineCmd
}

// restoreQuote quotes an argument for the restore parser when it holds a
// blank or a quote.
func restoreQuote(s string) string {
	if !strings.ContainsAny(s, " \t\"'") {
		return s
	}
	return `"` + strings.ReplaceAll(strings.ReplaceAll(s, `\`, `\\`), `"`, `\"`) + `"`
}

// refused names the command at the line a restore's output reports
// ("Error occurred at line: N"), or all of them when it names none.
func refused(cmds [][]string, lineCmd []int, out []byte) string {
	const marker = "Error occurred at line: "
	if i := strings.Index(string(out), marker); i >= 0 {
		var n int
		if _, err := fmt.Sscanf(string(out[i+len(marker):]), "%d", &n); err == nil && n > 0 && n < len(lineCmd) && lineCmd[n] >= 0 {
			return fmt.Sprintf("%q", cmds[lineCmd[n]])
		}
	}
	return fmt.Sprintf("%q", cmds)
}

func (w iptWorker) compare() string {
	var b strings.Builder
	for _, fam := range redirect.Families {
		ours, err1 := (&iptables.NetnsExecutor{NetNS: w.ours.Path, Variant: w.variant}).Save(context.Background(), fam)
		sdk, err2 := (&iptables.NetnsExecutor{NetNS: w.sdk.Path, Variant: w.variant}).Save(context.Background(), fam)
		if err1 != nil || err2 != nil {
			return fmt.Sprintf("%s save: %v %v", fam, err1, err2)
		}
		if o, s := iptablestest.Normalize(ours), iptablestest.Normalize(sdk); o != s {
			fmt.Fprintf(&b, "%s nat table:\n%s", fam, lineDiff(o, s))
		}
	}
	return b.String()
}

func (w iptWorker) resetSDK() { flush(w.sdk.Path, w.variant) }

func (w iptWorker) reset() {
	flush(w.sdk.Path, w.variant)
	flush(w.ours.Path, w.variant)
}

// flush empties the nat table of both families (a restore without
// --noflush: every chain flushed, user chains deleted).
func flush(ns string, b iptables.Variant) {
	redirect.InNetns(ns, func() error {
		for _, fam := range redirect.Families {
			cmd := exec.Command(b.Command(fam, "restore"))
			cmd.Stdin = strings.NewReader("*nat\nCOMMIT\n")
			cmd.Run()
		}
		return nil
	})
}
