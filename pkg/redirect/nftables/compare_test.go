package nftables

import (
	"strings"
	"testing"

	gnft "github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// TestCompareRules: every kind of difference in one chain is named, and an
// equal chain gives no problem. The kernel reports a NAT or redirect with
// only min registers as min = max; that is no difference.
func TestCompareRules(t *testing.T) {
	a := Rule{Chain: "C", Text: "meta skuid 1 return", Exprs: rule(skuid(1), verdictReturn())}
	b := Rule{Chain: "C", Text: "meta l4proto tcp redirect to :15001", Exprs: rule(l4proto(protoTCP), redirectTo(15001))}
	kernel := func(rs ...Rule) []*gnft.Rule {
		var out []*gnft.Rule
		for _, r := range rs {
			exprs := append([]expr.Any(nil), r.Exprs...)
			for i, e := range exprs {
				if rd, ok := e.(*expr.Redir); ok {
					c := *rd
					c.RegisterProtoMax = c.RegisterProtoMin
					exprs[i] = &c
				}
			}
			out = append(out, &gnft.Rule{Exprs: exprs})
		}
		return out
	}
	for _, tc := range []struct {
		name      string
		want, got []Rule
		problems  []string
	}{
		{"equal", []Rule{a, b}, []Rule{a, b}, nil},
		{"missing", []Rule{a, b}, []Rule{a}, []string{"rule missing in C: meta l4proto tcp redirect to :15001"}},
		{"unexpected", []Rule{a}, []Rule{a, b}, []string{"unexpected rule in C: [meta load 16 => reg 1]"}},
		{"order", []Rule{a, b}, []Rule{b, a}, []string{"rules of C are out of order: have [meta l4proto tcp redirect to :15001 | meta skuid 1 return], want [meta skuid 1 return | meta l4proto tcp redirect to :15001]"}},
		{"duplicate", []Rule{a}, []Rule{a, a}, []string{"unexpected rule in C: [meta load 10 => reg 1]"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &Drift{}
			compareRules(d, "C", tc.want, kernel(tc.got...))
			if len(d.Problems) != len(tc.problems) {
				t.Fatalf("problems %q, want %d like %q", d.Problems, len(tc.problems), tc.problems)
			}
			for i, p := range tc.problems {
				if !strings.HasPrefix(d.Problems[i], p) {
					t.Errorf("problem %q, want it to begin with %q", d.Problems[i], p)
				}
			}
		})
	}
}
