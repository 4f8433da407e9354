package podcache

import (
	"encoding/hex"
	"strconv"

	"k8s.io/apimachinery/pkg/types"
)

// cachedIDs are a cached pod's UID and resourceVersion in 24 bytes and no
// allocation of their own: the UID as the 16 bytes of the UUID the API
// server assigns (parsed from its canonical text: 36 characters,
// lower-case hex), the resourceVersion as the number etcd's revisions are
// (0 for none). When either is in any other form (a UID that is not a
// canonical UUID, an opaque resourceVersion) the pod keeps both texts as
// they came instead (rareFields): reading them back always gives the very
// UID and resourceVersion the pod had.
type cachedIDs struct {
	uuid    [16]byte
	version uint64
}

// uuidEnds are the ends of the five hex groups of a canonical UUID; a dash
// follows each but the last.
var uuidEnds = [...]int{8, 13, 18, 23, 36}

// idsOf returns the compact form of uid and resourceVersion, and false when
// either has none.
func idsOf(uid types.UID, resourceVersion string) (cachedIDs, bool) {
	var ids cachedIDs
	uuidOK := parseUUID(string(uid), &ids.uuid)
	v, err := strconv.ParseUint(resourceVersion, 10, 64)
	if resourceVersion == "" {
		v, err = 0, nil
	} else if v == 0 || strconv.FormatUint(v, 10) != resourceVersion {
		err = strconv.ErrSyntax
	}
	if !uuidOK || err != nil {
		return cachedIDs{}, false
	}
	ids.version = v
	return ids, true
}

// parseUUID parses s into out when s is a canonical UUID.
func parseUUID(s string, out *[16]byte) bool {
	if len(s) != 36 {
		return false
	}
	from, j := 0, 0
	for _, end := range uuidEnds {
		if end < 36 && s[end] != '-' || !lowerHex(s[from:end]) {
			return false
		}
		n, err := hex.Decode(out[j:], []byte(s[from:end]))
		if err != nil {
			return false
		}
		from, j = end+1, j+n
	}
	return true
}

func lowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// UID returns the UID the ids were made from.
func (ids cachedIDs) UID() types.UID {
	var out [36]byte
	from, j := 0, 0
	for _, end := range uuidEnds {
		n := (end - from) / 2
		hex.Encode(out[from:end], ids.uuid[j:j+n])
		if end < 36 {
			out[end] = '-'
		}
		from, j = end+1, j+n
	}
	return types.UID(out[:])
}

// ResourceVersion returns the resourceVersion the ids were made from.
func (ids cachedIDs) ResourceVersion() string {
	if ids.version == 0 {
		return ""
	}
	return strconv.FormatUint(ids.version, 10)
}

// UIDKey identifies a UID without its text: equal keys, equal UIDs. A pass
// over every cached pod compares keys and allocates nothing per pod.
type UIDKey struct {
	uuid   [16]byte
	isUUID bool
	text   string // the UID when it is not a canonical UUID
}

func KeyOfUID(uid types.UID) UIDKey {
	k := UIDKey{isUUID: true}
	if !parseUUID(string(uid), &k.uuid) {
		return UIDKey{text: string(uid)}
	}
	return k
}

func (ids cachedIDs) key() UIDKey { return UIDKey{uuid: ids.uuid, isUUID: true} }
