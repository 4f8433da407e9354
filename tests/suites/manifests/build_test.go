package manifests

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/klog/v2"
	psaapi "k8s.io/pod-security-admission/api"
	psapolicy "k8s.io/pod-security-admission/policy"
	"sigs.k8s.io/yaml"
)

// TestKustomizeBuildAll builds every kustomization under manifests/, so a
// directory nobody lists in this test still has to build.
func TestKustomizeBuildAll(t *testing.T) {
	root := manifestsDir(t)
	var dirs []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Name() == "kustomization.yaml" {
			dirs = append(dirs, filepath.Dir(path))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for name, rel := range overlays {
		if !contains(dirs, filepath.Join(root, rel)) {
			t.Errorf("overlay %s: no kustomization.yaml in manifests/%s", name, rel)
		}
	}
	for _, dir := range dirs {
		rel, _ := filepath.Rel(root, dir)
		t.Run(rel, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			var k struct{ Kind string }
			if err := yaml.Unmarshal(b, &k); err != nil {
				t.Fatal(err)
			}
			if k.Kind == "Component" {
				// A component builds as part of a kustomization.
				objs := buildWithComponent(t, filepath.Join(root, overlays["audit"]), dir)
				t.Logf("audit + %s: %d objects", rel, len(objs))
				return
			}
			objs := build(t, dir)
			if len(objs) == 0 {
				t.Fatal("the build is empty")
			}
			t.Logf("%d objects", len(objs))
		})
	}
}

// buildWithComponent builds a throw-away kustomization that uses a base and
// a component from elsewhere, the way a user's own kustomization would.
func buildWithComponent(tb testing.TB, base, component string) []*unstructured.Unstructured {
	tb.Helper()
	dir := tb.TempDir()
	rel := func(p string) string { // kustomize wants relative paths
		r, err := filepath.Rel(dir, p)
		if err != nil {
			tb.Fatal(err)
		}
		return r
	}
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - " + rel(base) +
		"\ncomponents:\n  - " + rel(component) + "\n"
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		tb.Fatal(err)
	}
	return build(tb, dir)
}

func TestWithoutPrometheusOperatorComponent(t *testing.T) {
	root := manifestsDir(t)
	full := buildOverlay(t, "audit")
	objs := buildWithComponent(t, filepath.Join(root, overlays["audit"]), filepath.Join(root, "components", "without-prometheus-operator"))
	for _, o := range objs {
		if gvkOf(o).Group == monitoringGroup {
			t.Errorf("%s %s is still there", o.GetKind(), o.GetName())
		}
	}
	if want := len(full) - 3; len(objs) != want {
		t.Errorf("got %d objects, want %d (the audit overlay less ServiceMonitor, PodMonitor and PrometheusRule)", len(objs), want)
	}
}

// TestObjects checks which objects every overlay ships and where.
func TestObjects(t *testing.T) {
	want := []string{
		"Namespace/" + namespace,
		"ServiceAccount/" + controllerName, "ClusterRole/" + controllerName, "ClusterRoleBinding/" + controllerName,
		"Role/" + controllerName, "RoleBinding/" + controllerName,
		"ClusterRole/" + actionRoleName, "ClusterRoleBinding/" + actionRoleName,
		"Deployment/" + controllerName, "PodDisruptionBudget/" + controllerName, "Service/" + metricsSvcName,
		"ServiceAccount/" + installerName, "ClusterRole/" + installerName, "ClusterRoleBinding/" + installerName,
		"DaemonSet/" + installerName,
		"ValidatingAdmissionPolicy/" + admissionPolicyName, "ValidatingAdmissionPolicyBinding/" + admissionPolicyName,
		"ServiceAccount/" + verifierName, "ClusterRole/" + verifierName, "ClusterRoleBinding/" + verifierName,
		"DaemonSet/" + verifierName,
		"ValidatingAdmissionPolicy/" + verifierPolicyName, "ValidatingAdmissionPolicyBinding/" + verifierPolicyName,
		"ValidatingAdmissionPolicy/" + controllerPodPolicyName, "ValidatingAdmissionPolicyBinding/" + controllerPodPolicyName,
		"ValidatingAdmissionPolicy/" + controllerNodePolicyName, "ValidatingAdmissionPolicyBinding/" + controllerNodePolicyName,
		"ValidatingAdmissionPolicy/" + controllerDeletePolicyName, "ValidatingAdmissionPolicyBinding/" + controllerDeletePolicyName,
		"ServiceMonitor/" + controllerName, "PodMonitor/" + installerName, "PrometheusRule/" + controllerName,
		"ConfigMap/" + dashboardCMName,
	}
	for _, ov := range overlayNames() {
		t.Run(ov, func(t *testing.T) {
			objs := buildOverlay(t, ov)
			var got []string
			for _, o := range objs {
				id := o.GetKind() + "/" + o.GetName()
				got = append(got, id)
				clusterScoped := strings.HasPrefix(o.GetKind(), "Cluster") || strings.HasPrefix(o.GetKind(), "ValidatingAdmission") || o.GetKind() == "Namespace"
				if !clusterScoped && o.GetNamespace() != namespace {
					t.Errorf("%s: namespace %q, want %q", id, o.GetNamespace(), namespace)
				}
				if o.GetLabels()["app.kubernetes.io/part-of"] != "consul-cni-repair" {
					t.Errorf("%s: label app.kubernetes.io/part-of=consul-cni-repair missing", id)
				}
			}
			for _, w := range want {
				if !contains(got, w) {
					t.Errorf("missing %s", w)
				}
			}
			for _, g := range got {
				if !contains(want, g) {
					t.Errorf("unexpected %s", g)
				}
			}
		})
	}
}

