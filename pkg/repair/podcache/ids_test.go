package podcache

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge/judgetest"
)

// A cached pod reads back with the very UID, resourceVersion and deletion
// time it had, whatever their form: the compact one for a canonical UUID
// and a decimal revision, the text as it came for anything else (an
// upper-case UUID, a UID that is no UUID, an opaque or zero-padded
// resourceVersion).
func TestCachedPodKeepsItsUIDAndResourceVersionInEveryForm(t *testing.T) {
	uids := []struct {
		uid     types.UID
		compact bool
	}{
		{"0b6c2f0e-6a4e-4d1c-9b1e-00000000002a", true},
		{"ffffffff-ffff-ffff-ffff-ffffffffffff", true},
		{"0B6C2F0E-6A4E-4D1C-9B1E-00000000002A", false},
		{"uid-replacement", false},
		{"0b6c2f0e6a4e-4d1c-9b1e-00000000002a-", false},
		{"0b6c2f0e-6a4e-4d1c-9b1e-00000000002g", false},
		{"", false},
	}
	versions := []struct {
		rv      string
		compact bool
	}{{"123456789", true}, {"", true}, {"0", false}, {"007", false}, {"+12", false},
		{"18446744073709551616", false}, {"opaque/42", false}}
	for _, u := range uids {
		for _, v := range versions {
			p := judgetest.Pod(judgetest.WithStatus("complete"), judgetest.SandboxAt(-time.Hour))
			p.UID, p.ResourceVersion = u.uid, v.rv
			deleting := v.rv == "123456789" || v.rv == "opaque/42" // the deletion time beside either form
			if deleting {
				ts := judgetest.At(-time.Second)
				p.DeletionTimestamp = &ts
			}
			o, _ := cacheDefault(p)
			c, ok := o.(*cachedPod)
			if !ok {
				t.Fatalf("pod with UID %q cached as %T, want its compact form", u.uid, o)
			}
			if compact := c.rare == nil || !c.rare.textIDs; compact != (u.compact && v.compact) {
				t.Errorf("UID %q resourceVersion %q: held compactly %v, want %v", u.uid, v.rv, compact, u.compact && v.compact)
			}
			got, _ := PodOf(c)
			if deleting != (got.DeletionTimestamp != nil) || deleting && !got.DeletionTimestamp.Equal(p.DeletionTimestamp) {
				t.Errorf("UID %q resourceVersion %q: deletion time %v, want %v", u.uid, v.rv, got.DeletionTimestamp, p.DeletionTimestamp)
			}
			meta := c.GetObjectMeta()
			uid, _ := UIDOf(c)
			for what, pair := range map[string][2]string{
				"pod's UID": {string(got.UID), string(u.uid)}, "pod's resourceVersion": {got.ResourceVersion, v.rv},
				"metadata's UID": {string(meta.GetUID()), string(u.uid)}, "metadata's resourceVersion": {meta.GetResourceVersion(), v.rv},
				"UIDOf": {string(uid), string(u.uid)},
			} {
				if pair[0] != pair[1] {
					t.Errorf("UID %q resourceVersion %q: %s reads %q", u.uid, v.rv, what, pair[0])
				}
			}
			if k, _ := KeyOf(c); k != KeyOfUID(u.uid) {
				t.Errorf("UID %q resourceVersion %q: key %v, want the UID's %v", u.uid, v.rv, k, KeyOfUID(u.uid))
			}
		}
	}
}

// Two UIDs have equal keys only when they are equal: an upper-case UUID is
// another UID than its lower-case form, as the API server compares them.
func TestUIDKeysAreEqualOnlyForEqualUIDs(t *testing.T) {
	uids := []types.UID{"0b6c2f0e-6a4e-4d1c-9b1e-00000000002a", "0B6C2F0E-6A4E-4D1C-9B1E-00000000002A",
		"0b6c2f0e-6a4e-4d1c-9b1e-00000000002b", "uid-a", "", "00000000-0000-0000-0000-000000000000"}
	for i, a := range uids {
		for j, b := range uids {
			if same := KeyOfUID(a) == KeyOfUID(b); same != (i == j) {
				t.Errorf("keys of %q and %q equal: %v", a, b, same)
			}
		}
	}
}
