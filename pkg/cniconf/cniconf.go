// Package cniconf is the contract between the installer and the plugin:
// the keys of the chain entry both read and write, the names of the files
// beside it in the CNI configuration directory, and the accepted log
// levels. It imports nothing of this project, so every package and test
// can use it.
package cniconf

import (
	"fmt"
	"slices"
	"strings"
)

// Names of what is written into the host's CNI directories.
const (
	// PluginType is the CNI type (and binary name) of the plugin.
	PluginType = "consul-cni"
	// PluginName is the name of the chain entry, as consul-k8s writes it.
	PluginName = "consul-cni"
	// KubeconfigFileName is the plugin's kubeconfig the installer writes
	// inside the CNI net dir. The chain entry names it relative to
	// cni_net_dir. It has no CNI config extension, so no runtime ever reads
	// it as a network. It differs from ConsulK8sKubeconfigFileName: consul-k8s's
	// installer removes that file when its pod stops, and a chain whose
	// kubeconfig is gone is one the plugin takes for an uninstalled node.
	KubeconfigFileName = "ZZZ-consul-cni-repair-kubeconfig"
	// TokenFileName is the copy of the installer's service-account token
	// the plugin's kubeconfig points at with tokenFile.
	TokenFileName = "ZZZ-consul-cni-token"
	// OwnerFileName records which installer version wrote the binary and
	// the entry last: an older installer never overwrites what a newer one
	// wrote.
	OwnerFileName = "ZZZ-consul-cni-owner"
	// ConsulK8sKubeconfigFileName is the kubeconfig consul-k8s's own
	// installer writes into the CNI net dir (possibly with a "-<suffix>").
	ConsulK8sKubeconfigFileName = "ZZZ-consul-cni-kubeconfig"
	// LegacyKubeconfigFileName is where earlier installers of ours
	// wrote the plugin's kubeconfig: the same name as consul-k8s's. An
	// installer takes such a file over (and removes it) only when it is
	// ours: its user authenticates with tokenFile naming TokenFileName and
	// embeds no credential, where consul-k8s's embeds a token.
	LegacyKubeconfigFileName = ConsulK8sKubeconfigFileName
	// StagedBinaryName is a copy of the plugin binary the installer keeps
	// in the CNI bin directory, under a name no chain entry's type ever
	// names (it starts with a dot), so that putting the plugin back after
	// another installer removed it is a rename, not a copy.
	StagedBinaryName = ".consul-cni-repair-staged"
)

// Settings are the chain-entry keys consul-k8s writes and the plugin reads.
// CNIBinDir and CNINetDir are paths on the host (the runtime runs the
// plugin there), and Kubeconfig is a file name inside CNINetDir (an
// absolute path is used as it is).
type Settings struct {
	CNIBinDir  string `json:"cni_bin_dir"`
	CNINetDir  string `json:"cni_net_dir"`
	Kubeconfig string `json:"kubeconfig"`
	// LogLevel is one of LogLevels; empty means info.
	LogLevel string `json:"log_level"`
	// Multus marks the plugin as called by Multus, possibly without a
	// prevResult.
	Multus bool `json:"multus"`
}

// Keys of the chain entry, as named in the JSON.
const (
	KeyCNIBinDir         = "cni_bin_dir"
	KeyCNINetDir         = "cni_net_dir"
	KeyKubeconfig        = "kubeconfig"
	KeyLogLevel          = "log_level"
	KeyMultus            = "multus"
	KeyExcludeNamespaces = "exclude_namespaces"
	// KeyBackend selects how the plugin programs the redirect rules: one of
	// Backends (absent: BackendIptables). Not to be confused with the
	// plugin's iptables_variant, which picks the nft or legacy variant of
	// the iptables tools when the backend is iptables.
	KeyBackend = "backend"
)

// Values of the backend key.
const (
	// BackendIptables: the nat table's CONSUL_* chains through
	// iptables-restore, as Consul's SDK up to v0.18 installs them.
	BackendIptables = "iptables"
	// BackendNftables: the table inet consul_tproxy over netlink, as
	// Consul's SDK v0.19 installs it.
	BackendNftables = "nftables"
)

// Backends are the values of the backend key.
var Backends = []string{BackendIptables, BackendNftables}

// BackendReason is the reason a backend value is refused.
var BackendReason = "is not a redirect backend (want " + strings.Join(Backends, " or ") + ")"

// ValidBackend checks a backend value to write: one of Backends.
func ValidBackend(s string) error {
	if slices.Contains(Backends, s) {
		return nil
	}
	return fmt.Errorf("%q %s", s, BackendReason)
}

// LogLevels are the values of log_level (the plugin also takes them in
// upper case, "warning" for warn and "none" for off; absent means info).
var LogLevels = []string{"trace", "debug", "info", "warn", "error", "off"}

// LogLevelReason is the reason a log_level value is refused.
var LogLevelReason = "is not a log level (want " + strings.Join(LogLevels, ", ") + ")"

// ValidLogLevel checks a log_level value to write: one of LogLevels.
func ValidLogLevel(s string) error {
	if slices.Contains(LogLevels, s) {
		return nil
	}
	return fmt.Errorf("%q %s", s, LogLevelReason)
}
