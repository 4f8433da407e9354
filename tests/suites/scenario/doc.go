// Package scenario runs the race end to end (build tag integration): each
// test is a run of tests/harness/scenario (the library the demo also runs)
// on a real node of tests/harness/realnode against the local control plane
// (CCR_NODES=simnode: a simulated one), with the traffic of every pod as the
// ground truth. No repair (every pod bypasses and keeps bypassing), repair
// (every bypassing pod replaced and meshed), prevention (no pod ever
// bypasses: the readiness label and the startup taint, also set by the
// admission policy), a sandbox recreated without consul-cni, node reboots
// with the controller on and off the node, consul-k8s's own installer and
// plugin (repair only), and a run whose bypass path is broken, which must be
// void. A run that could not observe what it claims fails (scenario.Verdict).
//
//	make node-bins && go test -tags integration -p 1 -run TestRaceRepair ./tests/suites/scenario
package scenario
