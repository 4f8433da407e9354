package annotations

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"unicode"
)

// DefaultProxyOutboundPort is used when the config leaves
// ProxyOutboundPort at zero, as Consul's SDK does.
const DefaultProxyOutboundPort = 15001

// MaxListEntries bounds each list of the redirect configuration
// (ExcludeInboundPorts, ExcludeOutboundPorts, ExcludeOutboundCIDRs,
// ExcludeUIDs). consul-k8s's webhook writes a few dozen entries at most; the
// bound keeps the rules of one sandbox, and the root CPU spent on each
// retry, small.
const MaxListEntries = 1024

// PortRange is an inclusive range of TCP ports. A single port has
// First == Last.
type PortRange struct {
	First, Last uint16
}

// String is the range as iptables' --dport takes it and iptables-save
// prints it: "8080", or "8000:8100".
func (r PortRange) String() string {
	if r.First == r.Last {
		return strconv.Itoa(int(r.First))
	}
	return strconv.Itoa(int(r.First)) + ":" + strconv.Itoa(int(r.Last))
}

// Contains reports whether port p is in the range.
func (r PortRange) Contains(p uint16) bool { return r.First <= p && p <= r.Last }

// PortsContain reports whether any range of the list contains port p.
func PortsContain(ranges []PortRange, p uint16) bool {
	for _, r := range ranges {
		if r.Contains(p) {
			return true
		}
	}
	return false
}

// RedirectTrafficConfig is the JSON shape of the redirect-traffic-config
// annotation (and of Nomad's CONSUL_IPTABLES_CONFIG CNI argument): the plain
// encoding/json form of the Consul SDK's iptables.Config. Field names are
// matched case-insensitively, lists may be null, unknown keys are ignored.
// Ports and UIDs inside lists are strings; an excluded port may be a range
// "a:b" (1 <= a < b <= 65535), which the SDK passes to --dport as it is. Two
// keys that differ only in case, trailing data after the object, and lists
// longer than MaxListEntries are refused. NetNS is ignored: the plugin uses
// the namespace the runtime hands it.
type RedirectTrafficConfig struct {
	ConsulDNSIP          string
	ConsulDNSPort        int
	ProxyUserID          string
	ProxyInboundPort     int
	ProxyOutboundPort    int
	ExcludeInboundPorts  []string
	ExcludeOutboundPorts []string
	ExcludeOutboundCIDRs []string
	ExcludeUIDs          []string
	NetNS                string
}

// TrafficConfig is a validated redirect configuration with every value in
// its typed form. Only a TrafficConfig ever reaches rule rendering, so no
// string from an annotation is passed to iptables as it was written.
type TrafficConfig struct {
	// DualStack selects an IPv4 pass without DNS rules plus an IPv6 pass.
	DualStack bool
	// ConsulDNSIP is the zero Addr when DNS redirection is off and
	// ConsulDNSPort is zero.
	ConsulDNSIP          netip.Addr
	ConsulDNSPort        uint16
	ProxyUserID          uint32
	ProxyInboundPort     uint16
	ProxyOutboundPort    uint16
	ExcludeInboundPorts  []PortRange
	ExcludeOutboundPorts []PortRange
	ExcludeOutboundCIDRs []netip.Prefix
	ExcludeUIDs          []uint32
}

// ParseRedirectTrafficConfig decodes and validates a redirect-traffic-config
// JSON document. dualStack comes from the dual-stack annotation (false for
// Nomad).
func ParseRedirectTrafficConfig(data []byte, dualStack bool) (TrafficConfig, error) {
	raw, err := DecodeRedirectTrafficConfig(data)
	if err != nil {
		return TrafficConfig{}, err
	}
	return raw.Validate(dualStack)
}

// DecodeRedirectTrafficConfig decodes the JSON without validating values.
func DecodeRedirectTrafficConfig(data []byte) (RedirectTrafficConfig, error) {
	var c RedirectTrafficConfig
	if len(bytes.TrimSpace(data)) == 0 {
		return c, fmt.Errorf("%s: empty value", KeyRedirectTrafficConfig)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&c); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return c, fmt.Errorf("%s: field %s: JSON %s where %s is expected", KeyRedirectTrafficConfig, te.Field, te.Value, te.Type)
		}
		return c, fmt.Errorf("%s: invalid JSON: %w", KeyRedirectTrafficConfig, err)
	}
	if err := noTrailingData(data, dec.InputOffset()); err != nil {
		return c, err
	}
	if err := noDuplicateKeys(data); err != nil {
		return c, err
	}
	return c, nil
}