// flagValues returns every value of --name in args ("--name=value" form;
// a bare "--name" counts as "true").
func flagValues(args []string, name string) []string {
	var out []string
	for _, a := range args {
		switch {
		case a == "--"+name:
			out = append(out, "true")
		case strings.HasPrefix(a, "--"+name+"="):
			out = append(out, strings.TrimPrefix(a, "--"+name+"="))
		}
	}
	return out
}

func oneFlag(tb testing.TB, args []string, name string) string {
	tb.Helper()
	v := flagValues(args, name)
	if len(v) != 1 {
		tb.Errorf("args %v: --%s given %d times, want once", args, name, len(v))
		return ""
	}
	return v[0]
}

func checkImage(tb testing.TB, image, command string) {
	tb.Helper()
	repo, tag, ok := strings.Cut(image, ":")
	if want := imageRegistry + command; !ok || repo != want {
		tb.Errorf("image %q: want %s:<tag> (the image is named after the command it runs)", image, want)
	}
	if tag == "" || tag == "latest" {
		tb.Errorf("image %q: pin a version tag", image)
	}
}

// restricted evaluates a pod template with the Pod Security admission
// library at the given level and returns the violations.
func podSecurityViolations(tb testing.TB, level psaapi.Level, tmpl *corev1.PodTemplateSpec) []string {
	tb.Helper()
	ev, err := psapolicy.NewEvaluator(psapolicy.DefaultChecks(), nil)
	if err != nil {
		tb.Fatal(err)
	}
	var out []string
	for _, r := range ev.EvaluatePod(psaapi.LevelVersion{Level: level, Version: psaapi.LatestVersion()}, &tmpl.ObjectMeta, &tmpl.Spec) {
		if !r.Allowed {
			out = append(out, r.ForbiddenReason+": "+r.ForbiddenDetail)
		}
	}
	return out
}

