// Command hoststate records the host's state before a run and compares it
// afterwards (tests/harness/hoststate): `make test` and `make demo` fail when
// the host is not left as they found it.
//
//	hoststate save FILE      record the host now
//	hoststate compare FILE   exit 1 and list every difference from FILE
package main

import (
	"fmt"
	"os"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/hoststate"
)

func main() {
	if len(os.Args) != 3 || (os.Args[1] != "save" && os.Args[1] != "compare") {
		fmt.Fprintln(os.Stderr, "usage: hoststate save|compare FILE")
		os.Exit(2)
	}
	file := os.Args[2]
	if os.Args[1] == "save" {
		if err := hoststate.Snapshot().Save(file); err != nil {
			fmt.Fprintln(os.Stderr, "hoststate:", err)
			os.Exit(1)
		}
		return
	}
	before, err := hoststate.Load(file)
	if err != nil {
		fmt.Fprintln(os.Stderr, "hoststate:", err)
		os.Exit(1)
	}
	d := hoststate.Diff(before, hoststate.Snapshot())
	if len(d) == 0 {
		fmt.Println("hoststate: the host is as the run found it")
		return
	}
	fmt.Fprintf(os.Stderr, "hoststate: the run left the host different from how it found it (%d differences):\n", len(d))
	for _, l := range d {
		fmt.Fprintln(os.Stderr, "  "+l)
	}
	os.Exit(1)
}
