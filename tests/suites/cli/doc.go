// Package cli runs the project's five commands, built the way `make build`
// builds them (a version stamped with -ldflags), and checks their command
// line: --version, --help and usage errors.
package cli
