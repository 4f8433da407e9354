package redirect

import (
	"reflect"
	"testing"
)

func TestDiffLists(t *testing.T) {
	for _, tc := range []struct {
		name      string
		want, got []string
		diff      ListDiff
	}{
		{"the same rules in the same order differ in nothing", []string{"a", "b"}, []string{"a", "b"}, ListDiff{}},
		{"an expected rule not found is missing", []string{"a", "b"}, []string{"a"}, ListDiff{Missing: []string{"b"}}},
		{"a rule found but not expected is extra", []string{"a"}, []string{"x", "a"}, ListDiff{Extra: []string{"x"}}},
		{"a rule found twice but expected once is extra once", []string{"a", "b"}, []string{"a", "a", "b"}, ListDiff{Extra: []string{"a"}}},
		{"the same rules in another order are reordered", []string{"a", "b"}, []string{"b", "a"}, ListDiff{Reordered: true}},
		{"a rule replaced is missing and its replacement extra", []string{"a", "b"}, []string{"a", "c"}, ListDiff{Missing: []string{"b"}, Extra: []string{"c"}}},
		{"an empty chain misses every rule", []string{"a", "b"}, nil, ListDiff{Missing: []string{"a", "b"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := DiffLists(tc.want, tc.got); !reflect.DeepEqual(got, tc.diff) {
				t.Errorf("DiffLists(%q, %q) = %+v, want %+v", tc.want, tc.got, got, tc.diff)
			}
		})
	}
}
