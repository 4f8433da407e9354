package plugin

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/iptables"
)

// Defaults of the configuration keys this project adds.
const (
	DefaultAPITimeout      = 30 * time.Second
	DefaultIptablesTimeout = 30 * time.Second
	DefaultCNINetDir       = "/etc/cni/net.d"
	DefaultCNIBinDir       = "/opt/cni/bin"
	DefaultStateDir        = "/var/run/consul-cni"
	// VariantCacheTTL is how long a detected iptables variant is reused.
	VariantCacheTTL = 10 * time.Minute
	maxTimeout      = 10 * time.Minute
)

// DefaultExcludeNamespaces is exclude_namespaces when the key is absent:
// consul-k8s never injects kube-system, and the cluster's own add-ons must
// start on a node whatever state the plugin is in.
var DefaultExcludeNamespaces = []string{"kube-system"}

// Config is the plugin's entry in the conflist. The keys consul-k8s writes
// keep their names and meaning; the others are optional additions.
type Config struct {
	types.PluginConf

	// Settings are the keys the installers write (cniconf): the host's
	// plugin and configuration directories, the kubeconfig file name inside
	// cni_net_dir (an absolute path is used as it is; when the file does not
	// exist, the newest regular file named "<kubeconfig>-*" is used, as
	// consul-k8s does), log_level and multus.
	cniconf.Settings

	// Written by newer consul-k8s installers; accepted and not used: the
	// kubeconfig's tokenFile already keeps the token current.
	CNITokenPath     string `json:"cni_token_path,omitempty"`
	CNIHostTokenPath string `json:"cni_host_token_path,omitempty"`
	AutorotateToken  bool   `json:"autorotate_token,omitempty"`

	// APITimeout bounds all Kubernetes API work of one call (Go duration,
	// default 30s): when the API cannot be reached within it, ADD fails.
	APITimeout string `json:"api_timeout,omitempty"`
	// IptablesTimeout bounds the iptables work of one call (default 30s).
	IptablesTimeout string `json:"iptables_timeout,omitempty"`
	// Backend is how the redirect rules are programmed: "iptables"
	// (default; the nat table's CONSUL_* chains, SDK v0.18) or "nftables"
	// (the table inet consul_tproxy over netlink, SDK v0.19). A call with
	// one backend removes what the other left in the pod namespace.
	Backend string `json:"backend,omitempty"`
	// IptablesVariant is, for the iptables backend, which variant of the
	// iptables tools runs: auto (default: the node's, detected as
	// kube-proxy does), nft or legacy.
	IptablesVariant string `json:"iptables_variant,omitempty"`
	// IptablesBackend is IptablesVariant's former key, still accepted.
	IptablesBackend string `json:"iptables_backend,omitempty"`
	// LogFile, when set, receives the log instead of stderr.
	LogFile string `json:"log_file,omitempty"`
	// StateDir holds the cached variant detection (default
	// /var/run/consul-cni).
	StateDir string `json:"state_dir,omitempty"`
	// ExcludeNamespaces are namespaces whose pods the plugin passes through
	// without any API call (nil: DefaultExcludeNamespaces; an empty list
	// excludes none). Their pods start even when the plugin cannot reach
	// the API.
	ExcludeNamespaces *[]string `json:"exclude_namespaces,omitempty"`

	apiTimeout      time.Duration
	iptablesTimeout time.Duration
	iptablesVariant iptables.Variant // nft or legacy iptables tools (iptables_variant)
	autoVariant     bool
	level           slog.Level
	logOff          bool
}