// noTrailingData refuses anything but JSON whitespace after the value that
// ended at offset off.
func noTrailingData(data []byte, off int64) error {
	rest := data[off:]
	i := 0
	for i < len(rest) && strings.IndexByte(" \t\r\n", rest[i]) >= 0 {
		i++
	}
	if i == len(rest) {
		return nil
	}
	text := rest[i:]
	if len(text) > 32 {
		text = text[:32]
	}
	return fmt.Errorf("%s: invalid JSON: trailing data after the object at offset %d: %q", KeyRedirectTrafficConfig, off+int64(i), text)
}

// noDuplicateKeys refuses an object with two keys that encoding/json would
// both match to one field: equal under Unicode case folding. Otherwise the
// last one silently wins ("ProxyUserID":"5995","proxyuserid":"0").
func noDuplicateKeys(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil // null: nothing to compare (decoding has already succeeded)
	}
	seen := map[string]string{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return fmt.Errorf("%s: invalid JSON: %w", KeyRedirectTrafficConfig, err)
		}
		key, _ := tok.(string)
		folded := foldKey(key)
		if first, dup := seen[folded]; dup {
			return fmt.Errorf("%s: keys %q and %q name the same field (keys are matched case-insensitively; give each once)", KeyRedirectTrafficConfig, first, key)
		}
		seen[folded] = key
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return fmt.Errorf("%s: invalid JSON: %w", KeyRedirectTrafficConfig, err)
		}
	}
	return nil
}

// foldKey maps every rune of s to the smallest rune of its Unicode
// case-folding orbit, so keys that are equal under folding (as
// encoding/json matches them to fields: "K", "k" and the Kelvin sign) map
// to the same string.
func foldKey(s string) string {
	var b strings.Builder
	for _, r := range s {
		min := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			if f < min {
				min = f
			}
		}
		b.WriteRune(min)
	}
	return b.String()
}

// FieldError names the field and the value that failed validation.
type FieldError struct {
	Field  string
	Value  string
	Reason string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("%s: field %s: %q %s", KeyRedirectTrafficConfig, e.Field, e.Value, e.Reason)
}

// Validate checks every value strictly and returns the typed config. The
// required-field and DNS messages keep the wording of Consul's SDK so that
// operators find them in its documentation; list entries, which the SDK
// passes through unchecked, are validated here as well.
func (c RedirectTrafficConfig) Validate(dualStack bool) (TrafficConfig, error) {
	out := TrafficConfig{DualStack: dualStack}
	var err error

	if c.ProxyUserID == "" {
		return out, fmt.Errorf("%s: field ProxyUserID: ProxyUserID is required to set up traffic redirection", KeyRedirectTrafficConfig)
	}
	if out.ProxyUserID, err = parseUID("ProxyUserID", c.ProxyUserID); err != nil {
		return out, err
	}
	if c.ProxyInboundPort == 0 {
		return out, fmt.Errorf("%s: field ProxyInboundPort: ProxyInboundPort is required to set up traffic redirection", KeyRedirectTrafficConfig)
	}
	if out.ProxyInboundPort, err = intPort("ProxyInboundPort", c.ProxyInboundPort); err != nil {
		return out, err
	}
	if c.ProxyOutboundPort == 0 {
		c.ProxyOutboundPort = DefaultProxyOutboundPort
	}
	if out.ProxyOutboundPort, err = intPort("ProxyOutboundPort", c.ProxyOutboundPort); err != nil {
		return out, err
	}
	if c.ConsulDNSPort != 0 {
		if out.ConsulDNSPort, err = intPort("ConsulDNSPort", c.ConsulDNSPort); err != nil {
			return out, err
		}
	}
	if c.ConsulDNSIP != "" {
		ip, perr := netip.ParseAddr(c.ConsulDNSIP)
		if perr != nil || ip.Zone() != "" {
			return out, &FieldError{"ConsulDNSIP", c.ConsulDNSIP, "is not an IP address: unable to parse consulDNSIP"}
		}
		ip = ip.Unmap()
		if dualStack && !ip.Is6() {
			return out, &FieldError{"ConsulDNSIP", c.ConsulDNSIP, "is not IPv6: for dual stack ipv6 consulDNSIP required"}
		}
		if !dualStack && !ip.Is4() {
			return out, &FieldError{"ConsulDNSIP", c.ConsulDNSIP, "is not IPv4: for non dual stack setup ipv4 consulDNSIP required"}
		}
		out.ConsulDNSIP = ip
	}

	for _, l := range []struct {
		field string
		n     int
	}{
		{"ExcludeInboundPorts", len(c.ExcludeInboundPorts)}, {"ExcludeOutboundPorts", len(c.ExcludeOutboundPorts)},
		{"ExcludeOutboundCIDRs", len(c.ExcludeOutboundCIDRs)}, {"ExcludeUIDs", len(c.ExcludeUIDs)},
	} {
		if l.n > MaxListEntries {
			return out, fmt.Errorf("%s: field %s: %d entries, more than MaxListEntries (%d)", KeyRedirectTrafficConfig, l.field, l.n, MaxListEntries)
		}
	}
	if out.ExcludeInboundPorts, err = ports("ExcludeInboundPorts", c.ExcludeInboundPorts); err != nil {
		return out, err
	}
	if out.ExcludeOutboundPorts, err = ports("ExcludeOutboundPorts", c.ExcludeOutboundPorts); err != nil {
		return out, err
	}
	for i, s := range c.ExcludeUIDs {
		u, err := parseUID(fmt.Sprintf("ExcludeUIDs[%d]", i), s)
		if err != nil {
			return out, err
		}
		out.ExcludeUIDs = append(out.ExcludeUIDs, u)
	}
	for i, s := range c.ExcludeOutboundCIDRs {
		p, err := parseCIDR(fmt.Sprintf("ExcludeOutboundCIDRs[%d]", i), s, dualStack)
		if err != nil {
			return out, err
		}
		out.ExcludeOutboundCIDRs = append(out.ExcludeOutboundCIDRs, p)
	}
	return out, nil
}

