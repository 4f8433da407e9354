// Command kubectl is the upstream kubectl, built from the k8s.io/kubectl
// module for users of the project's local cluster (`make cluster`) and for
// the test that runs the local walkthrough of docs/demo.md.
package main

import (
	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
)

func main() {
	if err := cli.RunNoErrOutput(cmd.NewDefaultKubectlCommand()); err != nil {
		util.CheckErr(err)
	}
}
