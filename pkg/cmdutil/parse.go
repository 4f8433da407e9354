package cmdutil

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/pflag"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/version"
)

// ExitUsage is the exit code of a command line that cannot be used: an
// unknown flag, a bad value, a missing or extra argument.
const ExitUsage = 2

// Parse adds --version to fs and parses args, the command line of the
// command named command; with logging (which may be nil) it also registers
// the logging flags and applies them. It returns done=true with the exit
// code when the command must stop here: 0 after --help (fs.Usage printed it)
// or --version (version.String(command) on stdout), ExitUsage after a parse
// or logging error, which it prints to stderr naming the flag. fs must use
// pflag.ContinueOnError.
func Parse(fs *pflag.FlagSet, command string, args []string, logging *Logging) (code int, done bool) {
	return parse(fs, command, args, logging, os.Stdout, os.Stderr)
}

func parse(fs *pflag.FlagSet, command string, args []string, logging *Logging, stdout, stderr io.Writer) (int, bool) {
	showVersion := fs.Bool("version", false, "Print the version and exit.")
	if logging != nil {
		logging.AddFlags(fs)
	}
	err := fs.Parse(args)
	switch {
	case errors.Is(err, pflag.ErrHelp):
		return 0, true
	case err != nil:
		UsageError(stderr, command, err)
		return ExitUsage, true
	case *showVersion:
		fmt.Fprintln(stdout, version.String(command))
		return 0, true
	}
	if logging != nil {
		if err := logging.Apply(); err != nil {
			UsageError(stderr, command, err)
			return ExitUsage, true
		}
	}
	return 0, false
}

// UsageError prints a usage error of command to w: the error, which names
// the flag or argument, and where to find the usage.
func UsageError(w io.Writer, command string, err error) {
	fmt.Fprintf(w, "%s: %v\nRun '%s --help' for usage.\n", command, err, command)
}
