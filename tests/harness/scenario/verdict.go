package scenario

import "fmt"

// Verdict lists why a run's result does not show what its mode claims,
// empty when it does. Two kinds of reasons: the run could not have observed
// what it claims (no answered connection, a broken bypass path, no race
// seen: the result is void, whatever its numbers), or it observed the
// product failing (a bypass left at the end, a pod never meshed). The demo
// exits non-zero on any, and every scenario test fails on any.
func Verdict(mode Mode, res *Result) []string {
	v := observable(res)
	switch mode {
	case NoRepair:
		if res.EverBypassed != res.Pods || res.BypassingAtEnd != res.Pods {
			v = append(v, fmt.Sprintf("the race was not shown: %d of %d pods ever bypassed, %d at the end (want all, all)", res.EverBypassed, res.Pods, res.BypassingAtEnd))
		}
		if c := res.Control; c == nil || c.Meshed == 0 || c.Bypass != 0 {
			v = append(v, fmt.Sprintf("the pod created after the plugin was chained was not meshed only: %s", podCounts(c)))
		}
	case Repair, NodeReboot, SandboxRecreated:
		if res.EverBypassed == 0 {
			v = append(v, "the race was not shown: no pod was ever seen bypassing, so there was nothing to repair")
		}
		v = append(v, allMeshed(res)...)
	case Prevention:
		if res.EverBypassed != 0 {
			v = append(v, fmt.Sprintf("%d pods bypassed the proxy although the node was not ready for them", res.EverBypassed))
		}
		v = append(v, allMeshed(res)...)
	}
	return v
}

// observable is what every run must have seen for its numbers to mean
// anything: the plain pod bypassing (the bypass path works) and an answered
// connection from every pod.
func observable(res *Result) []string {
	var v []string
	if p := res.Plain; p == nil || p.Bypass == 0 || p.Meshed != 0 || p.ExternalConnections == 0 {
		v = append(v, fmt.Sprintf("the bypass path is broken: the plain pod without the mesh was not seen reaching the external service (%s); "+
			"no result of this run about bypass can be trusted", podCounts(p)))
	}
	for _, p := range res.PodResults {
		if p.Meshed+p.Bypass == 0 && (!p.Deleted || p.Errors > 0) {
			v = append(v, fmt.Sprintf("pod %s: not one answered connection (%d errors): neither meshed nor bypass was observed", p.Name, p.Errors))
		}
	}
	return v
}

func allMeshed(res *Result) []string {
	if res.BypassingAtEnd != 0 || res.SecondsToAllMeshed == nil {
		return []string{fmt.Sprintf("not every pod was meshed at the end: %d bypassing", res.BypassingAtEnd)}
	}
	return nil
}

func podCounts(p *PodResult) string {
	if p == nil {
		return "no report from it"
	}
	return fmt.Sprintf("%d meshed, %d bypass, %d errors, %d connections seen by the external service", p.Meshed, p.Bypass, p.Errors, p.ExternalConnections)
}
