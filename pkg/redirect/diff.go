package redirect

import "slices"

// ListDiff is how the rules of one chain in the kernel differ from the
// expected ones, each rule written as a comparable string. Both backends
// report drift from it, in their own words.
type ListDiff struct {
	// Missing are the expected rules not found (as often as they are short).
	Missing []string
	// Extra are the rules found but not expected (as often as they are in
	// excess), in the kernel's order.
	Extra []string
	// Reordered is set when the lists hold the same rules in another order.
	Reordered bool
}

// DiffLists compares the expected rules of a chain with the rules found, as
// multisets first and then by order.
func DiffLists(want, got []string) ListDiff {
	var d ListDiff
	if slices.Equal(want, got) {
		return d
	}
	count := map[string]int{}
	for _, s := range got {
		count[s]++
	}
	for _, s := range want {
		if count[s] > 0 {
			count[s]--
			continue
		}
		d.Missing = append(d.Missing, s)
	}
	for _, s := range got {
		if count[s] > 0 {
			count[s]--
			d.Extra = append(d.Extra, s)
		}
	}
	d.Reordered = len(d.Missing) == 0 && len(d.Extra) == 0
	return d
}
