package manifests

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
	apiruntime "k8s.io/apimachinery/pkg/runtime"
)

// Names of the deployment, as docs/design/deployment.md fixes them.
const (
	namespace           = "consul-cni-repair"
	controllerName      = "consul-cni-repair"
	actionRoleName      = "consul-cni-repair-action"
	installerName       = "consul-cni"
	dashboardCMName     = "consul-cni-repair-dashboard"
	metricsSvcName      = "consul-cni-repair-metrics"
	admissionPolicyName = "consul-cni-status-annotation-only"
	imageRegistry       = "ghcr.io/consul-cni-repair/"
	startupTaintKey     = "consul.hashicorp.com/cni-not-ready"
	monitoringGroup     = "monitoring.coreos.com"
	controllerSAUser    = "system:serviceaccount:" + namespace + ":" + controllerName
	installerSAUser     = "system:serviceaccount:" + namespace + ":" + installerName
	verifierName        = "consul-cni-verifier"
	verifierPolicyName  = "consul-cni-verifier-conditions-only"
	verifierSAUser      = "system:serviceaccount:" + namespace + ":" + verifierName
)

// The controller's admission policies (each with a binding of the same
// name).
const (
	controllerPodPolicyName  = "consul-cni-repair-pod-writes"
	controllerNodePolicyName = "consul-cni-repair-node-writes"
	// controllerDeletePolicyName confines pod DELETE to injected pods and
	// evictions to ones with preconditions.
	controllerDeletePolicyName = "consul-cni-repair-pod-deletes"
)

// admissionPolicyNames are all the ValidatingAdmissionPolicies (each with
// a binding of the same name) every overlay ships.
var admissionPolicyNames = []string{admissionPolicyName, controllerPodPolicyName, controllerNodePolicyName, controllerDeletePolicyName, verifierPolicyName}

// overlays are the deployable kustomizations, by name, relative to
// manifests/. "base" is the default action (evict).
var overlays = map[string]string{
	"base":   "base",
	"audit":  "overlays/audit",
	"delete": "overlays/delete",
	"label":  "overlays/label",
}

func overlayNames() []string {
	names := make([]string, 0, len(overlays))
	for n := range overlays {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func manifestsDir(tb testing.TB) string {
	return filepath.Join(testbin.RepoRoot(), "manifests")
}

// build runs kustomize (the krusty library, as `kustomize build` and
// `kubectl apply -k` do) on a directory and returns the objects.
func build(tb testing.TB, dir string) []*unstructured.Unstructured {
	tb.Helper()
	objs, err := buildDir(dir)
	if err != nil {
		tb.Fatalf("kustomize build %s: %v", dir, err)
	}
	return objs
}

func buildDir(dir string) ([]*unstructured.Unstructured, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, err
	}
	var out []*unstructured.Unstructured
	for _, r := range rm.Resources() {
		// Through JSON, so numbers are int64/float64 as in every
		// unstructured object client-go makes (DeepCopy relies on it).
		b, err := r.MarshalJSON()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", r.CurId(), err)
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(b); err != nil {
			return nil, fmt.Errorf("%s: %w", r.CurId(), err)
		}
		out = append(out, u)
	}
	return out, nil
}

func buildOverlay(tb testing.TB, name string) []*unstructured.Unstructured {
	tb.Helper()
	return build(tb, filepath.Join(manifestsDir(tb), overlays[name]))
}

// buildInNamespace builds an overlay through a throw-away kustomization
// that installs it in namespace ns (kustomize's namespace: field, as a user
// would), creating nothing.
func buildInNamespace(tb testing.TB, overlay, ns string) []*unstructured.Unstructured {
	tb.Helper()
	dir := tb.TempDir()
	rel, err := filepath.Rel(dir, filepath.Join(manifestsDir(tb), overlays[overlay]))
	if err != nil {
		tb.Fatal(err)
	}
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: " + ns + "\nresources:\n  - " + rel + "\n"
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		tb.Fatal(err)
	}
	return build(tb, dir)
}

// find returns the one object of that kind and name, failing the test when
// there is not exactly one.
func find(tb testing.TB, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	tb.Helper()
	var found []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		tb.Fatalf("want exactly one %s %q in the build, found %d", kind, name, len(found))
	}
	return found[0]
}

// decodeStrict converts an object into a typed API struct and fails on any
// field the type does not know (a typo in a manifest).
func decodeStrict(tb testing.TB, u *unstructured.Unstructured, into any) {
	tb.Helper()
	if err := apiruntime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, into, true); err != nil {
		tb.Fatalf("%s %s/%s: %v", u.GetKind(), u.GetNamespace(), u.GetName(), err)
	}
}