// SupportedVersions are the CNI spec versions the plugin implements: every
// version, as consul-k8s's plugin (version.All), so chaining into a
// network of any version never makes its ADD and DEL fail. The prevResult
// is handed on in the network's version; STATUS and GC exist from 1.1.0.
var SupportedVersions = []string{"0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}

// VersionInfo is what the plugin answers to VERSION.
var VersionInfo = version.PluginSupports(SupportedVersions...)

// ConfigError names the configuration key and value that are wrong.
type ConfigError struct {
	Key, Value, Reason string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("consul-cni configuration: key %q: %q %s", e.Key, e.Value, e.Reason)
}

// parseConfig decodes and validates the plugin configuration and its
// prevResult (CNI passes it from the previous plugin; it is handed on
// unchanged).
func parseConfig(stdin []byte) (*Config, error) {
	conf := &Config{}
	if err := json.Unmarshal(stdin, conf); err != nil {
		return nil, fmt.Errorf("consul-cni configuration is not valid JSON: %w", err)
	}
	if err := conf.validate(); err != nil {
		return nil, err
	}
	if err := version.ParsePrevResult(&conf.PluginConf); err != nil {
		return nil, fmt.Errorf("consul-cni configuration: prevResult: %w", err)
	}
	return conf, nil
}

func (c *Config) validate() error {
	if c.CNIVersion == "" {
		return &ConfigError{"cniVersion", "", "is required"}
	}
	supported := false
	for _, v := range SupportedVersions {
		supported = supported || v == c.CNIVersion
	}
	if !supported {
		return &ConfigError{"cniVersion", c.CNIVersion, "is not supported (want one of " + strings.Join(SupportedVersions, ", ") + ")"}
	}
	var err error
	if c.apiTimeout, err = duration("api_timeout", c.APITimeout, DefaultAPITimeout); err != nil {
		return err
	}
	if c.iptablesTimeout, err = duration("iptables_timeout", c.IptablesTimeout, DefaultIptablesTimeout); err != nil {
		return err
	}
	switch c.Backend {
	case "":
		c.Backend = cniconf.BackendIptables
	case cniconf.BackendIptables, cniconf.BackendNftables:
	default:
		return &ConfigError{cniconf.KeyBackend, c.Backend, cniconf.BackendReason}
	}
	if err := c.parseVariant(); err != nil {
		return err
	}
	switch strings.ToLower(c.LogLevel) {
	case "trace", "debug":
		c.level = slog.LevelDebug
	case "", "info":
		c.level = slog.LevelInfo
	case "warn", "warning":
		c.level = slog.LevelWarn
	case "error":
		c.level = slog.LevelError
	case "off", "none":
		c.logOff = true
	default:
		return &ConfigError{cniconf.KeyLogLevel, c.LogLevel, cniconf.LogLevelReason}
	}
	if c.Kubeconfig != "" {
		if strings.ContainsAny(c.Kubeconfig, "\x00\n") || strings.ContainsAny(filepath.Base(c.Kubeconfig), "*?[") {
			return &ConfigError{cniconf.KeyKubeconfig, c.Kubeconfig, "is not a file name"}
		}
	}
	if c.CNINetDir != "" && !filepath.IsAbs(c.CNINetDir) {
		return &ConfigError{cniconf.KeyCNINetDir, c.CNINetDir, "is not an absolute path"}
	}
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir
	} else if !filepath.IsAbs(c.StateDir) {
		return &ConfigError{"state_dir", c.StateDir, "is not an absolute path"}
	}
	if c.LogFile != "" && !filepath.IsAbs(c.LogFile) {
		return &ConfigError{"log_file", c.LogFile, "is not an absolute path"}
	}
	if c.ExcludeNamespaces != nil {
		for _, ns := range *c.ExcludeNamespaces {
			if !dns1123Label.MatchString(ns) || len(ns) > 63 {
				return &ConfigError{cniconf.KeyExcludeNamespaces, ns, "is not a namespace name"}
			}
		}
	}
	return nil
}

var dns1123Label = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// nftables reports whether the nftables backend is selected.
func (c *Config) nftables() bool { return c.Backend == cniconf.BackendNftables }

// parseVariant reads iptables_variant, or its former key iptables_backend;
// both may be set only to the same value.
func (c *Config) parseVariant() error {
	key, v := "iptables_variant", c.IptablesVariant
	switch {
	case v == "":
		key, v = "iptables_backend", c.IptablesBackend
	case c.IptablesBackend != "" && !strings.EqualFold(c.IptablesBackend, v):
		return &ConfigError{"iptables_backend", c.IptablesBackend, "differs from iptables_variant " + strconv.Quote(v) + " (iptables_backend is its former name: set only iptables_variant)"}
	}
	var err error
	if c.iptablesVariant, c.autoVariant, err = iptables.ParseVariant(v); err != nil {
		return &ConfigError{key, v, "is not auto, nft or legacy"}
	}
	return nil
}

// excluded reports whether pods of namespace ns are passed through without
// looking at them (exclude_namespaces).
func (c *Config) excluded(ns string) bool {
	list := DefaultExcludeNamespaces
	if c.ExcludeNamespaces != nil {
		list = *c.ExcludeNamespaces
	}
	return slices.Contains(list, ns)
}

func duration(key, s string, def time.Duration) (time.Duration, error) {
	if s == "" {
		return def, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 || d > maxTimeout {
		return 0, &ConfigError{key, s, "is not a duration between 0 and 10m (for example \"30s\")"}
	}
	return d, nil
}

// binDir is the host's CNI bin directory (cni_bin_dir), where the
// installer keeps its state file.
func (c *Config) binDir() string {
	if c.CNIBinDir == "" {
		return DefaultCNIBinDir
	}
	return c.CNIBinDir
}

// netDir is the directory the kubeconfig name is relative to.
func (c *Config) netDir() string {
	if c.CNINetDir == "" {
		return DefaultCNINetDir
	}
	return c.CNINetDir
}

// cniArgs are the CNI_ARGS the plugin reads. The runtime passes more (and
// IgnoreUnknown=1); unknown keys are ignored.
type cniArgs struct {
	PodName, PodNamespace, PodUID, InfraContainerID string
	// IptablesConfig is Nomad's CONSUL_IPTABLES_CONFIG: the redirect
	// configuration as JSON, in place of a pod.
	IptablesConfig string
}

// parseCNIArgs reads "K=V;K2=V2". Values may contain '=' (only the first
// one separates), so Nomad's JSON passes intact.
func parseCNIArgs(s string) (cniArgs, error) {
	var a cniArgs
	if s == "" {
		return a, nil
	}
	for _, pair := range strings.Split(s, ";") {
		if pair == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		if !ok {
			return a, fmt.Errorf("CNI_ARGS: %q is not KEY=VALUE", pair)
		}
		switch k {
		case "K8S_POD_NAME":
			a.PodName = v
		case "K8S_POD_NAMESPACE":
			a.PodNamespace = v
		case "K8S_POD_UID":
			a.PodUID = v
		case "K8S_POD_INFRA_CONTAINER_ID":
			a.InfraContainerID = v
		case "CONSUL_IPTABLES_CONFIG":
			a.IptablesConfig = v
		}
	}
	return a, nil
}
