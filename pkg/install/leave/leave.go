// Package leave decides, when the installer is stopped (SIGTERM), whether
// its node will get another installer pod, as the DaemonSet controller
// places pods:
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
//     When it is the installer's own credentials the API refuses
//     (CredentialsRefused: its pod, ServiceAccount or RBAC are gone, which
//     happens only when the product is removed), no successor is recorded,
//     so that rule applies once the heartbeat is LeftAfter old.
//
// APIDecider reads the objects that decide when asked. Removing the
// product deletes the installer's DaemonSet and, right after, its
// ServiceAccount and RBAC (Helm's uninstall order; a helm upgrade that
// switches the installer off; kubectl delete -k). The installer's pod gets
// SIGTERM only once the garbage collector deletes it, by which time the
// API may refuse the installer's own credentials, and a GET at SIGTERM
// alone could not tell leaving from an API outage. So the installer
// watches (StartWatch), from its start, the three objects that decide (its
// DaemonSet, its namespace, its node), each by name: a watch already open
// keeps delivering after the rights to open one are gone. On SIGTERM
// (Watch.Decider):
//
//   - a fresh GET that answers decides, as APIDecider says;
//   - a GET that does not answer (refused credentials, an unavailable API)
//     leaves only when the watch saw what leaving means: the DaemonSet
//     deleted or being deleted, the namespace deleted or being deleted,
//     or the DaemonSet's latest template not placing a pod on the node's
//     latest state; an event still on its way gets WatchGrace;
//   - nothing seen: the GET's error decides, and everything stays.
//
// The installer (package install) acts on the decision: it removes
// everything, or keeps it and records in the state file whether a
// successor is expected.
package leave

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/credentials"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/placement"
)

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

// CredentialsRefused reports whether a Decider's error is the API refusing
// the installer's own credentials (401, 403): its pod, ServiceAccount or
// RBAC are gone.
func CredentialsRefused(err error) bool {
	return apierrors.IsUnauthorized(err) || apierrors.IsForbidden(err)
}