func TestControllerDeployment(t *testing.T) {
	for _, ov := range overlayNames() {
		t.Run(ov, func(t *testing.T) {
			objs := buildOverlay(t, ov)
			var d appsv1.Deployment
			decodeStrict(t, find(t, objs, "Deployment", controllerName), &d)
			if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
				t.Errorf("replicas %v, want 2", d.Spec.Replicas)
			}
			sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
			if err != nil || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
				t.Errorf("selector %v does not select the template labels %v (%v)", d.Spec.Selector, d.Spec.Template.Labels, err)
			}
			if ru := d.Spec.Strategy.RollingUpdate; ru == nil || ru.MaxUnavailable == nil || ru.MaxUnavailable.IntValue() != 0 {
				t.Errorf("rolling update must keep both replicas until the new one is ready (maxUnavailable 0), got %+v", ru)
			}
			ps := d.Spec.Template.Spec
			if ps.ServiceAccountName != controllerName {
				t.Errorf("serviceAccountName %q, want %q", ps.ServiceAccountName, controllerName)
			}
			if ps.HostNetwork || ps.HostPID || ps.HostIPC {
				t.Error("the controller must not use host namespaces")
			}
			// It lifts the startup taint, so it must run where it is set.
			for _, effect := range []corev1.TaintEffect{corev1.TaintEffectNoSchedule, corev1.TaintEffectNoExecute} {
				taint := corev1.Taint{Key: startupTaintKey, Value: "true", Effect: effect}
				tolerated := false
				for i := range ps.Tolerations {
					tolerated = tolerated || ps.Tolerations[i].ToleratesTaint(klog.Background(), &taint, false)
				}
				if !tolerated {
					t.Errorf("the controller does not tolerate the startup taint %s:%s", taint.Key, effect)
				}
			}
			if _, ok := ps.NodeSelector["consul.hashicorp.com/cni"]; ok {
				t.Error("the controller must not wait for the label it sets")
			}
			if v := podSecurityViolations(t, psaapi.LevelRestricted, &d.Spec.Template); len(v) > 0 {
				t.Errorf("pod template violates the restricted Pod Security level: %v", v)
			}
			if len(ps.Containers) != 1 {
				t.Fatalf("%d containers, want 1", len(ps.Containers))
			}
			c := ps.Containers[0]
			checkImage(t, c.Image, "repair")
			sc := c.SecurityContext
			if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
				t.Error("readOnlyRootFilesystem must be true")
			}
			if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
				t.Errorf("resources %+v: want cpu and memory requests and a memory limit", c.Resources)
			}

			args := c.Args
			if oneFlag(t, args, "leader-elect") != "true" {
				t.Error("--leader-elect=true expected")
			}
			// The Lease (where its Role grants leases) and the installer
			// DaemonSet are in the controller's own namespace: no argument
			// names it, so no namespace override leaves one stale.
			for _, f := range []string{"leader-election-namespace", "cni-namespace"} {
				for _, a := range args {
					if strings.HasPrefix(a, "--"+f+"=") {
						t.Errorf("%s: the controller's own namespace is the default; a fixed one breaks a namespace override", a)
					}
				}
			}
			checkOwnNamespaceEnv(t, c)
			// The controller finds the installer pods with this selector:
			// it must select the DaemonSet's pods.
			cniSel, err := labels.Parse(oneFlag(t, args, "cni-pod-selector"))
			if err != nil {
				t.Fatal(err)
			}
			var ds appsv1.DaemonSet
			decodeStrict(t, find(t, objs, "DaemonSet", installerName), &ds)
			if !cniSel.Matches(labels.Set(ds.Spec.Template.Labels)) {
				t.Errorf("--cni-pod-selector=%s does not select the installer pods %v", cniSel, ds.Spec.Template.Labels)
			}

			ports := map[string]int32{}
			for _, p := range c.Ports {
				ports[p.Name] = p.ContainerPort
			}
			checkBind := func(flag, port string) {
				addr := oneFlag(t, args, flag)
				if _, p, ok := strings.Cut(addr, ":"); !ok || p != strconv.Itoa(int(ports[port])) {
					t.Errorf("--%s=%s does not listen on container port %q (%d)", flag, addr, port, ports[port])
				}
			}
			checkBind("metrics-bind-address", "metrics")
			checkBind("health-probe-bind-address", "health")
			probe := func(name string, p *corev1.Probe, path string) {
				if p == nil || p.HTTPGet == nil {
					t.Errorf("%s probe: want an HTTP GET of %s", name, path)
					return
				}
				if p.HTTPGet.Path != path || p.HTTPGet.Port.String() != "health" {
					t.Errorf("%s probe: GET %s on %s, want %s on port health", name, p.HTTPGet.Path, p.HTTPGet.Port.String(), path)
				}
			}
			probe("liveness", c.LivenessProbe, "/healthz")
			probe("readiness", c.ReadinessProbe, "/readyz")

			// The mode each overlay selects, and nothing else.
			action, dryRun := flagValues(args, "action"), flagValues(args, "dry-run")
			want := map[string][2][]string{
				"base":   {nil, nil},
				"audit":  {nil, {"true"}},
				"delete": {{"delete"}, nil},
				"label":  {{"label"}, nil},
			}[ov]
			if strings.Join(action, ",") != strings.Join(want[0], ",") || strings.Join(dryRun, ",") != strings.Join(want[1], ",") {
				t.Errorf("--action %v --dry-run %v, want %v %v", action, dryRun, want[0], want[1])
			}
			seen := map[string]bool{}
			for _, a := range args {
				name, _, _ := strings.Cut(a, "=")
				if seen[name] {
					t.Errorf("flag %s given twice", name)
				}
				seen[name] = true
			}

			var pdb policyv1.PodDisruptionBudget
			decodeStrict(t, find(t, objs, "PodDisruptionBudget", controllerName), &pdb)
			psel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
			if err != nil || !psel.Matches(labels.Set(d.Spec.Template.Labels)) {
				t.Errorf("PodDisruptionBudget selector %v does not select the controller pods", pdb.Spec.Selector)
			}
			if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
				t.Errorf("PodDisruptionBudget maxUnavailable %v, want 1 (of 2 replicas)", pdb.Spec.MaxUnavailable)
			}

			var svc corev1.Service
			decodeStrict(t, find(t, objs, "Service", metricsSvcName), &svc)
			if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) {
				t.Errorf("metrics Service selector %v does not select the controller pods", svc.Spec.Selector)
			}
			if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort.String() != "metrics" {
				t.Errorf("metrics Service ports %+v: want one port targeting %q", svc.Spec.Ports, "metrics")
			}
		})
	}
}

