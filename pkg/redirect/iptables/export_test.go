package iptables

// Unexported functions the external tests of this package call.
var (
	Specs       = specs
	Equal       = equal
	QuoteSpec   = quoteSpec
	Tokens      = tokens
	BuildFamily = build
)
