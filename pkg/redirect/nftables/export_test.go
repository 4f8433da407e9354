package nftables

// JumpRule is a rule in chain that jumps to target, for tests that build
// tables the kernel rejects.
func JumpRule(chain, target string) Rule {
	j := jump(target)
	return Rule{Chain: chain, Text: j.text, Exprs: j.exprs}
}
