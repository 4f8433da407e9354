package manifests

import (
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
)

// The uninstall overlay: the installer DaemonSet runs the remover with the
// directories of the base, probes with `uninstalled` on the same
// directories, marks its pods for the controller, replaces installers
// without overlap, and the controller cannot change pods meanwhile.
func TestUninstallOverlay(t *testing.T) {
	objs := build(t, filepath.Join(manifestsDir(t), "overlays", "uninstall"))
	base := buildOverlay(t, "base")
	var ds, baseDS appsv1.DaemonSet
	decodeStrict(t, find(t, objs, "DaemonSet", installerName), &ds)
	decodeStrict(t, find(t, base, "DaemonSet", installerName), &baseDS)
	c := ds.Spec.Template.Spec.Containers[0]
	baseArgs := baseDS.Spec.Template.Spec.Containers[0].Args
	if len(c.Args) < 2 || c.Args[0] != "uninstall" || !slices.Contains(c.Args, "--wait") {
		t.Fatalf("args %v", c.Args)
	}
	probe := c.ReadinessProbe.Exec.Command
	if len(probe) < 2 || probe[0] != "consul-cni-installer" || probe[1] != "uninstalled" {
		t.Fatalf("readiness probe %v", probe)
	}
	for _, a := range baseArgs {
		// Directory and behaviour flags carry over; metrics are served
		// by `run` only.
		if !strings.HasPrefix(a, "--") || strings.HasPrefix(a, "--metrics-bind-address") {
			continue
		}
		if !slices.Contains(c.Args, a) || !slices.Contains(probe, a) {
			t.Errorf("base flag %s missing from the remover's args %v or probe %v", a, c.Args, probe)
		}
	}
	if ds.Spec.Template.Labels[annotations.LabelInstallerMode] != annotations.InstallerModeUninstall {
		t.Errorf("pod labels %v", ds.Spec.Template.Labels)
	}
	ru := ds.Spec.UpdateStrategy.RollingUpdate
	if ru == nil || ru.MaxSurge == nil || ru.MaxSurge.IntValue() != 0 || ru.MaxUnavailable == nil || ru.MaxUnavailable.String() != "100%" {
		t.Errorf("update strategy %+v: installers must stop before removers start", ds.Spec.UpdateStrategy)
	}
	if !maps.Equal(ds.Spec.Selector.MatchLabels, baseDS.Spec.Selector.MatchLabels) {
		t.Errorf("selector %v differs from the base's (immutable)", ds.Spec.Selector.MatchLabels)
	}
	var dep appsv1.Deployment
	decodeStrict(t, find(t, objs, "Deployment", controllerName), &dep)
	// The controller lifts node readiness (so it must not be in dry run)
	// and repairs nothing: its gate counts only Ready installers, and no
	// remover is one.
	if args := dep.Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, "--cni-ready-gate=cni-pod") || slices.Contains(args, "--dry-run=true") {
		t.Errorf("controller args %v: want the cni-pod gate and no dry run while removing", args)
	}
	var action rbacv1.ClusterRole
	decodeStrict(t, find(t, objs, "ClusterRole", actionRoleName), &action)
	if len(action.Rules) != 0 {
		t.Errorf("action rules %v while removing", action.Rules)
	}
}
