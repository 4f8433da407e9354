package iptablestest

import "strings"

// splitArgs splits one iptables-restore line into its arguments the way
// iptables-restore does: blanks (space, tab) separate arguments outside
// double quotes; a double-quoted part is taken literally except that a
// backslash makes the next character literal, and closing the quote ends
// the argument.
func splitArgs(line string) []string {
	var (
		args    []string
		cur     []byte
		started bool
		quoted  bool
	)
	end := func() {
		if started {
			args = append(args, string(cur))
		}
		cur, started = nil, false
	}
	for i := 0; i < len(line); i++ {
		ch := line[i]
		if quoted {
			switch {
			case ch == '\\' && i+1 < len(line):
				i++
				cur = append(cur, line[i])
			case ch == '"':
				quoted = false
				end()
			default:
				cur = append(cur, ch)
			}
			continue
		}
		switch ch {
		case ' ', '\t':
			end()
		case '"':
			quoted, started = true, true
		default:
			cur, started = append(cur, ch), true
		}
	}
	end()
	return args
}

// joinArgs is the inverse of splitArgs: arguments that are empty or hold a
// blank, a quote or a backslash are double-quoted, with quotes and
// backslashes escaped. It is also the form iptables-save prints.
func joinArgs(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\"\\") {
			var b strings.Builder
			b.WriteByte('"')
			for j := 0; j < len(a); j++ {
				if a[j] == '"' || a[j] == '\\' {
					b.WriteByte('\\')
				}
				b.WriteByte(a[j])
			}
			b.WriteByte('"')
			a = b.String()
		}
		out[i] = a
	}
	return strings.Join(out, " ")
}

// jumpTarget is the chain or target a rule jumps (-j) or goes (-g) to, ""
// when it has none.
func jumpTarget(args []string) string {
	for i := 0; i+1 < len(args); i++ {
		switch args[i] {
		case "-j", "--jump", "-g", "--goto":
			return args[i+1]
		}
	}
	return ""
}

// Normalize returns iptables-save output without comment lines and with
// packet and byte counters zeroed, so that tables saved at different times
// or by different backends compare equal when their rules are equal.
func Normalize(out []byte) string {
	var b strings.Builder
	for _, line := range strings.Split(string(out), "\n") {
		line = strings.TrimRight(line, " \t\r")
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(line, ":") {
			if i := strings.LastIndex(line, " ["); i > 0 && strings.HasSuffix(line, "]") {
				line = line[:i] + " [0:0]"
			}
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}
