// Command consul-cni is a chained CNI plugin that applies Consul's
// transparent-proxy traffic redirection inside a pod's network namespace,
// drop-in compatible with the consul-k8s plugin of the same name. It is run
// by the container runtime, never by hand; see pkg/plugin.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/plugin"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/version"
)

func main() {
	skel.PluginMainFuncs(plugin.New().Funcs(), plugin.VersionInfo, version.String("consul-cni")+": Consul transparent proxy redirection (CNI chained plugin)")
}