func TestInstallerDaemonSet(t *testing.T) {
	for _, ov := range overlayNames() {
		t.Run(ov, func(t *testing.T) {
			objs := buildOverlay(t, ov)
			var ds appsv1.DaemonSet
			decodeStrict(t, find(t, objs, "DaemonSet", installerName), &ds)
			ps := ds.Spec.Template.Spec
			if ds.Spec.Template.Labels["app.kubernetes.io/name"] != installerName {
				t.Errorf("pods must be labelled app.kubernetes.io/name=%s, got %v", installerName, ds.Spec.Template.Labels)
			}
			if ps.ServiceAccountName != installerName {
				t.Errorf("serviceAccountName %q, want %q", ps.ServiceAccountName, installerName)
			}
			if ps.AutomountServiceAccountToken != nil && !*ps.AutomountServiceAccountToken {
				t.Error("the installer needs its service-account token (the plugin's kubeconfig uses it)")
			}
			if ps.PriorityClassName != "system-node-critical" {
				t.Errorf("priorityClassName %q, want system-node-critical", ps.PriorityClassName)
			}
			// Whatever the node's taints, the installer runs there; in
			// particular the startup taint it exists to lift.
			for _, taint := range []corev1.Taint{
				{Key: startupTaintKey, Effect: corev1.TaintEffectNoSchedule},
				{Key: startupTaintKey, Value: "true", Effect: corev1.TaintEffectNoExecute},
				{Key: "node.kubernetes.io/not-ready", Effect: corev1.TaintEffectNoExecute},
				{Key: "node.kubernetes.io/unreachable", Effect: corev1.TaintEffectNoExecute},
				{Key: "node.kubernetes.io/network-unavailable", Effect: corev1.TaintEffectNoSchedule},
				{Key: "node.cilium.io/agent-not-ready", Value: "true", Effect: corev1.TaintEffectNoSchedule},
				{Key: "example.com/dedicated", Value: "gpu", Effect: corev1.TaintEffectPreferNoSchedule},
			} {
				tolerated := false
				for i := range ps.Tolerations {
					if ps.Tolerations[i].ToleratesTaint(klog.Background(), &taint, false) {
						tolerated = true
					}
				}
				if !tolerated {
					t.Errorf("taint %s=%s:%s is not tolerated", taint.Key, taint.Value, taint.Effect)
				}
			}
			if ru := ds.Spec.UpdateStrategy.RollingUpdate; ds.Spec.UpdateStrategy.Type != appsv1.RollingUpdateDaemonSetStrategyType || ru == nil ||
				ru.MaxUnavailable == nil || ru.MaxUnavailable.IntValue() != 0 || ru.MaxSurge == nil || ru.MaxSurge.IntValue() < 1 {
				t.Errorf("updateStrategy %+v: want RollingUpdate with maxSurge >= 1 and maxUnavailable 0 (a node never loses its ready installer)", ds.Spec.UpdateStrategy)
			}
			if len(ps.Containers) != 1 {
				t.Fatalf("%d containers, want 1", len(ps.Containers))
			}
			c := ps.Containers[0]
			checkImage(t, c.Image, "consul-cni-installer")
			if sc := c.SecurityContext; sc == nil || (sc.Privileged != nil && *sc.Privileged) ||
				sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
				t.Error("the installer writes files: it needs neither privileged mode nor privilege escalation")
			}
			if len(c.Command) == 0 || c.Command[0] != "consul-cni-installer" {
				t.Errorf("command %v, want consul-cni-installer", c.Command)
			}
			if len(c.Args) == 0 || c.Args[0] != "run" {
				t.Errorf("args %v: want the run subcommand first", c.Args)
			}

			// Host directories: each --*-dir flag is under a mount of a
			// hostPath volume, and --host-cni-net-dir is the host path of
			// the directory --cni-net-dir shows the container.
			hostPaths := map[string]string{} // volume name -> host path
			for _, v := range ps.Volumes {
				if v.HostPath != nil {
					hostPaths[v.Name] = v.HostPath.Path
				}
			}
			hostPathOf := func(containerPath string) (string, bool) {
				for _, m := range c.VolumeMounts {
					hp, ok := hostPaths[m.Name]
					if !ok {
						continue
					}
					if containerPath == m.MountPath || strings.HasPrefix(containerPath, m.MountPath+"/") {
						if m.ReadOnly {
							t.Errorf("mount %s is read-only; the installer writes there", m.MountPath)
						}
						return hp + strings.TrimPrefix(containerPath, m.MountPath), true
					}
				}
				return "", false
			}
			binDir := oneFlag(t, c.Args, "cni-bin-dir")
			if hp, ok := hostPathOf(binDir); !ok || hp != "/opt/cni/bin" {
				t.Errorf("--cni-bin-dir=%s is host path %q, want /opt/cni/bin", binDir, hp)
			}
			netDir := oneFlag(t, c.Args, "cni-net-dir")
			hp, ok := hostPathOf(netDir)
			if !ok || hp != "/etc/cni/net.d" {
				t.Errorf("--cni-net-dir=%s is host path %q, want /etc/cni/net.d", netDir, hp)
			}
			if got := oneFlag(t, c.Args, "host-cni-net-dir"); got != hp {
				t.Errorf("--host-cni-net-dir=%s but --cni-net-dir shows host path %s", got, hp)
			}

			// Readiness: the installer's own verdict, with the same view of
			// the directories.
			rp := c.ReadinessProbe
			if rp == nil || rp.Exec == nil || len(rp.Exec.Command) < 2 ||
				rp.Exec.Command[0] != "consul-cni-installer" || rp.Exec.Command[1] != "ready" {
				t.Fatalf("readiness probe %+v: want exec consul-cni-installer ready", rp)
			}
			for _, f := range []string{"cni-bin-dir", "cni-net-dir", "host-cni-net-dir"} {
				if got, want := flagValues(rp.Exec.Command, f), flagValues(c.Args, f); strings.Join(got, ",") != strings.Join(want, ",") {
					t.Errorf("readiness probe --%s %v, container %v", f, got, want)
				}
			}
		})
	}
}

