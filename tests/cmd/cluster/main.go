// Command cluster runs the local control plane with simulated nodes in the
// foreground for humans (`make cluster NODES=n`): it writes the admin
// kubeconfig to .cluster/kubeconfig and stops everything on Ctrl-C.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/lifecycle"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/podnet"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/simnode"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

type options struct {
	Nodes      int
	Kubeconfig string
	Verbosity  int
	NodeLogs   bool
}

func (o *options) AddFlags(fs *pflag.FlagSet) {
	fs.IntVar(&o.Nodes, "nodes", 1, "simulated nodes to start (0-14)")
	fs.StringVar(&o.Kubeconfig, "kubeconfig-out", filepath.Join(testbin.RepoRoot(), ".cluster", "kubeconfig"), "where to write the admin kubeconfig")
	fs.IntVar(&o.Verbosity, "v", 0, "klog verbosity of the control-plane components (their logs are files in the cluster directory)")
	fs.BoolVar(&o.NodeLogs, "node-logs", false, "print the simulated nodes' logs")
}

func (o *options) Validate() error {
	if o.Nodes < 0 || o.Nodes > 14 {
		return fmt.Errorf("--nodes: %d is not between 0 and 14", o.Nodes)
	}
	if o.Nodes > 0 && os.Geteuid() != 0 {
		return errors.New("--nodes: simulated nodes create network namespaces and need root (use --nodes=0 for the control plane alone)")
	}
	return nil
}

func main() {
	o := &options{}
	o.AddFlags(pflag.CommandLine)
	pflag.Parse()
	if err := o.Validate(); err != nil {
		fmt.Fprintln(os.Stderr, "cluster:", err)
		os.Exit(2)
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "cluster:", err)
		os.Exit(1)
	}
}

func run(o *options) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	env := &lifecycle.Env{}
	defer func() {
		fmt.Println("stopping: nodes, control plane")
		env.Close()
		fmt.Println("stopped")
	}()
	return env.Run(func() error {
		fmt.Println("starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler on loopback")
		start := time.Now()
		c, err := cluster.Start(ctx, cluster.Options{Verbosity: o.Verbosity})
		if err != nil {
			return err
		}
		env.Cleanup(c.Stop)
		if err := os.MkdirAll(filepath.Dir(o.Kubeconfig), 0o755); err != nil {
			return err
		}
		if err := cluster.WriteKubeconfig(o.Kubeconfig, c.Config, "admin"); err != nil {
			return err
		}
		env.Cleanup(func() { os.Remove(o.Kubeconfig) })
		fmt.Printf("control plane ready in %s at %s (logs in %s)\n", time.Since(start).Round(100*time.Millisecond), c.Server, c.Dir)
		if err := c.InstallPrometheusOperatorCRDs(ctx); err != nil {
			return err
		}
		fmt.Println("installed minimal CRDs of ServiceMonitor, PodMonitor and PrometheusRule (no operator runs)")

		var nodes []string
		if o.Nodes > 0 {
			fmt.Println("building podprog, the project's commands and the reference CNI plugins")
			r := testnet.Reserve(env)
			plugins := testbin.CNIPluginDir(env)
			// The images the manifests name run the real programs.
			programs := simnode.ProjectPrograms(env)
			programs["podprog"] = testbin.Package(env, "podprog", "./tests/cmd/podprog")
			for i := 0; i < o.Nodes; i++ {
				idx, release, err := podnet.AllocSubnet()
				if err != nil {
					return err
				}
				env.Cleanup(release)
				root, err := simnode.NewRoot(plugins, r, idx)
				if err != nil {
					return err
				}
				env.Cleanup(func() { os.RemoveAll(root) })
				cfg := simnode.Config{
					Name: fmt.Sprintf("node-%d", i+1), Client: c.Client, RestConfig: c.Config, Root: root,
					Programs: programs, Range: r, PodSubnet: r.Subnet4(idx, 24),
				}
				if o.NodeLogs {
					cfg.Logf = func(f string, a ...any) { fmt.Printf(f+"\n", a...) }
				}
				n, err := simnode.Start(ctx, cfg)
				if err != nil {
					return err
				}
				env.Cleanup(n.Stop)
				nodes = append(nodes, fmt.Sprintf("  %s  pods %s  root %s", n.Name(), cfg.PodSubnet, root))
			}
		}
		fmt.Printf("\nadmin kubeconfig: %s\n  export KUBECONFIG=%s\n", o.Kubeconfig, o.Kubeconfig)
		if len(nodes) > 0 {
			fmt.Printf("simulated nodes (images they run as programs: podprog, %s; others idle):\n%s\n",
				strings.Join(simnode.ManifestImages, ", "), strings.Join(nodes, "\n"))
		}
		fmt.Printf("kubectl v1.37.2: %s (make kubectl); a walkthrough: docs/demo.md, \"A walkthrough on the local cluster\"\n",
			filepath.Join(cluster.KubeBinDir(), "kubectl"))
		fmt.Println("\nrunning; press Ctrl-C to stop")
		<-ctx.Done()
		return nil
	})
}
