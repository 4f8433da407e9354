// Package cmdutil holds what the project's long-running commands (repair,
// consul-cni-installer, consul-cni-check) share: how they find their
// Kubernetes client configuration (and how the audit, a command a person
// runs, finds it as kubectl does), parse their command line (--version,
// usage errors) and configure their logs. The CNI plugin does not use it: it
// carries no client-go.
package cmdutil

import (
	"fmt"
	"os"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// RESTConfig follows the project's rule for client configuration: the
// kubeconfig file given by a flag, else the one named by $KUBECONFIG, else
// the in-cluster configuration. The error says which source failed.
func RESTConfig(kubeconfig string) (*rest.Config, error) {
	path, source := kubeconfig, "--kubeconfig"
	if path == "" {
		path, source = os.Getenv("KUBECONFIG"), "$KUBECONFIG"
	}
	if path == "" {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("kubernetes client configuration: no --kubeconfig, no $KUBECONFIG, and in-cluster: %w", err)
		}
		return cfg, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client configuration from %s %s: %w", source, path, err)
	}
	return cfg, nil
}
