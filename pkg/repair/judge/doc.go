// Package judge is the repair controller's judgement, shared with `repair
// audit` so that both judge every pod alike: which injected pods bypassed
// the CNI plugin, whether their node's CNI is ready, whether the node's
// circuit breaker is open and whether a pod is of the race.
//
// Everything here is a function of the objects it is given (pods, nodes, CNI
// pods through listers or indexers) and of the time: no API call, no
// goroutine. The controller feeds it from its informer caches, the audit from
// LIST pages.
//
//   - Detector (Detect) applies the three signals to a pod: A, the
//     transparent-proxy-status still enabled/waiting MinPodAge after the
//     sandbox exists; B, the check init container exited with the check's
//     code; C, a complete pod whose sandbox was made after the rules were
//     applied (cni-applied-at). SandboxTime is the one dating of a sandbox.
//   - Gate (NewGate) tells whether a node's CNI is ready and since when:
//     the node's readiness label (node-label), its Ready CNI pod (cni-pod) or
//     always (none). ReadySince is the one definition of a node's "CNI ready
//     since", which node readiness records on the node and every gate reads.
//   - Breaker counts, per node, the pods whose sandbox was certainly made
//     after that baseline (Detector.CountedByBreaker): when too many of them
//     are broken the CNI is misconfigured there, not raced, and acting would
//     only loop.
//   - Detector.OfTheRace tells the pods whose sandbox predates their node's
//     dated readiness: the rate limiter's race lane.
//   - Config holds these settings with their defaults and validation; Flags
//     registers them under the same names for the controller and the audit.
package judge