// rbacOf collects, from a build, every permission the ServiceAccount
// namespace/name is granted, and fails on wildcards and resourceNames
// (none of ours need them).
func rbacOf(tb testing.TB, objs []*unstructured.Unstructured, saNamespace, saName string) permSet {
	tb.Helper()
	clusterRoles := map[string][]rbacv1.PolicyRule{}
	roles := map[string][]rbacv1.PolicyRule{} // namespace/name
	for _, o := range objs {
		switch o.GetKind() {
		case "ClusterRole":
			var r rbacv1.ClusterRole
			decodeStrict(tb, o, &r)
			clusterRoles[r.Name] = r.Rules
		case "Role":
			var r rbacv1.Role
			decodeStrict(tb, o, &r)
			roles[r.Namespace+"/"+r.Name] = r.Rules
		}
	}
	isSubject := func(subjects []rbacv1.Subject) bool {
		for _, s := range subjects {
			if s.Kind == rbacv1.ServiceAccountKind && s.Name == saName && s.Namespace == saNamespace {
				return true
			}
		}
		return false
	}
	expand := func(rules []rbacv1.PolicyRule, ns string) permSet {
		s := permSet{}
		for _, r := range rules {
			if len(r.ResourceNames) > 0 || len(r.NonResourceURLs) > 0 {
				tb.Errorf("rule %+v: resourceNames/nonResourceURLs are not expected", r)
			}
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					for _, v := range r.Verbs {
						if g == "*" || res == "*" || v == "*" {
							tb.Errorf("rule %+v: wildcards are not allowed", r)
						}
						s[perm{g, res, v, ns}] = true
					}
				}
			}
		}
		return s
	}
	got := permSet{}
	for _, o := range objs {
		switch o.GetKind() {
		case "ClusterRoleBinding":
			var b rbacv1.ClusterRoleBinding
			decodeStrict(tb, o, &b)
			if !isSubject(b.Subjects) {
				continue
			}
			rules, ok := clusterRoles[b.RoleRef.Name]
			if b.RoleRef.Kind != "ClusterRole" || !ok {
				tb.Errorf("ClusterRoleBinding %s refers to %s %s, not in the build", b.Name, b.RoleRef.Kind, b.RoleRef.Name)
			}
			got.add(expand(rules, ""))
		case "RoleBinding":
			var b rbacv1.RoleBinding
			decodeStrict(tb, o, &b)
			if !isSubject(b.Subjects) {
				continue
			}
			var rules []rbacv1.PolicyRule
			var ok bool
			if b.RoleRef.Kind == "Role" {
				rules, ok = roles[b.Namespace+"/"+b.RoleRef.Name]
			} else {
				rules, ok = clusterRoles[b.RoleRef.Name]
			}
			if !ok {
				tb.Errorf("RoleBinding %s/%s refers to %s %s, not in the build", b.Namespace, b.Name, b.RoleRef.Kind, b.RoleRef.Name)
			}
			got.add(expand(rules, b.Namespace))
		}
	}
	return got
}

