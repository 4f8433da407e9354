package iptables

import (
	"bufio"
	"bytes"
	"fmt"
	"strings"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
)

// Current is the nat table of one family as iptables-save printed it.
type Current struct {
	// Chains lists every chain of the table in the order printed.
	Chains []string
	// Rules holds each chain's rules as the text after "-A <chain> ".
	Rules map[string][]string
}

// HasChain reports whether the table has the chain.
func (c *Current) HasChain(name string) bool {
	for _, n := range c.Chains {
		if n == name {
			return true
		}
	}
	return false
}

// Ours reports whether anything of ours is in the table: one of our chains
// (a rule can only jump to a chain that exists, so no chain means no jump).
func (c *Current) Ours() bool {
	for _, n := range redirect.Chains {
		if c.HasChain(n) {
			return true
		}
	}
	return false
}

// jumpsToOurs returns, for every chain that is not ours, the rules that
// jump (-j or -g) to one of our chains, in table order.
func (c *Current) jumpsToOurs() []Rule {
	var out []Rule
	for _, chain := range c.Chains {
		if redirect.IsOurChain(chain) {
			continue
		}
		for _, spec := range c.Rules[chain] {
			if redirect.IsOurChain(target(tokens(spec))) {
				out = append(out, Rule{Chain: chain, Args: tokens(spec)})
			}
		}
	}
	return out
}

// ParseSave reads the nat table out of iptables-save output. Output with no
// nat table (a namespace where nothing created it) is an empty table.
func ParseSave(out []byte) (*Current, error) {
	c := &Current{Rules: map[string][]string{}}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
	inNat, seenNat := false, false
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "*"):
			inNat = line == "*"+redirect.Table
			if inNat {
				if seenNat {
					return nil, fmt.Errorf("iptables-save output line %d: second %s table", n, redirect.Table)
				}
				seenNat = true
			}
		case line == "COMMIT":
			inNat = false
		case !inNat:
		case strings.HasPrefix(line, ":"):
			name, _, _ := strings.Cut(line[1:], " ")
			if name == "" {
				return nil, fmt.Errorf("iptables-save output line %d: chain without a name: %q", n, line)
			}
			if !c.HasChain(name) {
				c.Chains = append(c.Chains, name)
			}
		case strings.HasPrefix(line, "-A "):
			chain, spec, _ := strings.Cut(line[3:], " ")
			if !c.HasChain(chain) {
				return nil, fmt.Errorf("iptables-save output line %d: rule in undeclared chain %s", n, chain)
			}
			c.Rules[chain] = append(c.Rules[chain], strings.TrimSpace(spec))
		default:
			return nil, fmt.Errorf("iptables-save output line %d: unexpected %q", n, line)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return c, nil
}

// tokens splits a rule specification the way iptables-save quotes it:
// on spaces, except inside double quotes (comments).
func tokens(spec string) []string {
	var out []string
	var cur strings.Builder
	inQuote, have := false, false
	for i := 0; i < len(spec); i++ {
		ch := spec[i]
		switch {
		case ch == '\\' && inQuote && i+1 < len(spec):
			i++
			cur.WriteByte(spec[i])
		case ch == '"':
			inQuote = !inQuote
			have = true
		case ch == ' ' && !inQuote:
			if have {
				out = append(out, cur.String())
				cur.Reset()
				have = false
			}
		default:
			cur.WriteByte(ch)
			have = true
		}
	}
	if have {
		out = append(out, cur.String())
	}
	return out
}

// quoteSpec joins tokens back into a rule specification, quoting any token
// that needs it (only comments of other rules ever do).
func quoteSpec(args []string) string {
	parts := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \"\\\t") {
			a = `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(a) + `"`
		}
		parts[i] = a
	}
	return strings.Join(parts, " ")
}

func target(args []string) string {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "-j" || args[i] == "-g" || args[i] == "--jump" || args[i] == "--goto" {
			return args[i+1]
		}
	}
	return ""
}
