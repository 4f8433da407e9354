package install

import "github.com/consul-cni-repair/consul-cni-repair/pkg/install/watchcheck"

// Ready is the readiness probe's verdict: the plugin is chained
// (VerifyInstalled) and the installer's `run` process visible in procRoot
// watches the net and bin directories (watchcheck.Check). When no such
// process is visible (the probe run by hand, away from the installer's
// container) only the files are checked; the caller says so.
func (in *Installer) Ready(procRoot string) error {
	if err := in.VerifyInstalled(); err != nil {
		return err
	}
	return watchcheck.Check(procRoot, in.cfg.NetDir, in.cfg.BinDir)
}
