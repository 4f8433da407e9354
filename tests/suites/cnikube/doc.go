// Package cnikube tests the consul-cni plugin's Kubernetes path against the
// real local control plane (tests/harness/cluster): the binary runs through libcni
// in a real chain (ptp + host-local + consul-cni) in a real network
// namespace, authenticated as a service account that has exactly the
// permissions manifests/base/cni/rbac.yaml grants, through a kubeconfig
// with a tokenFile, as the installer writes it.
package cnikube
