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
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/redirecttest"
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
	backend   redirect.Backend
}

// TestIPTablesCorpusMatchesSDK applies each configuration of the corpus
// with SDK v0.18.1's own commands (one iptables exec per rule, as the SDK
// runs them) in one namespace and through pkg/redirect (the plugin's
// parse, build and atomic restore) in another, with the host's iptables
// backend, and compares the IPv4 and IPv6 nat tables.
func TestIPTablesCorpusMatchesSDK(t *testing.T) {
	r := requireRoot(t)
	backend, auto, err := redirect.ParseBackend(*corpusBackend)
	if err != nil {
		t.Fatalf("-corpus.iptables-backend: %v", err)
	}
	why := "-corpus.iptables-backend"
	if auto {
		backend, why = redirect.Detector{}.Detect(context.Background())
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
		return iptWorker{r.NewNetns(t, fmt.Sprintf("sdk%d", w)), r.NewNetns(t, fmt.Sprintf("ours%d", w)), backend}
	}, func(w iptWorker, i int) result {
		return w.run(cases[i], sdk[3*i], sdk[3*i+1], sdk[3*i+2])
	})
	t.Logf("iptables backend %s (%s)", backend, why)
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
	ex := &redirect.NetnsExecutor{NetNS: w.ours.Path, Backend: w.backend}
	if err := redirect.Apply(context.Background(), ex, redirect.Build(cfg)); err != nil {
		return err.Error()
	}
	return ""
}

// replay runs the SDK's commands in its namespace the way the SDK does:
// one exec per rule, stopping at the first failure.
func (w iptWorker) replay(cmds [][]string) string {
	var msg string
	err := redirect.InNetns(w.sdk.Path, func() error {
		for _, c := range cmds {
			fam := redirect.IPv4
			if c[0] == "ip6tables" {
				fam = redirect.IPv6
			}
			if out, err := exec.Command(w.backend.Tool(fam), c[1:]...).CombinedOutput(); err != nil {
				msg = fmt.Sprintf("%q: %v: %s", c, err, strings.TrimSpace(string(out)))
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

func (w iptWorker) compare() string {
	var b strings.Builder
	for _, fam := range redirect.Families {
		ours, err1 := (&redirect.NetnsExecutor{NetNS: w.ours.Path, Backend: w.backend}).Save(context.Background(), fam)
		sdk, err2 := (&redirect.NetnsExecutor{NetNS: w.sdk.Path, Backend: w.backend}).Save(context.Background(), fam)
		if err1 != nil || err2 != nil {
			return fmt.Sprintf("%s save: %v %v", fam, err1, err2)
		}
		if o, s := redirecttest.Normalize(ours), redirecttest.Normalize(sdk); o != s {
			fmt.Fprintf(&b, "%s nat table:\n%s", fam, lineDiff(o, s))
		}
	}
	return b.String()
}

func (w iptWorker) resetSDK() { flush(w.sdk.Path, w.backend) }

func (w iptWorker) reset() {
	flush(w.sdk.Path, w.backend)
	flush(w.ours.Path, w.backend)
}

// flush empties the nat table of both families (a restore without
// --noflush: every chain flushed, user chains deleted).
func flush(ns string, b redirect.Backend) {
	redirect.InNetns(ns, func() error {
		for _, fam := range redirect.Families {
			cmd := exec.Command(b.Command(fam, "restore"))
			cmd.Stdin = strings.NewReader("*nat\nCOMMIT\n")
			cmd.Run()
		}
		return nil
	})
}
