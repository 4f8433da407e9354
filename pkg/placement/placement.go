// Package placement says, as the DaemonSet controller decides it, whether a
// daemon pod of a template would run on a node: its node selector and
// required node affinity match the node, and it tolerates every NoSchedule
// and NoExecute taint of the node, with the tolerations the DaemonSet
// controller adds to every daemon pod. The installer asks it on SIGTERM
// (does this node keep an installer?), the node-readiness controller before
// it lifts a startup taint that no CNI pod would ever come to lift.
package placement

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"
)

// daemonTolerations are the tolerations the DaemonSet controller adds to
// every pod it creates (pkg/controller/daemon/util), and the one it adds
// for host-network pods.
var daemonTolerations = []corev1.Toleration{
	{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
	{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
	{Key: corev1.TaintNodeDiskPressure, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
	{Key: corev1.TaintNodeMemoryPressure, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
	{Key: corev1.TaintNodePIDPressure, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
	{Key: corev1.TaintNodeUnschedulable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
}

var hostNetworkToleration = corev1.Toleration{Key: corev1.TaintNodeNetworkUnavailable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}

// DaemonPodFits reports whether the DaemonSet controller would run a pod of
// template on node; why says what fails. Taints for which ignore returns
// true are left out of the judgement (nil: none).
func DaemonPodFits(template *corev1.PodSpec, node *corev1.Node, ignore func(*corev1.Taint) bool) (why string, ok bool) {
	match, err := nodeaffinity.GetRequiredNodeAffinity(&corev1.Pod{Spec: *template}).Match(node)
	if err != nil {
		// An affinity the scheduler cannot parse places no pod.
		return "has a node affinity that cannot be evaluated: " + err.Error(), false
	}
	if !match {
		return "does not select node " + node.Name + " (nodeSelector or node affinity)", false
	}
	tolerations := append(append([]corev1.Toleration{}, template.Tolerations...), daemonTolerations...)
	if template.HostNetwork {
		tolerations = append(tolerations, hostNetworkToleration)
	}
	taint, untolerated := corev1helpers.FindMatchingUntoleratedTaint(klog.Background(), node.Spec.Taints, tolerations, func(t *corev1.Taint) bool {
		return (t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute) && (ignore == nil || !ignore(t))
	}, true)
	if untolerated {
		return "does not tolerate the taint " + taint.ToString() + " of node " + node.Name, false
	}
	return "", true
}

// Transient reports the taints that the node's own lifecycle sets and lifts
// (the kubelet and node controllers' node.kubernetes.io/*, the cloud
// controller's node.cloudprovider.kubernetes.io/uninitialized): a daemon
// pod that waits for one of them to go comes once it has.
func Transient(t *corev1.Taint) bool {
	return strings.HasPrefix(t.Key, "node.kubernetes.io/") || t.Key == "node.cloudprovider.kubernetes.io/uninitialized"
}
