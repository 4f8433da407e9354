package iptables

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
)

// RestoreNew renders the rule set as `iptables-restore --noflush` input for
// a table that has none of our chains: it creates the chains with -N, which
// fails (and so changes nothing) if any of them already exists.
func (rs RuleSet) RestoreNew() []byte {
	var b bytes.Buffer
	b.WriteString("*" + redirect.Table + "\n")
	for _, c := range redirect.Chains {
		b.WriteString("-N " + c + "\n")
	}
	for _, r := range rs.Rules {
		b.WriteString(r.String() + "\n")
	}
	b.WriteString("COMMIT\n")
	return b.Bytes()
}

// RestoreReplace renders input that turns a table holding some or all of our
// chains and rules (an earlier ADD, a partial upstream run) into exactly the
// rule set: it deletes every rule elsewhere that jumps to our chains,
// creates or flushes our chains, and appends the rules. Applied in one
// restore it is atomic, and applying it twice gives the same table.
func (rs RuleSet) RestoreReplace(cur *Current) []byte {
	var b bytes.Buffer
	b.WriteString("*" + redirect.Table + "\n")
	for _, r := range cur.jumpsToOurs() {
		b.WriteString("-D " + r.Chain + " " + quoteSpec(r.Args) + "\n")
	}
	for _, c := range redirect.Chains {
		// With --noflush a chain line creates the chain, or flushes it when
		// it exists.
		b.WriteString(":" + c + " - [0:0]\n")
	}
	for _, r := range rs.Rules {
		b.WriteString(r.String() + "\n")
	}
	b.WriteString("COMMIT\n")
	return b.Bytes()
}

// Cleanup renders input that removes everything of ours from the table: the
// rules that jump to our chains, then our chains. It returns nil when there
// is nothing of ours.
func Cleanup(cur *Current) []byte {
	if !cur.Ours() {
		return nil
	}
	var b bytes.Buffer
	b.WriteString("*" + redirect.Table + "\n")
	for _, r := range cur.jumpsToOurs() {
		b.WriteString("-D " + r.Chain + " " + quoteSpec(r.Args) + "\n")
	}
	var present []string
	for _, c := range redirect.Chains {
		if cur.HasChain(c) {
			present = append(present, c)
		}
	}
	// Flush all first: our chains jump to each other.
	for _, c := range present {
		b.WriteString("-F " + c + "\n")
	}
	for _, c := range present {
		b.WriteString("-X " + c + "\n")
	}
	b.WriteString("COMMIT\n")
	return b.Bytes()
}

// Drift lists how a table differs from a rule set.
type Drift struct {
	Family   redirect.Family
	Problems []string
}

func (d *Drift) Error() string {
	return fmt.Sprintf("%s nat table differs from the expected Consul redirect rules: %s",
		d.Family, strings.Join(d.Problems, "; "))
}

// Check compares the table with the rule set and returns nil when every
// chain of ours holds exactly the expected rules in order and the other
// chains jump to ours exactly as expected (same rules, same order).
func (rs RuleSet) Check(cur *Current) *Drift {
	d := &Drift{Family: rs.Family}
	for _, c := range redirect.Chains {
		if !cur.HasChain(c) {
			d.Problems = append(d.Problems, "chain "+c+" is missing")
			continue
		}
		compare(d, c, specs(rs.ChainRules(c)), cur.Rules[c])
	}
	// Jumps into our chains, per chain that holds them.
	want, got := map[string][]string{}, map[string][]string{}
	seen := map[string]bool{}
	var chains []string
	note := func(c string) {
		if !seen[c] {
			seen[c] = true
			chains = append(chains, c)
		}
	}
	for _, r := range rs.Rules {
		if !redirect.IsOurChain(r.Chain) {
			note(r.Chain)
			want[r.Chain] = append(want[r.Chain], r.Spec())
		}
	}
	for _, r := range cur.jumpsToOurs() {
		note(r.Chain)
		got[r.Chain] = append(got[r.Chain], quoteSpec(r.Args))
	}
	for _, c := range chains {
		compare(d, c, want[c], got[c])
	}
	if len(d.Problems) == 0 {
		return nil
	}
	return d
}

func specs(rules []Rule) []string {
	out := make([]string, len(rules))
	for i, r := range rules {
		out[i] = r.Spec()
	}
	return out
}

// compare reports the differences between the expected and the actual rule
// lists of one chain.
func compare(d *Drift, chain string, want, got []string) {
	diff := redirect.DiffLists(want, got)
	for _, s := range diff.Missing {
		d.Problems = append(d.Problems, fmt.Sprintf("rule missing: -A %s %s", chain, s))
	}
	for _, s := range diff.Extra {
		d.Problems = append(d.Problems, fmt.Sprintf("unexpected rule: -A %s %s", chain, s))
	}
	if diff.Reordered {
		d.Problems = append(d.Problems, fmt.Sprintf("rules of %s are out of order: have [%s], want [%s]",
			chain, strings.Join(got, " | "), strings.Join(want, " | ")))
	}
}