// digits reports whether s is a non-empty run of ASCII digits of at most
// max characters.
func digits(s string, max int) bool {
	if s == "" || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func parsePort(field, s string) (uint16, error) {
	if !digits(s, 5) {
		return 0, &FieldError{field, s, "is not a port (want digits only, 1-65535)"}
	}
	n, _ := strconv.Atoi(s)
	if n < 1 || n > 65535 {
		return 0, &FieldError{field, s, "is not a port (want digits only, 1-65535)"}
	}
	return uint16(n), nil
}

func intPort(field string, n int) (uint16, error) {
	if n < 1 || n > 65535 {
		return 0, &FieldError{field, strconv.Itoa(n), "is not a port (want 1-65535)"}
	}
	return uint16(n), nil
}

// parsePortRange accepts a port ("8080") or a range "a:b" with
// 1 <= a < b <= 65535, the forms consul-k8s's plugin hands to --dport.
func parsePortRange(field, s string) (PortRange, error) {
	first, last, isRange := strings.Cut(s, ":")
	if !isRange {
		p, err := parsePort(field, s)
		return PortRange{p, p}, err
	}
	const why = "is not a port or port range (want 1-65535, or a:b with 1 <= a < b <= 65535)"
	a, errA := parsePort(field, first)
	b, errB := parsePort(field, last)
	if errA != nil || errB != nil || a >= b {
		return PortRange{}, &FieldError{field, s, why}
	}
	return PortRange{a, b}, nil
}

func ports(field string, in []string) ([]PortRange, error) {
	var out []PortRange
	for i, s := range in {
		p, err := parsePortRange(fmt.Sprintf("%s[%d]", field, i), s)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

func parseUID(field, s string) (uint32, error) {
	if !digits(s, 10) {
		return 0, &FieldError{field, s, "is not a UID (want digits only, 0-4294967295)"}
	}
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return 0, &FieldError{field, s, "is not a UID (want digits only, 0-4294967295)"}
	}
	return uint32(n), nil
}

// parseCIDR accepts a prefix ("10.0.0.0/8") or a single address
// ("10.0.0.1", taken as /32 or /128), as iptables' -d does, and returns the
// prefix masked to its canonical form (what iptables-save prints). In single
// stack only IPv4 is accepted; in dual stack either family.
func parseCIDR(field, s string, dualStack bool) (netip.Prefix, error) {
	const why = "is not a CIDR or IP address"
	var p netip.Prefix
	if pp, err := netip.ParsePrefix(s); err == nil {
		p = pp
	} else if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" {
		p = netip.PrefixFrom(a, a.BitLen())
	} else {
		return p, &FieldError{field, s, why}
	}
	if p.Addr().Is4In6() {
		return p, &FieldError{field, s, "is an IPv4-mapped IPv6 prefix; write it as IPv4"}
	}
	if !dualStack && !p.Addr().Is4() {
		return p, &FieldError{field, s, "is IPv6 but the pod is single-stack IPv4"}
	}
	return p.Masked(), nil
}
