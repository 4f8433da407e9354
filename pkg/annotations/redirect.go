package annotations

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
)

// DefaultProxyOutboundPort is used when the config leaves
// ProxyOutboundPort at zero, as Consul's SDK does.
const DefaultProxyOutboundPort = 15001

// RedirectTrafficConfig is the JSON shape of the redirect-traffic-config
// annotation (and of Nomad's CONSUL_IPTABLES_CONFIG CNI argument): the plain
// encoding/json form of the Consul SDK's iptables.Config. Field names are
// matched case-insensitively, lists may be null, unknown keys are ignored.
// Ports and UIDs inside lists are strings. NetNS is ignored: the plugin uses
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
	ExcludeInboundPorts  []uint16
	ExcludeOutboundPorts []uint16
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
	if dec.More() {
		return c, fmt.Errorf("%s: invalid JSON: trailing data after the object", KeyRedirectTrafficConfig)
	}
	return c, nil
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

func ports(field string, in []string) ([]uint16, error) {
	var out []uint16
	for i, s := range in {
		p, err := parsePort(fmt.Sprintf("%s[%d]", field, i), s)
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
