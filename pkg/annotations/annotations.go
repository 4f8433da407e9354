// Package annotations holds the names and values that consul-k8s, the
// consul-cni plugin and the repair controller share, and the parsing and
// validation of consul-k8s's redirect-traffic-config annotation.
//
// It is a leaf package: it imports only the standard library, so both
// binaries can use it without pulling in a Kubernetes client.
package annotations

import (
	"fmt"
	"strings"
	"time"
)

// KeyConnectInject is the pod annotation the consul-k8s webhook obeys:
// "false" keeps a pod out of the mesh even where injection is the default
// (connectInject.default=true). This project's own pods carry it.
const KeyConnectInject = "consul.hashicorp.com/connect-inject"

// Pod markers written by the consul-k8s connect-inject webhook.
const (
	// KeyInjectStatus is set (as annotation and label) to "injected" on every
	// pod the webhook injected.
	KeyInjectStatus = "consul.hashicorp.com/connect-inject-status"
	// KeyMeshInjectStatus is the older mesh v2 marker (annotation, any
	// non-empty value).
	KeyMeshInjectStatus = "consul.hashicorp.com/mesh-inject-status"
	// KeyTransparentProxyStatus is "enabled" when the webhook turned on
	// transparent proxy, "waiting" while the CNI plugin applies the rules
	// and "complete" once they are in place.
	KeyTransparentProxyStatus = "consul.hashicorp.com/transparent-proxy-status"
	// KeyRedirectTrafficConfig holds the JSON redirect configuration the
	// plugin turns into iptables rules.
	KeyRedirectTrafficConfig = "consul.hashicorp.com/redirect-traffic-config"
	// KeyDualStack is "true" when the pod's redirection covers IPv6 too.
	// Older webhooks do not write it; missing means single stack.
	KeyDualStack = "consul.hashicorp.com/dual-stack"

	// KeyConfigMirror is kubelet's annotation on the API mirror of a static
	// pod; its value is the static pod's own UID (the one the runtime and
	// CNI_ARGS carry).
	KeyConfigMirror = "kubernetes.io/config.mirror"
)

// Values of the markers above.
const (
	InjectStatusInjected = "injected"

	TProxyStatusEnabled  = "enabled"
	TProxyStatusWaiting  = "waiting"
	TProxyStatusComplete = "complete"
	// TProxyStatusCompleted is accepted when reading (it appears in bug
	// reports and older tooling) but never written.
	TProxyStatusCompleted = "completed"
)

// Names this project adds. They are documented in docs/reference/names.md and must not
// change without a migration note.
const (
	// LabelCNIReady is the node label set to LabelCNIReadyValue once the
	// consul-cni plugin is really in the node's CNI chain.
	LabelCNIReady      = "consul.hashicorp.com/cni"
	LabelCNIReadyValue = "ready"
	// AnnotationCNIReadySince is the node annotation written together with
	// LabelCNIReady: when the node's CNI became ready (RFC 3339, UTC). The
	// repair controller's circuit breaker reads it back as its baseline, so
	// a restart or a failover does not move it.
	AnnotationCNIReadySince = "consul.hashicorp.com/cni-ready-since"
	// KeyCNIAppliedAt is the pod annotation the consul-cni plugin writes in
	// the same patch that sets the transparent-proxy-status to complete:
	// when the rules were applied in the pod's sandbox (RFC 3339, UTC). A
	// sandbox made later than that (a node reboot) got no rules from it.
	KeyCNIAppliedAt = "consul.hashicorp.com/cni-applied-at"
	// TaintCNINotReady is the default key of the startup taint removed from
	// a node once its CNI is ready.
	TaintCNINotReady = "consul.hashicorp.com/cni-not-ready"
	// LabelCNIStartupTaint set to LabelCNIStartupTaintOptOut on a Node
	// keeps the optional admission policy (component node-startup-taint)
	// from adding the startup taint when the Node is created: node pools
	// without Consul.
	LabelCNIStartupTaint       = "consul.hashicorp.com/cni-startup-taint"
	LabelCNIStartupTaintOptOut = "false"
	// LabelInstallerMode on a CNI installer pod set to
	// InstallerModeUninstall says the pod removes the plugin from its node:
	// the node is not CNI ready, loses the readiness label and the startup
	// taint, and is never repaired on.
	LabelInstallerMode     = "consul.hashicorp.com/cni-installer-mode"
	InstallerModeUninstall = "uninstall"
	// LabelUninitialized marks a pod found running outside the mesh when the
	// repair controller's action is "label".
	LabelUninitialized      = "consul.hashicorp.com/cni-uninitialized"
	LabelUninitializedValue = "true"
	// InitContainerName is the consul-k8s init container; multi-port pods
	// get one per service, named InitContainerName + "-" + service.
	InitContainerName = "consul-connect-inject-init"
	// CheckContainerName is the name recommended for an init container that
	// runs this project's check command.
	CheckContainerName = "consul-cni-check"
	// InitCheckExitCode is the exit code of the init-container check when
	// the pod's traffic is not redirected; the repair controller watches for
	// it (its --init-exit-code defaults to the same value). It has no meaning
	// to shells or sysexits.
	InitCheckExitCode = 88
	// ProxyUID and InitUID are the UIDs consul-k8s runs the Envoy/dataplane
	// sidecar and the connect-init container as.
	ProxyUID = 5995
	InitUID  = 5996
)

