package initcheck

import (
	"fmt"
	"strconv"
	"strings"
)

// ParseDownwardAPI parses the content of a downward-API file holding
// metadata.annotations (or labels). kubelet writes one `key="value"` line per
// entry, sorted by key, the value quoted and escaped as Go's %q does (so a
// JSON value such as redirect-traffic-config arrives with escaped quotes),
// and no newline after the last line. Keys cannot contain '=', values can.
func ParseDownwardAPI(data []byte) (map[string]string, error) {
	out := map[string]string{}
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSuffix(line, "\r")
		if strings.TrimSpace(line) == "" {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("downward-API file line %d: %q is not key=\"value\"", i+1, truncate(line, 80))
		}
		val, err := strconv.Unquote(v)
		if err != nil {
			return nil, fmt.Errorf("downward-API file line %d: value of %s is not a quoted string: %q", i+1, k, truncate(v, 80))
		}
		out[k] = val
	}
	return out, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