// TestRBAC checks, per overlay, that each identity is granted exactly the
// permissions docs/design/deployment.md lists: nothing missing, nothing more.
func TestRBAC(t *testing.T) {
	for _, ov := range overlayNames() {
		t.Run(ov, func(t *testing.T) {
			objs := buildOverlay(t, ov)
			if d := wantController(ov).diff(rbacOf(t, objs, namespace, controllerName)); d != "" {
				t.Errorf("controller %s: %s", controllerName, d)
			}
			if d := wantInstaller().diff(rbacOf(t, objs, namespace, installerName)); d != "" {
				t.Errorf("installer %s: %s", installerName, d)
			}
			if d := wantVerifier().diff(rbacOf(t, objs, namespace, verifierName)); d != "" {
				t.Errorf("verifier %s: %s", verifierName, d)
			}
		})
	}
}

// TestRequireCNIReadyRecipe builds the documented kustomize recipe that
// adds the consul.hashicorp.com/cni=ready nodeSelector to injected
// workloads, and checks it reaches every pod template and keeps the
// selectors already there.
func TestRequireCNIReadyRecipe(t *testing.T) {
	objs := build(t, filepath.Join(testbin.RepoRoot(), "docs", "examples", "require-cni-ready"))
	workloads := 0
	for _, o := range objs {
		var tmpl corev1.PodTemplateSpec
		switch o.GetKind() {
		case "Deployment":
			var d appsv1.Deployment
			decodeStrict(t, o, &d)
			tmpl = d.Spec.Template
		case "StatefulSet":
			var s appsv1.StatefulSet
			decodeStrict(t, o, &s)
			tmpl = s.Spec.Template
		default:
			continue
		}
		workloads++
		if got := tmpl.Spec.NodeSelector["consul.hashicorp.com/cni"]; got != "ready" {
			t.Errorf("%s %s: nodeSelector %v, want consul.hashicorp.com/cni=ready", o.GetKind(), o.GetName(), tmpl.Spec.NodeSelector)
		}
		if o.GetName() == "web" && tmpl.Spec.NodeSelector["kubernetes.io/os"] != "linux" {
			t.Errorf("web: the patch dropped the existing nodeSelector: %v", tmpl.Spec.NodeSelector)
		}
	}
	if workloads != 2 {
		t.Errorf("%d workloads in the recipe's build, want 2", workloads)
	}
}

