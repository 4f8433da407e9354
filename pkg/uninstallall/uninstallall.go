// Package uninstallall is the cluster half of uninstalling the plugin,
// `consul-cni-installer uninstall-all` (the chart's pre-delete hook): it
// switches the installer DaemonSet into uninstall mode, the change
// manifests/overlays/uninstall applies, and waits until every node is
// clean. The node half is pkg/install's Uninstall, which each remover (an
// installer pod in uninstall mode) runs on its node; this package only
// changes the DaemonSet and reads its pods' readiness, the removers'
// report that their node is clean.
package uninstallall

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
)

// Container paths of the node's CNI directories in the installer pod.
const (
	containerBinDir = "/host/opt/cni/bin"
	containerNetDir = "/host/etc/cni/net.d"
)

// Op is one RFC 6902 JSON patch operation.
type Op struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value"`
}

// Patch is the JSON patch that turns the installer DaemonSet into removers,
// the same change as manifests/overlays/uninstall: the running installers
// stop before the removers start (maxSurge 0, maxUnavailable 100%), each
// remover runs `uninstall --wait`, is labelled with the uninstall mode and
// is Ready only once nothing of consul-cni is left on its node.
// hostNetDir is the node's CNI configuration directory.
func Patch(hostNetDir string) ([]Op, error) {
	if !filepath.IsAbs(hostNetDir) {
		return nil, fmt.Errorf("host CNI net dir %q is not an absolute path", hostNetDir)
	}
	dirs := []string{"--cni-bin-dir=" + containerBinDir, "--cni-net-dir=" + containerNetDir, "--host-cni-net-dir=" + hostNetDir}
	return []Op{
		{Op: "replace", Path: "/spec/updateStrategy", Value: map[string]any{
			"type":          "RollingUpdate",
			"rollingUpdate": map[string]any{"maxSurge": 0, "maxUnavailable": "100%"},
		}},
		{Op: "add", Path: "/spec/template/metadata/labels/" + escape(annotations.LabelInstallerMode), Value: annotations.InstallerModeUninstall},
		{Op: "replace", Path: "/spec/template/spec/automountServiceAccountToken", Value: false},
		{Op: "replace", Path: "/spec/template/spec/containers/0/args", Value: append([]string{"uninstall", "--wait", "--resync=10s"}, dirs...)},
		{Op: "replace", Path: "/spec/template/spec/containers/0/readinessProbe/exec/command", Value: append([]string{"consul-cni-installer", "uninstalled"}, dirs...)},
	}, nil
}

// escape is a JSON pointer reference token (RFC 6901).
func escape(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

// Options of one uninstall-all.
type Options struct {
	Namespace, DaemonSet string
	HostNetDir           string
	// Poll is the period of the status checks.
	Poll time.Duration
}

// Run patches the DaemonSet into removers (unless it already is) and waits
// until every scheduled pod is an updated, Ready remover. When ctx ends
// first, the error names what is not clean.
func Run(ctx context.Context, c kubernetes.Interface, o Options) error {
	logger := klog.FromContext(ctx)
	ops, err := Patch(o.HostNetDir)
	if err != nil {
		return err
	}
	ds, err := c.AppsV1().DaemonSets(o.Namespace).Get(ctx, o.DaemonSet, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("daemonset %s/%s: %w", o.Namespace, o.DaemonSet, err)
	}
	if ds.Spec.Template.Labels[annotations.LabelInstallerMode] != annotations.InstallerModeUninstall {
		b, err := json.Marshal(ops)
		if err != nil {
			return err
		}
		if _, err := c.AppsV1().DaemonSets(o.Namespace).Patch(ctx, o.DaemonSet, types.JSONPatchType, b, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("daemonset %s/%s: switching to uninstall mode: %w", o.Namespace, o.DaemonSet, err)
		}
		logger.Info("Switched the installer DaemonSet to removers", "namespace", o.Namespace, "daemonset", o.DaemonSet)
	}
	period := o.Poll
	if period <= 0 {
		period = 2 * time.Second
	}
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		left, err := NotClean(ctx, c, o.Namespace, o.DaemonSet)
		if err == nil && len(left) == 0 {
			logger.Info("Every node is clean", "namespace", o.Namespace, "daemonset", o.DaemonSet)
			return nil
		}
		select {
		case <-ctx.Done():
			if err != nil {
				return fmt.Errorf("daemonset %s/%s: not every node is clean: %w", o.Namespace, o.DaemonSet, err)
			}
			return fmt.Errorf("daemonset %s/%s: not every node is clean: %s", o.Namespace, o.DaemonSet, strings.Join(left, "; "))
		case <-t.C:
		}
	}
}

// NotClean lists what keeps the uninstall from being complete: a DaemonSet
// status behind its spec, pods scheduled but not updated, and each node
// whose pod is not a Ready remover. Empty: every node is clean.
func NotClean(ctx context.Context, c kubernetes.Interface, ns, name string) ([]string, error) {
	ds, err := c.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("daemonset %s/%s: %w", ns, name, err)
	}
	var left []string
	st := ds.Status
	if st.ObservedGeneration < ds.Generation {
		left = append(left, fmt.Sprintf("status of generation %d not observed (at %d)", ds.Generation, st.ObservedGeneration))
	}
	if st.UpdatedNumberScheduled != st.DesiredNumberScheduled || st.NumberReady != st.DesiredNumberScheduled {
		left = append(left, fmt.Sprintf("%d nodes desired, %d updated, %d ready", st.DesiredNumberScheduled, st.UpdatedNumberScheduled, st.NumberReady))
	}
	pods, err := podsOf(ctx, c, ds)
	if err != nil {
		return nil, err
	}
	for _, p := range pods {
		if msg := notRemoved(p); msg != "" {
			left = append(left, fmt.Sprintf("node %q: pod %s %s", p.Spec.NodeName, p.Name, msg))
		}
	}
	sort.Strings(left)
	return left, nil
}

func podsOf(ctx context.Context, c kubernetes.Interface, ds *appsv1.DaemonSet) ([]corev1.Pod, error) {
	sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
	if err != nil {
		return nil, fmt.Errorf("daemonset %s/%s: selector: %w", ds.Namespace, ds.Name, err)
	}
	l, err := c.CoreV1().Pods(ds.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil, fmt.Errorf("pods of daemonset %s/%s: %w", ds.Namespace, ds.Name, err)
	}
	return l.Items, nil
}

// notRemoved says why p is not a Ready remover ("" when it is).
func notRemoved(p corev1.Pod) string {
	if p.Labels[annotations.LabelInstallerMode] != annotations.InstallerModeUninstall {
		return "is an installer, not a remover"
	}
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
			return ""
		}
	}
	return "is not Ready (its node is not clean yet)"
}