// What the node verifier (consul-cni-verifier) writes and the repair
// controller reads.
const (
	// ConditionRedirectVerified is the pod condition the node verifier sets
	// on each injected pod after looking at its current sandbox's network
	// namespace: True when Consul's redirect rules are there exactly as the
	// pod's redirect-traffic-config asks (the plugin's CHECK comparison),
	// False when they are not (ReasonRulesMissing, ReasonRulesDrifted).
	// Its message names the sandbox and the backend found. It can be used as
	// a readiness gate.
	ConditionRedirectVerified = "consul.hashicorp.com/RedirectVerified"
	// ReasonRulesInPlace, ReasonRulesMissing and ReasonRulesDrifted are the
	// condition's reasons: rules as configured; no rule of ours at all;
	// some rules of ours but not as configured.
	ReasonRulesInPlace = "RulesInPlace"
	ReasonRulesMissing = "RulesMissing"
	ReasonRulesDrifted = "RulesDrifted"

	// NodeConditionCNIVerified is the Node condition the node verifier
	// keeps (for readiness frameworks such as node-readiness-controller):
	// True when the runtime's CNI chain ends with consul-cni (when the
	// verifier can read it) and every injected pod's current sandbox on the
	// node was verified with its rules. lastHeartbeatTime is refreshed every
	// NodeConditionHeartbeat; the repair controller takes a verifier whose
	// heartbeat is older than NodeConditionStaleAfter for absent.
	NodeConditionCNIVerified = "consul.hashicorp.com/CNIVerified"
	ReasonNodeVerified       = "Verified"
	ReasonPodsUnredirected   = "PodsUnredirected"
	ReasonPodsUnverified     = "PodsUnverified"
	ReasonChainMissing       = "ChainMissing"
)

// NodeConditionHeartbeat and NodeConditionStaleAfter: the verifier refreshes
// its Node condition's heartbeat at the first interval; a condition whose
// heartbeat is older than the second means no verifier reports for the node.
const (
	NodeConditionHeartbeat  = time.Minute
	NodeConditionStaleAfter = 3 * time.Minute
)

// TimeLayout is the layout of the time annotations above (RFC 3339, second
// precision, always written in UTC).
const TimeLayout = "2006-01-02T15:04:05Z07:00"

// FormatTime renders t for a time annotation.
func FormatTime(t time.Time) string { return t.UTC().Format(TimeLayout) }

// ParseTime reads a time annotation; the error names the key and value.
func ParseTime(key, v string) (time.Time, error) {
	t, err := time.Parse(TimeLayout, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("annotation %s: %q is not an RFC 3339 time", key, v)
	}
	return t, nil
}

// IsInjected reports whether a pod with these labels and annotations was
// injected by the consul-k8s webhook.
func IsInjected(labels, annotations map[string]string) bool {
	if labels[KeyInjectStatus] == InjectStatusInjected || annotations[KeyInjectStatus] == InjectStatusInjected {
		return true
	}
	return annotations[KeyMeshInjectStatus] != ""
}

// TProxyStatus returns the transparent-proxy-status annotation and whether
// it is present.
func TProxyStatus(annotations map[string]string) (string, bool) {
	s, ok := annotations[KeyTransparentProxyStatus]
	return s, ok
}

// IsComplete reports whether a transparent-proxy-status value says the
// redirect rules are in place.
func IsComplete(status string) bool {
	return status == TProxyStatusComplete || status == TProxyStatusCompleted
}

// UsesTransparentProxy reports whether a pod is injected and has a
// transparent-proxy-status annotation: the plugin redirects its traffic,
// and the repair controller may examine it.
func UsesTransparentProxy(labels, annotations map[string]string) bool {
	if !IsInjected(labels, annotations) {
		return false
	}
	_, ok := TProxyStatus(annotations)
	return ok
}

// DualStack reads the dual-stack annotation. A missing or empty annotation
// means single stack (older webhooks do not write it); any value other than
// "true" or "false" (in any case) is an error.
func DualStack(annotations map[string]string) (bool, error) {
	v, ok := annotations[KeyDualStack]
	if !ok || v == "" {
		return false, nil
	}
	switch strings.ToLower(v) {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, fmt.Errorf("annotation %s: %q is not a boolean (want \"true\" or \"false\")", KeyDualStack, v)
}
