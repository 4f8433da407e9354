// Command consul-cni is a chained CNI plugin that applies Consul's
// transparent-proxy traffic redirection inside a pod's network namespace,
// drop-in compatible with the consul-k8s plugin of the same name. It is run
// by the container runtime, never by hand; see pkg/plugin.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/spf13/pflag"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/plugin"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/version"
)

const command = "consul-cni"

func main() {
	// A runtime runs the plugin without arguments (the CNI protocol speaks
	// through environment variables and stdin); arguments come from a person.
	if len(os.Args) > 1 {
		os.Exit(commandLine(os.Args[1:], os.Stdout, os.Stderr))
	}
	skel.PluginMainFuncs(plugin.New().Funcs(), plugin.VersionInfo, version.String(command)+": "+about)
}

const about = "Consul transparent proxy redirection (CNI chained plugin)"

// commandLine answers --version and --help; anything else is a usage error
// (exit 2) naming the flag or argument.
func commandLine(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet(command, pflag.ContinueOnError)
	fs.SetOutput(stderr)
	showVersion := fs.Bool("version", false, "Print the version and exit.")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: %s [--version]\n\n%s; run by the container runtime with CNI_COMMAND and the network configuration on stdin.\n\nFlags:\n%s", command, about, fs.FlagUsages())
	}
	err := fs.Parse(args)
	if err == nil && fs.NArg() != 0 {
		err = fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	switch {
	case errors.Is(err, pflag.ErrHelp):
		return 0
	case err != nil:
		fmt.Fprintf(stderr, "%s: %v\nRun '%s --help' for usage.\n", command, err, command)
		return 2
	case *showVersion:
		fmt.Fprintln(stdout, version.String(command))
		return 0
	}
	// Only flags with no effect, such as --version=false.
	fmt.Fprintf(stderr, "%s: nothing to do without CNI_COMMAND\nRun '%s --help' for usage.\n", command, command)
	return 2
}
