package install

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/credentials"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/nodefile"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/placement"
)

// When the installer is stopped (SIGTERM) it decides, from the API,
// whether this node will get another installer pod:
//
//   - leaving: its DaemonSet is gone or being deleted (kubectl delete, helm
//     uninstall --no-hooks, a helm upgrade that switched the installer off),
//     its namespace is being deleted, or the DaemonSet no longer selects or
//     tolerates the node (nodeSelector narrowed, node relabelled or
//     tainted). Nothing will put the plugin back or keep its credentials
//     current, so the installer unchains and removes everything, as
//     `uninstall` does (entries first), within the pod's grace period;
//   - staying (a rolling update, a restart, an eviction, a drain): the
//     DaemonSet still targets the node, another installer pod will come and
//     everything stays, so no sandbox is ever made without the plugin. The
//     state file (cniconf.StateFileName) says a successor is expected;
//   - the API cannot say: everything stays (an upgrade must never open a
//     window) and the log says why. What remains is covered by the
//     plugin's rule for credentials that stay refused (cniconf.ProductLeft).
//     When it is the installer's own credentials the API refuses (its pod,
//     ServiceAccount or RBAC are gone, which happens only when the product
//     is removed), no successor is recorded, so that rule applies once
//     the heartbeat is LeftAfter old.

// Decision is what the API says about the node's installer after this
// one stops.
type Decision struct {
	// Leaving is true when no installer pod will run on the node again.
	Leaving bool
	// Why names the objects that decided it.
	Why string
}

// Decider asks the API whether the node keeps an installer (Decision).
type Decider func(ctx context.Context) (Decision, error)

// APIDecider decides for the installer pod namespace/name: it reads the
// pod, its namespace, the DaemonSet that owns it and the pod's node.
func APIDecider(c kubernetes.Interface, namespace, name string) Decider {
	return func(ctx context.Context) (Decision, error) {
		pod, err := c.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return Decision{}, fmt.Errorf("reading this installer's pod %s/%s: %w", namespace, name, err)
		}
		owner := metav1.GetControllerOf(pod)
		if owner == nil || owner.Kind != "DaemonSet" {
			return Decision{}, fmt.Errorf("pod %s/%s is not run by a DaemonSet; nothing says whether it comes back", namespace, name)
		}
		ns, err := c.CoreV1().Namespaces().Get(ctx, namespace, metav1.GetOptions{})
		if err != nil {
			return Decision{}, fmt.Errorf("reading namespace %s: %w", namespace, err)
		}
		if ns.DeletionTimestamp != nil {
			return Decision{Leaving: true, Why: "namespace " + namespace + " is being deleted"}, nil
		}
		dsName := namespace + "/" + owner.Name
		ds, err := c.AppsV1().DaemonSets(namespace).Get(ctx, owner.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return Decision{Leaving: true, Why: "DaemonSet " + dsName + " is gone"}, nil
		case err != nil:
			return Decision{}, fmt.Errorf("reading DaemonSet %s: %w", dsName, err)
		case ds.DeletionTimestamp != nil:
			return Decision{Leaving: true, Why: "DaemonSet " + dsName + " is being deleted"}, nil
		}
		node, err := c.CoreV1().Nodes().Get(ctx, pod.Spec.NodeName, metav1.GetOptions{})
		if err != nil {
			return Decision{}, fmt.Errorf("reading node %q: %w", pod.Spec.NodeName, err)
		}
		if why, ok := placement.DaemonPodFits(&ds.Spec.Template.Spec, node, nil); !ok {
			return Decision{Leaving: true, Why: "DaemonSet " + dsName + " " + why}, nil
		}
		return Decision{Why: "DaemonSet " + dsName + " still targets node " + node.Name}, nil
	}
}

// PodOf returns the pod the installer's pod-bound service-account token
// names; ok is false outside a pod.
func PodOf(s credentials.Source) (namespace, name string, ok bool) {
	tok, err := s.ReadToken()
	if err != nil {
		return "", "", false
	}
	p, ok := credentials.PodOf(tok)
	if !ok || p.Name == "" {
		return "", "", false
	}
	return p.Namespace, p.Name, true
}

// ownCredentialsRefused reports whether the API refused the installer's
// own credentials (401, 403): its pod, ServiceAccount or RBAC are gone.
func ownCredentialsRefused(err error) bool {
	return apierrors.IsUnauthorized(err) || apierrors.IsForbidden(err)
}

// stopTimeout bounds the decision and the removal after SIGTERM: the
// DaemonSet gives the pod 10 s (terminationGracePeriodSeconds).
const stopTimeout = 8 * time.Second

// stop runs when Run is cancelled: it decides whether the node keeps an
// installer (Config.Decide) and removes everything when it does not.
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
	case err != nil && ownCredentialsRefused(err):
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
