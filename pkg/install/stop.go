package install

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"time"

	"k8s.io/klog/v2"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/leave"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/nodefile"
)

// stopTimeout bounds the decision and the removal after SIGTERM: the
// DaemonSet gives the pod 10 s (terminationGracePeriodSeconds).
const stopTimeout = 8 * time.Second

// stop runs when Run is cancelled: it asks whether the node keeps an
// installer (Config.Decide, package leave) and removes everything when it
// does not.
// Until the API has answered, the state file says a successor is expected:
// a kill in the middle never lets refused credentials pass pods through.
func (in *Installer) stop(ctx context.Context) {
	log := klog.FromContext(ctx)
	if in.cfg.Decide == nil {
		log.Info("Stopping; the installation stays in place (only uninstall removes it)")
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout)
	defer cancel()
	in.writeState(ctx, in.successorState("deciding whether another installer comes"))
	d, err := in.cfg.Decide(ctx)
	switch {
	case err != nil && leave.CredentialsRefused(err):
		log.Error(err, "Stopping; the API refuses this installer's own credentials, so the product is being removed: the installation stays in place and, with no installer heartbeat, the plugin passes pods through once refused itself")
		in.writeState(ctx, in.stoppedState("own credentials refused: "+err.Error()))
	case err != nil:
		log.Error(err, "Stopping; the API could not say whether another installer comes to this node, so the installation stays in place")
		in.writeState(ctx, in.successorState("the API could not say: "+err.Error()))
	case d.Leaving:
		log.Info("Stopping and leaving the node: no installer pod will run here again; removing consul-cni", "why", d.Why)
		res, err := in.Uninstall(ctx)
		if err != nil {
			log.Error(err, "Removing consul-cni from the node on the way out is incomplete", "removed", res.Removed)
			in.writeState(ctx, in.stoppedState("left the node ("+d.Why+"), removal incomplete: "+err.Error()))
			return
		}
		log.Info("Removed consul-cni from the node", "removed", res.Removed, "keptBinary", res.KeptBinary)
	default:
		log.Info("Stopping; another installer pod will run on this node, so the installation stays in place", "why", d.Why)
		in.writeState(ctx, in.successorState(d.Why))
	}
}

// The state file (cniconf.StateFileName, in the bin directory) carries the
// heartbeat of a running installer (its modification time, refreshed every
// cniconf.HeartbeatInterval) and what the last one to stop said about a
// successor; the plugin reads it when its credentials are refused
// (cniconf.ProductLeft).

func (in *Installer) statePath() string { return filepath.Join(in.cfg.BinDir, cniconf.StateFileName) }

func (in *Installer) podName() string {
	if o := in.self(); o.Pod != "" {
		return o.Namespace + "/" + o.Pod
	}
	return ""
}

// successorState says another installer is expected for
// cniconf.SuccessorWait.
func (in *Installer) successorState(reason string) cniconf.InstallerState {
	until := time.Now().Add(cniconf.SuccessorWait).UTC()
	return cniconf.InstallerState{Pod: in.podName(), SuccessorExpectedUntil: &until, Reason: reason}
}

// stoppedState says this installer stopped and none is expected.
func (in *Installer) stoppedState(reason string) cniconf.InstallerState {
	return cniconf.InstallerState{Pod: in.podName(), Reason: reason}
}

// writeState replaces the state file (its modification time is now).
func (in *Installer) writeState(ctx context.Context, s cniconf.InstallerState) {
	b, err := json.Marshal(s)
	if err == nil {
		err = nodefile.WriteAtomic(in.statePath(), append(b, '\n'), 0o644)
	}
	if err != nil {
		klog.FromContext(ctx).Error(err, "Cannot write the installer state file", "file", in.statePath())
	}
}

// heartbeat records that an installer runs on the node: the state file's
// modification time is set to now, and a successor marker or a stop reason
// left by an installer before this one is cleared.
func (in *Installer) heartbeat(ctx context.Context) {
	cur, _, err := cniconf.ReadInstallerState(in.cfg.BinDir)
	if err != nil || cur.SuccessorExpectedUntil != nil || cur.Reason != "" {
		in.writeState(ctx, cniconf.InstallerState{Pod: in.podName()})
		return
	}
	now := time.Now()
	if err := os.Chtimes(in.statePath(), now, now); err != nil {
		klog.FromContext(ctx).Error(err, "Cannot refresh the installer heartbeat", "file", in.statePath())
	}
}
