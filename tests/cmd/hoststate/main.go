// Command hoststate records the host's state before a run and compares it
// afterwards (tests/harness/hoststate): `make test` and `make demo` fail when
// the host is not left as they found it.
//
//	hoststate sweep          remove what killed runs of the harness left
//	                         (realnode.SweepStale: nodes, slots, cgroups)
//	hoststate save FILE      record the host now
//	hoststate compare FILE   exit 1 and list every difference from FILE
//
// A run sweeps before it records: the leftovers of an earlier killed run are
// the harness's own, and the harness's next start would remove them, which
// the comparison would otherwise blame on this run.
package main

import (
	"fmt"
	"os"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/hoststate"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/realnode"
)

func main() {
	if len(os.Args) == 2 && os.Args[1] == "sweep" {
		realnode.SweepStale()
		return
	}
	if len(os.Args) != 3 || (os.Args[1] != "save" && os.Args[1] != "compare") {
		fmt.Fprintln(os.Stderr, "usage: hoststate sweep | hoststate save|compare FILE")
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