// TestKubePrometheusStackExample builds the documented example that labels
// the ServiceMonitor, PodMonitor and PrometheusRule for kube-prometheus-stack.
func TestKubePrometheusStackExample(t *testing.T) {
	objs := build(t, filepath.Join(testbin.RepoRoot(), "docs", "examples", "kube-prometheus-stack"))
	n := 0
	for _, o := range objs {
		if gvkOf(o).Group != monitoringGroup {
			if o.GetLabels()["release"] != "" {
				t.Errorf("%s %s got the release label too", o.GetKind(), o.GetName())
			}
			continue
		}
		n++
		if o.GetLabels()["release"] != "kube-prometheus-stack" {
			t.Errorf("%s %s: labels %v, want release=kube-prometheus-stack", o.GetKind(), o.GetName(), o.GetLabels())
		}
	}
	if n != 3 {
		t.Errorf("%d Prometheus Operator objects, want 3", n)
	}
}

// checkPolicyShape checks what every admission policy of ours must have: a
// Deny binding, failurePolicy Fail, a matchCondition that selects the
// ServiceAccount saName by name in any namespace, the resource rules given
// (each "OPERATION resource,resource"), and a reason and message on every
// validation.
func checkPolicyShape(t *testing.T, objs []*unstructured.Unstructured, name, saName string, rules ...string) admissionregistrationv1.ValidatingAdmissionPolicy {
	t.Helper()
	var vap admissionregistrationv1.ValidatingAdmissionPolicy
	decodeStrict(t, find(t, objs, "ValidatingAdmissionPolicy", name), &vap)
	var b admissionregistrationv1.ValidatingAdmissionPolicyBinding
	decodeStrict(t, find(t, objs, "ValidatingAdmissionPolicyBinding", name), &b)
	if b.Spec.PolicyName != vap.Name || len(b.Spec.ValidationActions) != 1 || b.Spec.ValidationActions[0] != admissionregistrationv1.Deny {
		t.Errorf("%s: binding %+v: want policy %s with validationActions [Deny]", name, b.Spec, vap.Name)
	}
	if vap.Spec.FailurePolicy == nil || *vap.Spec.FailurePolicy != admissionregistrationv1.Fail {
		t.Errorf("%s: failurePolicy must be Fail", name)
	}
	if len(vap.Spec.MatchConditions) != 1 {
		t.Fatalf("%s: %d matchConditions, want 1", name, len(vap.Spec.MatchConditions))
	}
	// By name, in any namespace: no namespace in the expression, which a
	// kustomize or Helm namespace would leave stale.
	mc := vap.Spec.MatchConditions[0].Expression
	if !strings.Contains(mc, `startsWith("system:serviceaccount:")`) || !strings.Contains(mc, `endsWith(":`+saName+`")`) ||
		strings.Contains(mc, namespace+":") {
		t.Errorf("%s: matchCondition %q does not select ServiceAccount %s by name in any namespace", name, mc, saName)
	}
	var got []string
	for _, r := range vap.Spec.MatchConstraints.ResourceRules {
		var ops []string
		for _, op := range r.Operations {
			ops = append(ops, string(op))
		}
		got = append(got, strings.Join(ops, ",")+" "+strings.Join(r.Resources, ","))
	}
	if strings.Join(got, "; ") != strings.Join(rules, "; ") {
		t.Errorf("%s: resourceRules %v, want %v", name, got, rules)
	}
	for _, v := range vap.Spec.Validations {
		if v.Reason == nil || *v.Reason != "Forbidden" || v.Message == "" {
			t.Errorf("%s: validation %q: want reason Forbidden and a message", name, v.Expression)
		}
	}
	return vap
}

