package install

import (
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/configkey"
)

// Validate checks the settings written into the chain entry and the
// directories; the error is a *configkey.Error naming the field.
func (cfg *Config) Validate() error {
	for _, f := range []struct{ key, v string }{
		{"BinDir", cfg.BinDir}, {"NetDir", cfg.NetDir},
		{"HostBinDir", cfg.HostBinDir}, {"HostNetDir", cfg.HostNetDir},
	} {
		if f.v == "" {
			return configkey.New(f.key, nil, "must be set")
		}
		if !filepath.IsAbs(f.v) {
			return configkey.New(f.key, f.v, "is not an absolute path")
		}
	}
	// Empty is the default, info.
	if cfg.LogLevel != "" && cniconf.ValidLogLevel(cfg.LogLevel) != nil {
		return configkey.New("LogLevel", cfg.LogLevel, cniconf.LogLevelReason)
	}
	if cfg.Backend != "" && cniconf.ValidBackend(cfg.Backend) != nil {
		return configkey.New("Backend", cfg.Backend, cniconf.BackendReason)
	}
	for _, ns := range cfg.ExcludeNamespaces {
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return configkey.New("ExcludeNamespaces", ns, "is not a namespace name: "+strings.Join(errs, "; "))
		}
	}
	return nil
}
