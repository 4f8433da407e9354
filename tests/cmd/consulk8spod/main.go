// Command consulk8spod is what a simulated node runs for consul-k8s's
// control-plane image: its install-cni subcommand, consul-k8s's real
// installer, as the container of consul-k8s's CNI DaemonSet
// (tests/harness/consulk8s.ExecInPod).
//
//	consulk8spod install-cni -log-level=info -cni-bin-dir=... ...
package main

import (
	"fmt"
	"os"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/consulk8s"
)

func main() {
	err := consulk8s.ExecInPod(os.Args[1:])
	fmt.Fprintln(os.Stderr, "consulk8spod:", err)
	os.Exit(1)
}
