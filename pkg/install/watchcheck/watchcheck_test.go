package watchcheck

import (
	"errors"
	"strings"
	"testing"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/watchcheck/watchchecktest"
)

// The readiness probe finds the installer's `run` process and reads its
// inotify watches from the kernel's fdinfo: both directories watched is
// ready; one missing is not, named, with the inotify limits as the cause
// to look at; no installer process visible is told apart.
func TestCheckFindsTheRunProcessAndItsWatches(t *testing.T) {
	net, bin := t.TempDir(), t.TempDir()
	run := []string{"/usr/local/bin/consul-cni-installer", "--cni-net-dir=/host/etc/cni/net.d", "run"}
	if err := Check(watchchecktest.Proc(t, run, net, bin), net, bin); err != nil {
		t.Errorf("both watched: %v", err)
	}
	err := Check(watchchecktest.Proc(t, run, net), net, bin)
	if err == nil || !strings.Contains(err.Error(), bin) || strings.Contains(err.Error(), net+",") || !strings.Contains(err.Error(), "max_user_watches") {
		t.Errorf("bin dir not watched: %v", err)
	}
	if err := Check(watchchecktest.Proc(t, run), net, bin); err == nil {
		t.Error("no watch at all: ready")
	}
	defaultRun := []string{"consul-cni-installer", "--resync=30s"}
	if err := Check(watchchecktest.Proc(t, defaultRun, net, bin), net, bin); err != nil {
		t.Errorf("run as the default subcommand: %v", err)
	}
	probe := []string{"consul-cni-installer", "ready"}
	if err := Check(watchchecktest.Proc(t, probe, net, bin), net, bin); !errors.Is(err, ErrNoInstallerProcess) {
		t.Errorf("only a probe process: %v, want ErrNoInstallerProcess", err)
	}
}
