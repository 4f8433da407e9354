package manifests

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/cli/values"
	"helm.sh/helm/v4/pkg/getter"
	releasev1 "helm.sh/helm/v4/pkg/release/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/kustomize/kyaml/kio"
	"sigs.k8s.io/yaml"
)

// chartProfile is one documented way to install the chart and the
// kustomization that must render the same objects.
type chartProfile struct {
	values    string // file under the chart's profiles/, "" for values.yaml alone
	overlay   string // kustomization directory under manifests/
	component string // component under manifests/components/ added to the overlay, or ""
}

// chartProfiles are the chart's documented profiles; every file in
// profiles/ is one of them, except profiles that only adapt to a platform
// (chartPlatformProfiles).
// The chart's default is audit mode (a first install only reports); the
// kustomize base acts (evict), which profiles/evict.yaml turns on.
var chartProfiles = map[string]chartProfile{
	"default":                     {overlay: "overlays/audit"},
	"audit":                       {values: "audit.yaml", overlay: "overlays/audit"},
	"evict":                       {values: "evict.yaml", overlay: "base"},
	"delete":                      {values: "delete.yaml", overlay: "overlays/delete"},
	"label":                       {values: "label.yaml", overlay: "overlays/label"},
	"without-prometheus-operator": {values: "without-prometheus-operator.yaml", overlay: "overlays/audit", component: "without-prometheus-operator"},
	"repair-only":                 {values: "repair-only.yaml", overlay: "overlays/repair-only"},
	"node-startup-taint":          {values: "node-startup-taint.yaml", overlay: "base", component: "node-startup-taint"},
}

// chartPlatformProfiles adapt the default to a platform; what each changes
// is checked by TestChartPlatformProfiles.
var chartPlatformProfiles = map[string]bool{"gke.yaml": true}

// Helm logs through slog; its notes on the chart's symbolic links (files/
// links to manifests/base/monitoring) would drown the test output.
func init() {
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
}

func chartDir(tb testing.TB) string {
	return filepath.Join(testbin.RepoRoot(), "charts", "consul-cni-repair")
}

// chartValues merges values files (relative to the chart's profiles/) and
// --set style assignments the way the helm command does.
func chartValues(tb testing.TB, files []string, set ...string) map[string]any {
	tb.Helper()
	opts := values.Options{Values: set}
	for _, f := range files {
		opts.ValueFiles = append(opts.ValueFiles, filepath.Join(chartDir(tb), "profiles", f))
	}
	vals, err := opts.MergeValues(getter.Providers{})
	if err != nil {
		tb.Fatalf("values %v %v: %v", files, set, err)
	}
	return vals
}

// helmTemplate is `helm template` of the chart with the Helm library: a
// client-only install dry run into the namespace the manifests use.
func helmTemplate(dir string, vals map[string]any) ([]*unstructured.Unstructured, error) {
	return helmTemplateNamespace(dir, namespace, vals)
}

// helmTemplateNamespace is helmTemplate with another release namespace:
// the release's objects, without its hooks (helmHooks).
func helmTemplateNamespace(dir, ns string, vals map[string]any) ([]*unstructured.Unstructured, error) {
	objs, _, err := helmRender(dir, ns, vals)
	return objs, err
}

// helmHooks are the hook objects of the chart rendered into namespace.
func helmHooks(dir string, vals map[string]any) ([]*unstructured.Unstructured, error) {
	_, hooks, err := helmRender(dir, namespace, vals)
	return hooks, err
}

// monitoringAPIs are the Prometheus Operator kinds the chart renders its
// monitoring objects for only when the cluster's API has them; the renders
// that stand for a cluster with the operator (as the kustomize overlays
// assume) pass them, as `helm template --api-versions` does.
var monitoringAPIs = []string{"monitoring.coreos.com/v1/ServiceMonitor", "monitoring.coreos.com/v1/PodMonitor", "monitoring.coreos.com/v1/PrometheusRule"}

// helmRender renders the release manifest and, apart, its hooks: hooks
// have no kustomize counterpart. The API has the monitoringAPIs.
func helmRender(dir, ns string, vals map[string]any) (objs, hooks []*unstructured.Unstructured, err error) {
	objs, hooks, _, err = helmRenderAPIs(dir, ns, vals, monitoringAPIs)
	return objs, hooks, err
}

