//go:build privileged

package sdkcorpus_test

import (
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/sdkoracle"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

var (
	corpusN       = flag.Int("corpus.n", envInt("CCR_CORPUS_N", 2000), "number of generated configurations (default $CCR_CORPUS_N, else 2000)")
	corpusSeed    = flag.Uint64("corpus.seed", sdkoracle.DefaultSeed, "seed of the generated configurations")
	corpusVariant = flag.String("corpus.iptables-variant", "auto", "variant of the iptables tools for the iptables corpus: nft, legacy or auto (the host's)")
	corpusWorkers = flag.Int("corpus.workers", 4, "configurations applied in parallel (each worker owns a pair of namespaces)")
)

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// Outcomes of one configuration.
const (
	equal      = "equal"       // both accept, equal tables
	splitEqual = "split-equal" // the SDK fails on a dual-stack CIDR list, ours equals it family by family
	differ     = "DIFFER"      // both accept, different tables
	bothReject = "both-reject"
	sdkOnly    = "sdk-only"  // ours rejects what the SDK applies
	oursOnly   = "ours-only" // ours applies what the SDK refuses
)

type result struct {
	outcome string
	// detail explains a failure: the errors of each side, the diff.
	detail string
}

// pool runs fn for every index in [0,n) on workers goroutines; setup makes
// each worker's state in the test goroutine (namespaces need t.Fatalf).
func pool[W any](t *testing.T, n int, setup func(w int) W, fn func(w W, i int) result) []result {
	t.Helper()
	workers := max(1, min(*corpusWorkers, n))
	ws := make([]W, workers)
	for w := range ws {
		ws[w] = setup(w)
	}
	res := make([]result, n)
	jobs := make(chan int)
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				res[i] = fn(w, i)
			}
		}()
	}
	for i := 0; i < n; i++ {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	return res
}

// report logs the outcome counts per mutation and fails the test for each
// outcome the policy does not allow, the first ones in detail.
func report(t *testing.T, cases []sdkoracle.Case, res []result, allowed func(c sdkoracle.Case, outcome string) bool, took time.Duration) {
	t.Helper()
	counts := map[string]map[string]int{}
	var bad []int
	for i, c := range cases {
		m := c.Mutation
		if m == "" {
			m = "(valid)"
		}
		if counts[m] == nil {
			counts[m] = map[string]int{}
		}
		counts[m][res[i].outcome]++
		if !allowed(c, res[i].outcome) {
			bad = append(bad, i)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d configurations (seed %d) in %s with %d workers\n", len(cases), *corpusSeed, took.Round(time.Millisecond), *corpusWorkers)
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		var parts []string
		for o, n := range counts[k] {
			parts = append(parts, fmt.Sprintf("%s %d", o, n))
		}
		sort.Strings(parts)
		fmt.Fprintf(&b, "  %-22s %s\n", k, strings.Join(parts, ", "))
	}
	t.Log(b.String())
	for j, i := range bad {
		if j == 20 {
			t.Errorf("... and %d more", len(bad)-j)
			break
		}
		c := cases[i]
		t.Errorf("%s (dual stack %v, mutation %q): %s\nconfig: %s\n%s", c.Name, c.DualStack, c.Mutation, res[i].outcome, c.JSON, res[i].detail)
	}
}

// lineDiff shows the lines only one table has, or says the order differs.
func lineDiff(ours, sdk string) string {
	count := func(s string) map[string]int {
		m := map[string]int{}
		for _, l := range strings.Split(s, "\n") {
			m[l]++
		}
		return m
	}
	o, s := count(ours), count(sdk)
	extra := func(a, b map[string]int) map[string]int {
		m := map[string]int{}
		for l, n := range a {
			if n > b[l] {
				m[l] = n - b[l]
			}
		}
		return m
	}
	var b strings.Builder
	for _, side := range []struct {
		label, table string
		extra        map[string]int
	}{{"+ours", ours, extra(o, s)}, {"-sdk ", sdk, extra(s, o)}} {
		for _, l := range strings.Split(side.table, "\n") {
			if side.extra[l] > 0 {
				fmt.Fprintf(&b, "%s %s\n", side.label, l)
				side.extra[l]--
			}
		}
	}
	if b.Len() == 0 {
		return "same rules, in another order\n--- ours\n" + ours + "--- sdk\n" + sdk
	}
	return b.String()
}

func requireRoot(t *testing.T) *testnet.Range {
	t.Helper()
	testnet.RequireRoot(t)
	return testnet.Reserve(t)
}
