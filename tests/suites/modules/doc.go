// Package modules checks the repository's Go modules against what
// ARCHITECTURE.md says of them: every module listed in its modules table, and
// one go directive for all of them unless a dependency requires a newer one.
package modules