// helmRenderAPIs is helmRender against an API with these extra API
// versions (group/version/Kind), with the release's NOTES.txt.
func helmRenderAPIs(dir, ns string, vals map[string]any, apis []string) (objs, hooks []*unstructured.Unstructured, notes string, err error) {
	ch, err := loader.Load(dir)
	if err != nil {
		return nil, nil, "", err
	}
	install := action.NewInstall(action.NewConfiguration())
	install.APIVersions = apis
	install.DryRunStrategy = action.DryRunClient
	install.ReleaseName = "consul-cni-repair"
	install.Namespace = ns
	install.Replace = true
	// The oldest Kubernetes the chart supports (Chart.yaml kubeVersion).
	install.KubeVersion = &common.KubeVersion{Version: "v1.30.0", Major: "1", Minor: "30"}
	rel, err := install.Run(ch, vals)
	if err != nil {
		return nil, nil, "", err
	}
	r, ok := rel.(*releasev1.Release)
	if !ok {
		return nil, nil, "", fmt.Errorf("helm returned a %T, want a v1 release", rel)
	}
	objs, err = decodeManifest(r.Manifest)
	if err != nil {
		return nil, nil, "", err
	}
	for _, h := range r.Hooks {
		hs, err := decodeManifest(h.Manifest)
		if err != nil {
			return nil, nil, "", fmt.Errorf("hook %s: %w", h.Name, err)
		}
		hooks = append(hooks, hs...)
	}
	for _, o := range objs {
		if _, ok := o.GetAnnotations()[hookAnnotation]; ok {
			return nil, nil, "", fmt.Errorf("%s: a hook in the release manifest", objectID(o))
		}
	}
	if r.Info != nil {
		notes = r.Info.Notes
	}
	return objs, hooks, notes, nil
}

// hookAnnotation marks a Helm hook.
const hookAnnotation = "helm.sh/hook"

// decodeManifest splits a rendered release into objects with the YAML
// parser and the JSON round trip of buildDir, so both sides of a comparison
// are read alike (YAML libraries differ on the line breaks of folded
// scalars with more-indented lines).
func decodeManifest(manifest string) ([]*unstructured.Unstructured, error) {
	nodes, err := kio.FromBytes([]byte(manifest))
	if err != nil {
		return nil, err
	}
	var out []*unstructured.Unstructured
	for _, n := range nodes {
		j, err := n.MarshalJSON()
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", n.GetKind(), n.GetName(), err)
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(j); err != nil {
			return nil, fmt.Errorf("%s %s: %w", n.GetKind(), n.GetName(), err)
		}
		out = append(out, u)
	}
	return out, nil
}

func renderChart(tb testing.TB, vals map[string]any) []*unstructured.Unstructured {
	tb.Helper()
	objs, err := helmTemplate(chartDir(tb), vals)
	if err != nil {
		tb.Fatalf("helm template: %v", err)
	}
	return objs
}

func objectID(o *unstructured.Unstructured) string {
	return o.GetAPIVersion() + " " + o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
}

func byID(tb testing.TB, objs []*unstructured.Unstructured) map[string]*unstructured.Unstructured {
	tb.Helper()
	m := map[string]*unstructured.Unstructured{}
	for _, o := range objs {
		id := objectID(o)
		if _, dup := m[id]; dup {
			tb.Errorf("%s rendered twice", id)
		}
		m[id] = o
	}
	return m
}

// diffValues lists every path where a and b differ (JSON-like values).
func diffValues(path string, a, b any) []string {
	switch av := a.(type) {
	case map[string]any:
		bv, ok := b.(map[string]any)
		if !ok {
			break
		}
		keys := map[string]bool{}
		for k := range av {
			keys[k] = true
		}
		for k := range bv {
			keys[k] = true
		}
		var out []string
		for _, k := range sortedKeys(keys) {
			out = append(out, diffValues(path+"."+k, av[k], bv[k])...)
		}
		return out
	case []any:
		bv, ok := b.([]any)
		if !ok || len(av) != len(bv) {
			break
		}
		var out []string
		for i := range av {
			out = append(out, diffValues(fmt.Sprintf("%s[%d]", path, i), av[i], bv[i])...)
		}
		return out
	}
	if reflect.DeepEqual(a, b) {
		return nil
	}
	return []string{fmt.Sprintf("%s: %s != %s", path, short(a), short(b))}
}

