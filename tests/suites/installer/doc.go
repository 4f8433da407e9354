// Package installer checks the consul-cni-installer command from outside, as
// the DaemonSet runs it: the binary built from this tree (tests/harness/testbin)
// on a node's CNI directories. The unit tests of its logic live beside
// pkg/install, those of its flags beside cmd/consul-cni-installer.
//
// With the build tag privileged it runs against a real chain (ptp +
// host-local, sandboxes made through libcni from the network a runtime would
// load): the race before it and redirected traffic after it, proven by real
// connections. With the build tag integration it runs against the local
// control plane (tests/harness/cluster): the lifecycle (chain, token file and
// its rotation, SIGTERM, uninstall), the token handover of a rolling update,
// two installer versions overlapping without churn of the binary or the list,
// and beside and after consul-k8s's real install-cni (tests/harness/consulk8s:
// no write while both run, the restore gap of a migration).
//
//	go test -tags integration -p 1 ./tests/suites/installer
package installer
