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

// An installer in another mount namespace than the probe's is another
// container's (the probe sees the host's processes: a test on the host, a
// pod with hostPID): it is not the installer beside the probe, whatever
// it watches. One in the probe's own namespace is.
func TestCheckTakesOnlyTheInstallerBesideTheProbe(t *testing.T) {
	net, bin := t.TempDir(), t.TempDir()
	run := []string{"consul-cni-installer", "run"}
	other := watchchecktest.Proc(t, run, net, bin)
	watchchecktest.MountNamespaces(t, other, "mnt:[4026531841]", "mnt:[4026532999]")
	if err := Check(other, net, bin); !errors.Is(err, ErrNoInstallerProcess) {
		t.Errorf("an installer in another mount namespace: %v, want ErrNoInstallerProcess", err)
	}
	beside := watchchecktest.Proc(t, run, net, bin)
	watchchecktest.MountNamespaces(t, beside, "mnt:[4026531841]", "mnt:[4026531841]")
	if err := Check(beside, net, bin); err != nil {
		t.Errorf("the installer in the probe's mount namespace: %v", err)
	}
}