// TestAdmissionPolicies checks the shape of the policies that narrow the
// installer's "patch pods" to the status annotation of pods on its own node
// and the controller's pod and node writes to its label, annotation and
// taint, in every overlay (their behaviour is proven against the API server
// in the integration tests).
func TestAdmissionPolicies(t *testing.T) {
	for _, ov := range overlayNames() {
		t.Run(ov, func(t *testing.T) {
			objs := buildOverlay(t, ov)
			vap := checkPolicyShape(t, objs, admissionPolicyName, installerName, "UPDATE pods")
			// The node a pod-bound token names must be there and be the
			// pod's: a token naming no node may update nothing.
			tokenNode, required := false, false
			for _, v := range vap.Spec.Variables {
				tokenNode = tokenNode || (v.Name == "tokenNode" && strings.Contains(v.Expression, `"authentication.kubernetes.io/node-name"`))
			}
			for _, v := range vap.Spec.Validations {
				required = required || strings.HasPrefix(v.Expression, "variables.tokenNode.size() == 1 &&")
			}
			if !tokenNode || !required {
				t.Errorf("%s: no validation requires the node-name extra", admissionPolicyName)
			}
			checkPolicyShape(t, objs, controllerPodPolicyName, controllerName, "UPDATE pods,pods/*")
			checkPolicyShape(t, objs, controllerNodePolicyName, controllerName, "UPDATE nodes,nodes/*")
			checkPolicyShape(t, objs, controllerDeletePolicyName, controllerName, "DELETE pods", "CREATE pods/eviction")
			vvap := checkPolicyShape(t, objs, verifierPolicyName, verifierName, "UPDATE pods/status,nodes/status")
			required = false
			for _, v := range vvap.Spec.Validations {
				required = required || strings.HasPrefix(v.Expression, "variables.tokenNode.size() == 1 &&")
			}
			if !required {
				t.Errorf("%s: no validation requires the node-name extra", verifierPolicyName)
			}
		})
	}
}

// TestNamespaceOverride builds every overlay under a kustomize namespace:
// override: every namespaced object moves, the RBAC bindings follow their
// ServiceAccounts, the admission policies are unchanged (they select by
// ServiceAccount name), and no container argument or environment value
// still names the default namespace (the controller takes its Lease and
// CNI namespaces from its own, POD_NAMESPACE).
func TestNamespaceOverride(t *testing.T) {
	for _, ov := range overlayNames() {
		t.Run(ov, func(t *testing.T) {
			objs := buildInNamespace(t, ov, "mesh-system")
			if d := wantControllerIn(ov, "mesh-system").diff(rbacOf(t, objs, "mesh-system", controllerName)); d != "" {
				t.Errorf("controller %s: %s", controllerName, d)
			}
			if d := wantInstaller().diff(rbacOf(t, objs, "mesh-system", installerName)); d != "" {
				t.Errorf("installer %s: %s", installerName, d)
			}
			if d := wantVerifier().diff(rbacOf(t, objs, "mesh-system", verifierName)); d != "" {
				t.Errorf("verifier %s: %s", verifierName, d)
			}
			for _, o := range objs {
				if o.GetNamespace() == namespace {
					t.Errorf("%s %s stayed in %s", o.GetKind(), o.GetName(), namespace)
				}
				for _, v := range containerValues(t, o) {
					if v == namespace || strings.HasSuffix(v, "="+namespace) {
						t.Errorf("%s %s: %q still names namespace %s", o.GetKind(), o.GetName(), v, namespace)
					}
				}
			}
			orig := buildOverlay(t, ov)
			for _, name := range admissionPolicyNames {
				a, _ := find(t, objs, "ValidatingAdmissionPolicy", name).MarshalJSON()
				b, _ := find(t, orig, "ValidatingAdmissionPolicy", name).MarshalJSON()
				if string(a) != string(b) {
					t.Errorf("%s changed with the namespace", name)
				}
			}
		})
	}
}

// checkOwnNamespaceEnv: the container learns its own namespace from the
// downward API (POD_NAMESPACE), the default of every namespace it uses.
func checkOwnNamespaceEnv(t *testing.T, c corev1.Container) {
	t.Helper()
	for _, e := range c.Env {
		if e.Name == "POD_NAMESPACE" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace" {
			return
		}
	}
	t.Errorf("container %s: no POD_NAMESPACE from the downward API (fieldRef metadata.namespace)", c.Name)
}

// containerValues lists the args, commands and literal environment values
// of every container of a workload object.
func containerValues(t *testing.T, o *unstructured.Unstructured) []string {
	t.Helper()
	var spec corev1.PodSpec
	switch o.GetKind() {
	case "Deployment", "DaemonSet":
		var w struct {
			Spec struct {
				Template corev1.PodTemplateSpec `json:"template"`
			} `json:"spec"`
		}
		b, _ := o.MarshalJSON()
		if err := json.Unmarshal(b, &w); err != nil {
			t.Fatal(err)
		}
		spec = w.Spec.Template.Spec
	default:
		return nil
	}
	var out []string
	for _, c := range append(spec.InitContainers, spec.Containers...) {
		out = append(out, c.Command...)
		out = append(out, c.Args...)
		for _, e := range c.Env {
			out = append(out, e.Value)
		}
	}
	return out
}
