package cmdutil

import (
	"fmt"

	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// KubectlConfig is how a command a person runs (the audit, the kubectl
// plugin) finds its cluster: as kubectl does, with client-go's clientcmd
// loading rules. --kubeconfig names one file; without it the files of
// $KUBECONFIG (a list, merged in order: the first to set a value wins), else
// ~/.kube/config. --context picks a context other than the current one.
// When no file gives a configuration, the in-cluster one is used (the
// command run in a pod). The long-running commands keep RESTConfig.
type KubectlConfig struct {
	Kubeconfig string
	Context    string
}

// AddFlags registers --kubeconfig and --context.
func (k *KubectlConfig) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&k.Kubeconfig, "kubeconfig", "", "Path of the kubeconfig file to use. Default, as for kubectl: the files of $KUBECONFIG (merged), else ~/.kube/config, else the in-cluster configuration.")
	fs.StringVar(&k.Context, "context", "", "The kubeconfig context to use. Default: its current context.")
}

// RESTConfig loads the client configuration; the error names what was
// tried.
func (k *KubectlConfig) RESTConfig() (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = k.Kubeconfig
	overrides := &clientcmd.ConfigOverrides{CurrentContext: k.Context}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubernetes client configuration (%s): %w", k.sources(), err)
	}
	return cfg, nil
}

// sources says where the configuration was looked for.
func (k *KubectlConfig) sources() string {
	s := "$KUBECONFIG, else ~/.kube/config, else in-cluster"
	if k.Kubeconfig != "" {
		s = "--kubeconfig " + k.Kubeconfig
	}
	if k.Context != "" {
		s += ", --context " + k.Context
	}
	return s
}
