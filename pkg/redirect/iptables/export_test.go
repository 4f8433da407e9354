package iptables

import "slices"

// Unexported functions the external tests of this package call.
var (
	Specs       = specs
	Equal       = slices.Equal[[]string]
	QuoteSpec   = quoteSpec
	Tokens      = tokens
	BuildFamily = build
)
