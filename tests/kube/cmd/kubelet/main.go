// Command kubelet is the upstream kubelet, built from the k8s.io/kubernetes
// module next to the control plane, for the real nodes of the integration
// tests (tests/harness/realnode).
package main

import (
	"context"
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	os.Exit(cli.Run(app.NewKubeletCommand(context.Background())))
}