func short(v any) string {
	if v == nil {
		return "<absent>"
	}
	b, _ := yaml.Marshal(v)
	s := strings.TrimSpace(string(b))
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// compareObjects reports every object only one side has and every field
// that differs between the two renderings of the same object.
func compareObjects(tb testing.TB, helmName string, helmObjs []*unstructured.Unstructured, kustName string, kustObjs []*unstructured.Unstructured) {
	tb.Helper()
	h, k := byID(tb, helmObjs), byID(tb, kustObjs)
	ids := map[string]bool{}
	for id := range h {
		ids[id] = true
	}
	for id := range k {
		ids[id] = true
	}
	for _, id := range sortedKeys(ids) {
		switch {
		case h[id] == nil:
			tb.Errorf("%s: only in %s", id, kustName)
		case k[id] == nil:
			tb.Errorf("%s: only in %s", id, helmName)
		default:
			for _, d := range diffValues("", h[id].Object, k[id].Object) {
				tb.Errorf("%s: %s (%s != %s)", id, d, helmName, kustName)
			}
		}
	}
}

func kustomizeProfile(tb testing.TB, p chartProfile) []*unstructured.Unstructured {
	tb.Helper()
	root := manifestsDir(tb)
	if p.component == "" {
		return build(tb, filepath.Join(root, p.overlay))
	}
	return buildWithComponent(tb, filepath.Join(root, p.overlay), filepath.Join(root, "components", p.component))
}

func profileFiles(p chartProfile) []string {
	if p.values == "" {
		return nil
	}
	return []string{p.values}
}

// TestChartMatchesKustomize is the one-source-of-truth proof: for every
// documented profile, `helm template` renders the very objects of the
// matching kustomization, field by field. The Namespace is the chart's only
// by namespace.create (helm install stores its release in the namespace,
// so it must exist first); that is rendered here too.
func TestChartMatchesKustomize(t *testing.T) {
	for name, p := range chartProfiles {
		t.Run(name, func(t *testing.T) {
			want := kustomizeProfile(t, p)
			got := withoutHelmLabels(renderChart(t, chartValues(t, profileFiles(p), "namespace.create=true")))
			kust := "kustomize " + p.overlay
			if p.component != "" {
				kust += " + components/" + p.component
			}
			compareObjects(t, "helm template", got, kust, want)

			// Without namespace.create: the same objects less the Namespace.
			var noNS []*unstructured.Unstructured
			for _, o := range want {
				if o.GetKind() != "Namespace" {
					noNS = append(noNS, o)
				}
			}
			got = withoutHelmLabels(renderChart(t, chartValues(t, profileFiles(p))))
			compareObjects(t, "helm template (namespace.create=false)", got, "kustomize less its Namespace", noNS)
		})
	}
}

// helmLabels are the labels Helm's conventions put on every object and pod
// template of a chart, which a kustomize build has no equivalent of (the
// release, the chart's version, the tool that manages the objects):
// TestChartMatchesKustomize compares the objects without them, and
// TestChartStandardLabels checks them.
var helmLabels = []string{"helm.sh/chart", "app.kubernetes.io/instance", "app.kubernetes.io/managed-by", "app.kubernetes.io/version"}

// withoutHelmLabels returns copies of objs without helmLabels on the
// objects and their pod templates.
func withoutHelmLabels(objs []*unstructured.Unstructured) []*unstructured.Unstructured {
	out := make([]*unstructured.Unstructured, 0, len(objs))
	for _, o := range objs {
		c := o.DeepCopy()
		for _, path := range [][]string{{"metadata", "labels"}, {"spec", "template", "metadata", "labels"}} {
			labels, ok, _ := unstructured.NestedStringMap(c.Object, path...)
			if !ok {
				continue
			}
			for _, k := range helmLabels {
				delete(labels, k)
			}
			if len(labels) == 0 {
				unstructured.RemoveNestedField(c.Object, path...)
			} else {
				_ = unstructured.SetNestedStringMap(c.Object, labels, path...)
			}
		}
		out = append(out, c)
	}
	return out
}

// TestChartStandardLabels: every object, hook and pod template of every
// profile carries Helm's standard labels with the release's values, and no
// selector names a label that changes between releases or versions.
func TestChartStandardLabels(t *testing.T) {
	want := map[string]string{
		"helm.sh/chart":                "consul-cni-repair-0.1.0",
		"app.kubernetes.io/instance":   "consul-cni-repair",
		"app.kubernetes.io/managed-by": "Helm",
		"app.kubernetes.io/version":    "v0.1.0",
	}
	for name, p := range chartProfiles {
		vals := chartValues(t, profileFiles(p), "namespace.create=true", "nodeStartupTaint.enabled=true", "nodeStartupTaint.cniToleratesTaint=true", "controller.dryRun=false")
		objs, hooks, err := helmRender(chartDir(t), namespace, vals)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, o := range append(objs, hooks...) {
			paths := [][]string{{"metadata", "labels"}}
			if _, ok, _ := unstructured.NestedMap(o.Object, "spec", "template", "metadata"); ok {
				paths = append(paths, []string{"spec", "template", "metadata", "labels"})
			}
			for _, path := range paths {
				labels, _, _ := unstructured.NestedStringMap(o.Object, path...)
				for k, v := range want {
					if labels[k] != v {
						t.Errorf("%s: %s %s: .%s[%s] = %q, want %q", name, o.GetKind(), o.GetName(), strings.Join(path, "."), k, labels[k], v)
					}
				}
			}
			sel, _, _ := unstructured.NestedStringMap(o.Object, "spec", "selector", "matchLabels")
			for _, k := range helmLabels {
				if _, ok := sel[k]; ok {
					t.Errorf("%s: %s %s selects by %s, which changes with the release or version", name, o.GetKind(), o.GetName(), k)
				}
			}
		}
	}
}

// TestChartProfilesListed keeps the profiles directory and the profiles
// proven above in step.
func TestChartProfilesListed(t *testing.T) {
	entries, err := os.ReadDir(filepath.Join(chartDir(t), "profiles"))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, p := range chartProfiles {
		if p.values != "" {
			listed[p.values] = true
		}
	}
	for _, e := range entries {
		if !listed[e.Name()] && !chartPlatformProfiles[e.Name()] {
			t.Errorf("profiles/%s is not compared with a kustomization (add it to chartProfiles)", e.Name())
		}
		delete(listed, e.Name())
	}
	for f := range listed {
		t.Errorf("profile %s is listed but profiles/%s does not exist", f, f)
	}
}

// TestChartPlatformProfiles: gke.yaml changes the installer's host CNI bin
// directory and adds the ResourceQuota of components/gke-resource-quota,
// and nothing else.
func TestChartPlatformProfiles(t *testing.T) {
	base := byID(t, renderChart(t, chartValues(t, nil)))
	gke := byID(t, renderChart(t, chartValues(t, []string{"gke.yaml"})))
	quota := byID(t, buildWithComponent(t, filepath.Join(manifestsDir(t), overlays["base"]), filepath.Join(manifestsDir(t), "components", "gke-resource-quota")))
	var diffs []string
	for id, o := range gke {
		if base[id] == nil {
			if !strings.Contains(id, "ResourceQuota") || quota[id] == nil {
				t.Errorf("%s: only with gke.yaml", id)
				continue
			}
			// The same object as the kustomize component's, Helm's
			// labels aside.
			for _, d := range diffValues("", o.Object, quota[id].Object) {
				if !strings.Contains(d, ".metadata.labels") {
					t.Errorf("%s: %s (chart != components/gke-resource-quota)", id, d)
				}
			}
			continue
		}
		for _, d := range diffValues("", o.Object, base[id].Object) {
			diffs = append(diffs, id+": "+d)
		}
	}
	quotaID := "v1 ResourceQuota " + namespace + "/" + installerName
	if gke[quotaID] == nil || quota[quotaID] == nil {
		t.Errorf("%s: rendered with gke.yaml %v, built by components/gke-resource-quota %v; want both", quotaID, gke[quotaID] != nil, quota[quotaID] != nil)
	}
	want := []string{"apps/v1 DaemonSet " + namespace + "/" + installerName + ": .spec.template.spec.volumes[0].hostPath.path: /home/kubernetes/bin != /opt/cni/bin"}
	if !reflect.DeepEqual(diffs, want) {
		t.Errorf("gke.yaml changes\n  %s\nwant\n  %s", joinLinesN(diffs), joinLinesN(want))
	}
}

func joinLinesN(s []string) string { return strings.Join(s, "\n  ") }

// TestHelmLint runs `helm lint --strict` with every profile.
func TestHelmLint(t *testing.T) {
	files := map[string][]string{"gke": {"gke.yaml"}}
	for name, p := range chartProfiles {
		files[name] = profileFiles(p)
	}
	for name, f := range files {
		t.Run(name, func(t *testing.T) {
			lint := action.NewLint()
			lint.Strict = true
			lint.Namespace = namespace
			res := lint.Run([]string{chartDir(t)}, chartValues(t, f))
			for _, m := range res.Messages {
				if m.Severity > support.InfoSev {
					t.Errorf("helm lint: %s", m)
				} else {
					t.Logf("helm lint: %s", m)
				}
			}
			for _, err := range res.Errors {
				t.Errorf("helm lint: %v", err)
			}
			if res.TotalChartsLinted != 1 {
				t.Errorf("%d charts linted, want 1", res.TotalChartsLinted)
			}
		})
	}
}

// TestValuesSchemaRejects: `helm lint` (and so install and template) refuses
// values the schema does not allow, naming the value; the profiles pass
// (TestHelmLint).
func TestValuesSchemaRejects(t *testing.T) {
	for set, want := range map[string]string{
		"controller.action=restart":             "/controller/action",
		"controller.cniReadyGate=node":          "/controller/cniReadyGate",
		"controller.dryRun=maybe":               "/controller/dryRun",
		"controller.replicas=0":                 "/controller/replicas",
		"controller.extraArgs={workers=4}":      "/controller/extraArgs/0",
		"installer.backend=ebpf":                "/installer/backend",
		"installer.hostCNIBinDir=opt/cni/bin":   "/installer/hostCNIBinDir",
		"installer.metricsPort=70000":           "/installer/metricsPort",
		"uninstallHook.timeout=ten":             "/uninstallHook/timeout",
		"tests.checksTimeout=soon":              "/tests/checksTimeout",
		"tests.enabled=maybe":                   "/tests/enabled",
		"monitoring.serviceMonitor.interval=":   "/monitoring/serviceMonitor/interval",
		"controller.image.pullPolicy=Sometimes": "/controller/image/pullPolicy",
		"contoller.action=evict":                "contoller",
		"installer.enable=false":                "enable",
		"imagePullSecrets[0].nam=x":             "nam",
	} {
		t.Run(set, func(t *testing.T) {
			lint := action.NewLint()
			lint.Strict = true
			lint.Namespace = namespace
			res := lint.Run([]string{chartDir(t)}, chartValues(t, nil, set))
			var msgs []string
			for _, m := range res.Messages {
				if m.Severity > support.InfoSev {
					msgs = append(msgs, m.Err.Error())
				}
			}
			all := strings.Join(msgs, "\n")
			if !strings.Contains(all, want) {
				t.Errorf("helm lint --set %s: %q, want an error naming %s", set, all, want)
			}
			if testing.Verbose() {
				t.Logf("helm lint --set %s: %s", set, all)
			}
		})
	}
}

// TestMonitoringOnlyWhereTheAPIHasIt: without the Prometheus Operator's
// kinds in the API, the chart renders no ServiceMonitor, PodMonitor or
// PrometheusRule (the install succeeds), and NOTES.txt names what it left
// out; with them, all three, and the notes say nothing of it.
func TestMonitoringOnlyWhereTheAPIHasIt(t *testing.T) {
	kinds := map[string]bool{"ServiceMonitor": true, "PodMonitor": true, "PrometheusRule": true}
	for _, apis := range [][]string{nil, monitoringAPIs[:1], monitoringAPIs} {
		objs, _, notes, err := helmRenderAPIs(chartDir(t), namespace, chartValues(t, nil), apis)
		if err != nil {
			t.Fatalf("APIs %v: %v", apis, err)
		}
		got := map[string]bool{}
		for _, o := range objs {
			if kinds[o.GetKind()] {
				got[o.GetKind()] = true
			}
		}
		var missing []string
		for _, k := range []string{"ServiceMonitor", "PodMonitor", "PrometheusRule"} {
			has := false
			for _, a := range apis {
				has = has || strings.HasSuffix(a, "/"+k)
			}
			if got[k] != has {
				t.Errorf("APIs %v: %s rendered %v, want %v", apis, k, got[k], has)
			}
			if !has {
				missing = append(missing, k)
			}
		}
		if len(missing) == 0 && strings.Contains(notes, "Not rendered") {
			t.Errorf("APIs %v: notes say something was left out:\n%s", apis, notes)
		}
		sort.Strings(missing)
		if len(missing) > 0 && !strings.Contains(notes, "Not rendered: "+strings.Join(missing, ", ")) {
			t.Errorf("APIs %v: notes do not name %v:\n%s", apis, missing, notes)
		}
	}
}

// TestNotes: NOTES.txt says which mode the controller runs in and how to
// verify and go on.
func TestNotes(t *testing.T) {
	for set, want := range map[string][]string{
		"controller.dryRun=true":  {"AUDIT MODE", "reason=WouldRepair", "--set controller.dryRun=false", "rollout status daemonset/consul-cni", "repair audit"},
		"controller.dryRun=false": {"The controller ACTS", "will evict", "reason=BypassedCNI", "repair audit"},
		"installer.enabled=false": {"no installer: the controller watches the CNI pods app.kubernetes.io/name=consul-cni"},
	} {
		_, _, notes, err := helmRenderAPIs(chartDir(t), namespace, chartValues(t, nil, set), monitoringAPIs)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range want {
			if !strings.Contains(notes, w) {
				t.Errorf("%s: notes lack %q:\n%s", set, w, notes)
			}
		}
	}
}

// TestChartValues checks the values no overlay has an equivalent for.
func TestChartValues(t *testing.T) {
	controllerArgs := func(t *testing.T, objs []*unstructured.Unstructured) []string {
		t.Helper()
		c, _, _ := unstructured.NestedSlice(find(t, objs, "Deployment", controllerName).Object, "spec", "template", "spec", "containers")
		args, _, _ := unstructured.NestedStringSlice(c[0].(map[string]any), "args")
		return args
	}
	t.Run("installer off, consul-k8s' DaemonSet watched", func(t *testing.T) {
		objs := renderChart(t, chartValues(t, nil, "installer.enabled=false", "cni.namespace=consul", "cni.podSelector=app=consul\\,component=cni"))
		for _, o := range objs {
			if o.GetName() == installerName || o.GetName() == admissionPolicyName {
				t.Errorf("%s %s rendered with installer.enabled=false", o.GetKind(), o.GetName())
			}
		}
		args := controllerArgs(t, objs)
		if oneFlag(t, args, "cni-namespace") != "consul" || oneFlag(t, args, "cni-pod-selector") != "app=consul,component=cni" {
			t.Errorf("args %v: want --cni-namespace=consul --cni-pod-selector=app=consul,component=cni", args)
		}
	})
	t.Run("node readiness off", func(t *testing.T) {
		if _, err := helmTemplate(chartDir(t), chartValues(t, nil, "controller.nodeReadiness=false")); err == nil || !strings.Contains(err.Error(), "controller.cniReadyGate") {
			t.Errorf("nodeReadiness=false with the node-label gate: error %v, want one naming controller.cniReadyGate", err)
		}
		objs := renderChart(t, chartValues(t, nil, "controller.nodeReadiness=false", "controller.cniReadyGate=cni-pod"))
		args := controllerArgs(t, objs)
		if oneFlag(t, args, "node-readiness") != "false" || oneFlag(t, args, "cni-ready-gate") != "cni-pod" {
			t.Errorf("args %v: want --node-readiness=false --cni-ready-gate=cni-pod", args)
		}
		rules, _, _ := unstructured.NestedSlice(find(t, objs, "ClusterRole", controllerName).Object, "rules")
		for _, r := range rules {
			if res, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "resources"); contains(res, "nodes") {
				if verbs, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "verbs"); contains(verbs, "patch") {
					t.Errorf("nodes verbs %v: no patch without node readiness", verbs)
				}
			}
		}
	})
	t.Run("unknown action", func(t *testing.T) {
		if _, err := helmTemplate(chartDir(t), chartValues(t, nil, "controller.action=restart")); err == nil || !strings.Contains(err.Error(), "/controller/action") {
			t.Errorf("error %v, want the schema's, naming controller.action", err)
		}
	})
	t.Run("extra args, priority class, images", func(t *testing.T) {
		objs := renderChart(t, chartValues(t, []string{"label.yaml"}, "controller.extraArgs={--workers=4,--min-pod-age=1m}",
			"controller.priorityClassName=system-cluster-critical", "controller.image.tag=v9.9.9", "installer.image.repository=registry.example/installer"))
		args := controllerArgs(t, objs)
		if n := len(args); n < 3 || args[n-3] != "--action=label" || args[n-2] != "--workers=4" || args[n-1] != "--min-pod-age=1m" {
			t.Errorf("args %v: want the action's flag, then the extra args last", args)
		}
		d := find(t, objs, "Deployment", controllerName).Object
		if pc, _, _ := unstructured.NestedString(d, "spec", "template", "spec", "priorityClassName"); pc != "system-cluster-critical" {
			t.Errorf("controller priorityClassName %q", pc)
		}
		c, _, _ := unstructured.NestedSlice(d, "spec", "template", "spec", "containers")
		if img := c[0].(map[string]any)["image"]; img != imageRegistry+"repair:v9.9.9" {
			t.Errorf("controller image %v", img)
		}
		c, _, _ = unstructured.NestedSlice(find(t, objs, "DaemonSet", installerName).Object, "spec", "template", "spec", "containers")
		if img := c[0].(map[string]any)["image"]; img != "registry.example/installer:v0.1.0" {
			t.Errorf("installer image %v, want the repository given and appVersion", img)
		}
	})
	t.Run("startup taint in audit mode refused", func(t *testing.T) {
		_, err := helmTemplate(chartDir(t), chartValues(t, nil, "nodeStartupTaint.enabled=true"))
		if err == nil || !strings.Contains(err.Error(), "nodeStartupTaint.enabled=true with controller.dryRun=true") {
			t.Errorf("error %v, want one naming nodeStartupTaint.enabled and controller.dryRun", err)
		}
	})
	t.Run("startup taint without node readiness refused", func(t *testing.T) {
		_, err := helmTemplate(chartDir(t), chartValues(t, []string{"evict.yaml"}, "nodeStartupTaint.enabled=true", "controller.nodeReadiness=false", "controller.cniReadyGate=cni-pod"))
		if err == nil || !strings.Contains(err.Error(), "nodeStartupTaint.enabled=true with controller.nodeReadiness=false") {
			t.Errorf("error %v, want one naming nodeStartupTaint.enabled and controller.nodeReadiness", err)
		}
	})
	t.Run("startup taint in repair-only refused unless consul-k8s's CNI tolerates it", func(t *testing.T) {
		_, err := helmTemplate(chartDir(t), chartValues(t, []string{"repair-only.yaml", "evict.yaml"}, "nodeStartupTaint.enabled=true"))
		if err == nil || !strings.Contains(err.Error(), "installer.enabled=false (repair-only)") || !strings.Contains(err.Error(), "nodeStartupTaint.cniToleratesTaint=true") {
			t.Errorf("error %v, want one naming repair-only and nodeStartupTaint.cniToleratesTaint", err)
		}
		if _, err := helmTemplate(chartDir(t), chartValues(t, []string{"repair-only.yaml", "evict.yaml"}, "nodeStartupTaint.enabled=true", "nodeStartupTaint.cniToleratesTaint=true")); err != nil {
			t.Errorf("with nodeStartupTaint.cniToleratesTaint=true: %v", err)
		}
	})
	t.Run("startup taint only on nodes the installer selects", func(t *testing.T) {
		for _, tc := range []struct {
			set  []string
			want string
		}{
			{nil, `object.metadata.?labels.orValue({})[?"kubernetes.io/os"].orValue("") == "linux"`},
			{[]string{"installer.nodeSelector.pool=mesh"}, `object.metadata.?labels.orValue({})[?"kubernetes.io/os"].orValue("") == "linux" && ` +
				`object.metadata.?labels.orValue({})[?"pool"].orValue("") == "mesh"`},
		} {
			objs := renderChart(t, chartValues(t, []string{"evict.yaml"}, append(tc.set, "nodeStartupTaint.enabled=true")...))
			conds, _, _ := unstructured.NestedSlice(find(t, objs, "MutatingAdmissionPolicy", startupTaintPolicyName).Object, "spec", "matchConditions")
			got := ""
			for _, c := range conds {
				if c.(map[string]any)["name"] == "cni-daemonset-targets-node" {
					got = strings.Join(strings.Fields(c.(map[string]any)["expression"].(string)), " ")
				}
			}
			if got != tc.want {
				t.Errorf("%v: condition cni-daemonset-targets-node %q, want %q", tc.set, got, tc.want)
			}
		}
	})
	t.Run("pull secrets, pod annotations and labels, extra args on every workload", func(t *testing.T) {
		set := []string{"imagePullSecrets[0].name=regcred"}
		for _, w := range []string{"controller", "installer", "verifier", "uninstallHook"} {
			set = append(set, w+".podAnnotations.example\\.com/a="+w, w+".podLabels.example\\.com/l="+w, w+".extraArgs={--v=4}")
		}
		vals := chartValues(t, nil, set...)
		objs, hooks, err := helmRender(chartDir(t), namespace, vals)
		if err != nil {
			t.Fatal(err)
		}
		for w, o := range map[string]*unstructured.Unstructured{
			"controller":    find(t, objs, "Deployment", controllerName),
			"installer":     find(t, objs, "DaemonSet", installerName),
			"verifier":      find(t, objs, "DaemonSet", verifierName),
			"uninstallHook": find(t, hooks, "Job", "consul-cni-uninstall"),
		} {
			tmpl, _, _ := unstructured.NestedMap(o.Object, "spec", "template")
			ann, _, _ := unstructured.NestedStringMap(tmpl, "metadata", "annotations")
			labels, _, _ := unstructured.NestedStringMap(tmpl, "metadata", "labels")
			if ann["example.com/a"] != w || ann["consul.hashicorp.com/connect-inject"] != "false" {
				t.Errorf("%s pod annotations %v", w, ann)
			}
			if labels["example.com/l"] != w || labels["app.kubernetes.io/part-of"] != "consul-cni-repair" {
				t.Errorf("%s pod labels %v", w, labels)
			}
			secrets, _, _ := unstructured.NestedSlice(tmpl, "spec", "imagePullSecrets")
			if len(secrets) != 1 || secrets[0].(map[string]any)["name"] != "regcred" {
				t.Errorf("%s imagePullSecrets %v", w, secrets)
			}
			c, _, _ := unstructured.NestedSlice(tmpl, "spec", "containers")
			args, _, _ := unstructured.NestedStringSlice(c[0].(map[string]any), "args")
			if len(args) == 0 || args[len(args)-1] != "--v=4" {
				t.Errorf("%s args %v: want --v=4 last", w, args)
			}
		}
	})
	t.Run("installer backend", func(t *testing.T) {
		objs := renderChart(t, chartValues(t, nil, "installer.backend=nftables"))
		c, _, _ := unstructured.NestedSlice(find(t, objs, "DaemonSet", installerName).Object, "spec", "template", "spec", "containers")
		args, _, _ := unstructured.NestedStringSlice(c[0].(map[string]any), "args")
		probe, _, _ := unstructured.NestedStringSlice(c[0].(map[string]any), "readinessProbe", "exec", "command")
		if oneFlag(t, args, "backend") != "nftables" || oneFlag(t, probe, "backend") != "nftables" {
			t.Errorf("installer args %v, probe %v: want --backend=nftables in both", args, probe)
		}
	})
	t.Run("monitoring off one by one", func(t *testing.T) {
		for key, kind := range map[string]string{"serviceMonitor": "ServiceMonitor", "podMonitor": "PodMonitor", "prometheusRule": "PrometheusRule", "dashboard": "ConfigMap"} {
			objs := renderChart(t, chartValues(t, nil, "monitoring."+key+".enabled=false"))
			for _, o := range objs {
				if o.GetKind() == kind {
					t.Errorf("monitoring.%s.enabled=false still renders %s %s", key, kind, o.GetName())
				}
			}
			if full := renderChart(t, chartValues(t, nil)); len(objs) != len(full)-1 {
				t.Errorf("monitoring.%s.enabled=false: %d objects, want %d", key, len(objs), len(full)-1)
			}
		}
	})
}

// TestChartPackage: `helm package` stores the linked files' contents, so
// the packaged chart renders what the chart directory renders.
func TestChartPackage(t *testing.T) {
	pkg := action.NewPackage()
	pkg.Destination = t.TempDir()
	archive, err := pkg.Run(chartDir(t), nil)
	if err != nil {
		t.Fatalf("helm package: %v", err)
	}
	for name, p := range chartProfiles {
		vals := chartValues(t, profileFiles(p))
		fromArchive, err := helmTemplate(archive, vals)
		if err != nil {
			t.Fatalf("helm template %s: %v", filepath.Base(archive), err)
		}
		compareObjects(t, "packaged chart ("+name+")", fromArchive, "chart directory", renderChart(t, vals))
	}
}
