// Package cmdutil holds what the project's long-running commands (repair,
// consul-cni-installer, consul-cni-check) share: how they find their
// Kubernetes client configuration and how they expose klog's flags. The CNI
// plugin does not use it: it carries no client-go.
package cmdutil

import (
	"flag"
	"fmt"
	"os"

	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
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

// AddKlogFlags registers klog's flags on fs: the ones named, or all of them
// when none is named.
func AddKlogFlags(fs *pflag.FlagSet, names ...string) {
	gfs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(gfs)
	if len(names) == 0 {
		fs.AddGoFlagSet(gfs)
		return
	}
	for _, name := range names {
		f := gfs.Lookup(name)
		if f == nil {
			panic("cmdutil: klog has no flag " + name)
		}
		fs.AddGoFlag(f)
	}
}
