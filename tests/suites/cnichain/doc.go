// Package cnichain runs consul-cni as a container runtime does, through libcni
// in a real chain (ptp + host-local + consul-cni, tests/harness/cnichain) in
// real network namespaces, and checks it with real TCP connections: traffic
// redirected to the sidecar (single and dual stack, port ranges), ADD, CHECK
// and DEL, a failed ADD that leaves nothing behind, the dual-stack table equal
// to Consul's SDK's, the iptables and nftables backends beside each other and
// switched. Its tests need root (build tag privileged):
//
//	go test -tags privileged ./tests/suites/cnichain
package cnichain
