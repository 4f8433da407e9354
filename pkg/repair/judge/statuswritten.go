package judge

import (
	"encoding/json"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
)

// Signal C needs to know when the redirect rules were applied. Our plugin
// says so in cni-applied-at; consul-k8s's plugin does not, so for a pod
// without that annotation the detector reads the time from the pod's
// managedFields instead.
//
// Who writes the transparent-proxy-status annotation in consul-k8s:
//   - its connect-inject webhook sets it to enabled when the pod is created.
//     A mutating webhook's changes are recorded under the manager of the
//     CREATE request (the ReplicaSet controller, kubectl...), with the
//     creation time: before any sandbox of the pod exists.
//   - its CNI plugin, on every ADD for an injected pod, writes waiting, applies
//     the rules, then writes complete, each with a GET and a full Update.
//     Both writes change the value (complete -> waiting -> complete on a
//     sandbox recreated after a reboot), so the API server moves the field to
//     the plugin's managedFields entry and sets that entry's time to the
//     time of the write: a managedFields entry's time moves only when its
//     manager changes a field it owns.
//
// So the time of the entry that owns the annotation is when a plugin last
// finished an ADD for the pod, on the API server's clock. A current sandbox
// that became ready later than that by more than the slack was made by a
// chain that did not run the plugin: a broken pod.
//
// Why another writer cannot make a meshed pod look broken:
//   - A later write by anyone (a human's kubectl annotate, a controller, an
//     apply) moves the owning entry's time later, past the sandbox: the pod
//     reads as not recreated. A rewrite can hide a bypass, never invent one.
//     When several entries own the field (server-side apply shares
//     ownership), the latest one counts, for the same reason.
//   - The webhook only writes at CREATE (enabled), which signal A judges, not
//     this one; a status of complete owned by the creating request (a pod
//     created with the annotation already complete, a restore) means no
//     plugin has written it since the pod was created, and a sandbox made
//     after that without a write is one the plugin never ran for.
//   - An entry that does not own the annotation (the kubelet's status, a
//     label change) is not read; a pod with no owning entry, or an entry
//     without a time, is not judged by this signal at all.
//
// What it cannot rule out, and what bounds it:
//   - consul-k8s's plugin ignores errors of its status writes. If the
//     waiting write of an ADD that did apply the rules is lost (a conflict
//     with another write between its GET and Update), the complete write
//     changes nothing and the time stays at the earlier ADD: that pod reads
//     as recreated. One pod, replaced by its owner (whose new sandbox gets a
//     new ADD), under the controller's rate limit and circuit breaker.
//   - The sandbox is dated by the kubelet (node clock), the write by the API
//     server: the slack must also cover how far a node's clock runs ahead of
//     the control plane's. A node far ahead would have all its recreated
//     sandboxes judged broken; those sandboxes are made after the node's CNI
//     became ready, so the circuit breaker counts them and stops acting on
//     the node once they pass its threshold.

// statusField is the annotation's path in a managedFields entry's
// fieldsV1.
var statusField = []string{"f:metadata", "f:annotations", "f:" + annotations.KeyTransparentProxyStatus}

// statusFieldsV1 is the fieldsV1 of StatusFieldsV1, shared (read only).
var statusFieldsV1 = []byte(`{"` + statusField[0] + `":{"` + statusField[1] + `":{"` + statusField[2] + `":{}}}}`)

// StatusWrittenAt returns when the transparent-proxy-status annotation was
// last written and by which manager, from the pod's managedFields: the
// latest time of the entries that own it; ok is false when no entry with a
// time owns it.
func StatusWrittenAt(pod *corev1.Pod) (at time.Time, manager string, ok bool) {
	for i := range pod.ManagedFields {
		e := &pod.ManagedFields[i]
		if e.Time == nil || e.FieldsV1 == nil || !ownsStatus(e.FieldsV1) {
			continue
		}
		if !ok || e.Time.After(at) {
			at, manager, ok = e.Time.Time, e.Manager, true
		}
	}
	return at, manager, ok
}

// ownsStatus reports whether a managedFields entry's fields include the
// transparent-proxy-status annotation.
func ownsStatus(f *metav1.FieldsV1) bool {
	var m map[string]any
	if json.Unmarshal(f.Raw, &m) != nil {
		return false
	}
	for _, k := range statusField {
		next, ok := m[k].(map[string]any)
		if !ok {
			return false
		}
		m = next
	}
	return true
}

// StatusFieldsV1 is a fieldsV1 naming only the status annotation (what the
// controller's informer keeps of the entry that owns it). Its bytes are
// shared: never modify them.
func StatusFieldsV1() *metav1.FieldsV1 {
	return &metav1.FieldsV1{Raw: statusFieldsV1}
}