func gvkOf(u *unstructured.Unstructured) schema.GroupVersionKind {
	return u.GroupVersionKind()
}

// metricsReference is the page whose "Controller metrics" and "Installer
// metrics" tables are the metrics contract.
const metricsReference = "docs/reference/metrics.md"

// metricSpec is one row of the controller metrics table of
// docs/reference/metrics.md.
type metricSpec struct {
	Name   string // full name, or a prefix when Prefix
	Prefix bool   // the row names a family (`consul_cni_repair_workqueue_*`)
	Type   string // counter, gauge, histogram, ...
	// Labels maps each label to its allowed values (nil: any value).
	Labels map[string][]string
}

var (
	rowName  = regexp.MustCompile("^\\|\\s*`([a-z_:]+)(\\*?)`\\s*\\|\\s*([^|]*?)\\s*\\|\\s*([^|]*?)\\s*\\|\\s*$")
	rowLabel = regexp.MustCompile("`([a-zA-Z_][a-zA-Z0-9_]*)`(?:\\s*\\(([^)]*)\\))?")
)

// architectureMetrics reads the controller metrics table of
// docs/reference/metrics.md, the contract between the controller and its
// dashboard and alerts.
func architectureMetrics(tb testing.TB) []metricSpec {
	tb.Helper()
	path := filepath.Join(testbin.RepoRoot(), metricsReference)
	f, err := os.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	specs, err := parseMetricTable(f)
	if err != nil {
		tb.Fatalf("%s: %v", path, err)
	}
	return specs
}

func parseMetricTable(r interface{ Read([]byte) (int, error) }) ([]metricSpec, error) {
	sc := bufio.NewScanner(r)
	in := false
	var specs []metricSpec
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			in = strings.Contains(line, "Controller metrics") || strings.Contains(line, "Installer metrics")
			continue
		}
		if !in {
			continue
		}
		m := rowName.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		s := metricSpec{Name: m[1], Prefix: m[2] == "*", Type: m[3], Labels: map[string][]string{}}
		for _, l := range rowLabel.FindAllStringSubmatch(m[4], -1) {
			var values []string
			if l[2] != "" {
				for _, v := range strings.Split(l[2], ",") {
					values = append(values, strings.TrimSpace(v))
				}
			}
			s.Labels[l[1]] = values
		}
		specs = append(specs, s)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(specs) == 0 {
		return nil, fmt.Errorf("no metrics table under a \"Controller metrics\" heading")
	}
	return specs, nil
}

// lookupMetric finds the table row a series name belongs to: the name
// itself, a histogram's _bucket/_sum/_count series, or a family prefix.
func lookupMetric(specs []metricSpec, series string) (metricSpec, bool) {
	for _, s := range specs {
		switch {
		case s.Prefix && strings.HasPrefix(series, s.Name):
			return s, true
		case !s.Prefix && s.Name == series:
			return s, true
		case !s.Prefix && s.Type == "histogram":
			for _, suf := range []string{"_bucket", "_sum", "_count"} {
				if series == s.Name+suf {
					return s, true
				}
			}
		}
	}
	return metricSpec{}, false
}

// dashboard is the part of a Grafana dashboard the tests read.
type dashboard struct {
	UID        string  `json:"uid"`
	Title      string  `json:"title"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Definition string          `json:"definition"`
			Query      json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID      int           `json:"id"`
	Type    string        `json:"type"`
	Title   string        `json:"title"`
	Panels  []panel       `json:"panels"` // collapsed rows
	Targets []panelTarget `json:"targets"`
}

type panelTarget struct {
	RefID string `json:"refId"`
	Expr  string `json:"expr"`
}

// dashboardFromBuild returns the dashboard JSON held by the ConfigMap of a
// build, exactly as the Grafana sidecar would read it.
func dashboardFromBuild(tb testing.TB, objs []*unstructured.Unstructured) (dashboard, map[string]string) {
	tb.Helper()
	cm := find(tb, objs, "ConfigMap", dashboardCMName)
	data, _, _ := unstructured.NestedStringMap(cm.Object, "data")
	if len(data) != 1 {
		tb.Fatalf("dashboard ConfigMap holds %d files, want 1", len(data))
	}
	var d dashboard
	for name, text := range data {
		if !strings.HasSuffix(name, ".json") {
			tb.Fatalf("dashboard ConfigMap key %q: the sidecar wants a .json file", name)
		}
		dec := json.NewDecoder(strings.NewReader(text))
		if err := dec.Decode(&d); err != nil {
			tb.Fatalf("dashboard %s: %v", name, err)
		}
	}
	return d, cm.GetLabels()
}

// allPanels flattens rows.
func allPanels(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, allPanels(p.Panels)...)
	}
	return out
}
