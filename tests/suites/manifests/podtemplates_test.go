package manifests

import (
	"net"
	"path/filepath"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/common/model"
	promlabels "github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/relabel"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
)

// podTemplatePaths are where pod metadata lives in the kinds that make pods.
var podTemplatePaths = map[string][]string{
	"Pod":         {"metadata"},
	"Deployment":  {"spec", "template", "metadata"},
	"DaemonSet":   {"spec", "template", "metadata"},
	"StatefulSet": {"spec", "template", "metadata"},
	"ReplicaSet":  {"spec", "template", "metadata"},
	"Job":         {"spec", "template", "metadata"},
	"CronJob":     {"spec", "jobTemplate", "spec", "template", "metadata"},
}

// podTemplates returns, for every object of objs that makes pods, the
// annotations of its pod template, keyed by kind/name.
func podTemplates(tb testing.TB, objs []*unstructured.Unstructured) map[string]map[string]string {
	tb.Helper()
	out := map[string]map[string]string{}
	for _, o := range objs {
		path, ok := podTemplatePaths[o.GetKind()]
		if !ok {
			continue
		}
		anns, _, err := unstructured.NestedStringMap(o.Object, append(path, "annotations")...)
		if err != nil {
			tb.Fatalf("%s %s: pod template annotations: %v", o.GetKind(), o.GetName(), err)
		}
		out[o.GetKind()+"/"+o.GetName()] = anns
	}
	return out
}

// TestPodTemplatesNotInjected: none of our pods may get a Consul sidecar,
// also where consul-k8s injects by default (connectInject.default=true).
func TestPodTemplatesNotInjected(t *testing.T) {
	root := manifestsDir(t)
	builds := map[string][]*unstructured.Unstructured{}
	for _, ov := range overlayNames() {
		builds[ov] = buildOverlay(t, ov)
	}
	builds["audit+without-prometheus-operator"] = buildWithComponent(t,
		filepath.Join(root, overlays["audit"]), filepath.Join(root, "components", "without-prometheus-operator"))
	for name, objs := range builds {
		t.Run(name, func(t *testing.T) {
			tmpls := podTemplates(t, objs)
			for _, want := range []string{"Deployment/" + controllerName, "DaemonSet/" + installerName} {
				if _, ok := tmpls[want]; !ok {
					t.Errorf("no pod template of %s in the build", want)
				}
			}
			for id, anns := range tmpls {
				if v, ok := anns[annotations.KeyConnectInject]; !ok || v != "false" {
					t.Errorf("%s: pod template annotation %s=%q (set: %v), want \"false\"", id, annotations.KeyConnectInject, v, ok)
				}
			}
		})
	}
}

func TestPodTemplatesHelper(t *testing.T) {
	objs := []*unstructured.Unstructured{
		{Object: map[string]any{"kind": "CronJob", "metadata": map[string]any{"name": "c"},
			"spec": map[string]any{"jobTemplate": map[string]any{"spec": map[string]any{"template": map[string]any{
				"metadata": map[string]any{"annotations": map[string]any{annotations.KeyConnectInject: "true"}}}}}}}},
		{Object: map[string]any{"kind": "Pod", "metadata": map[string]any{"name": "p"}}},
		{Object: map[string]any{"kind": "ConfigMap", "metadata": map[string]any{"name": "m"}}},
	}
	got := podTemplates(t, objs)
	if len(got) != 2 || got["CronJob/c"][annotations.KeyConnectInject] != "true" || got["Pod/p"] != nil {
		t.Fatalf("podTemplates = %v", got)
	}
}

// TestPodMonitor: the PodMonitor selects the installer's pods and, by its
// relabelings run through Prometheus' own relabeling, scrapes the pod's IP
// (the node's) at the port of --metrics-bind-address, which the container
// must not declare (a hostPort would block the rolling update's surge pod).
func TestPodMonitor(t *testing.T) {
	for _, ov := range overlayNames() {
		t.Run(ov, func(t *testing.T) {
			objs := buildOverlay(t, ov)
			var pm monitoringv1.PodMonitor
			decodeStrict(t, find(t, objs, "PodMonitor", installerName), &pm)
			var ds appsv1.DaemonSet
			decodeStrict(t, find(t, objs, "DaemonSet", installerName), &ds)
			sel, err := metav1.LabelSelectorAsSelector(&pm.Spec.Selector)
			if err != nil {
				t.Fatal(err)
			}
			if sel.Empty() || !sel.Matches(labels.Set(ds.Spec.Template.Labels)) {
				t.Errorf("PodMonitor selector %q does not select the DaemonSet's pods (labels %v)", sel, ds.Spec.Template.Labels)
			}
			if !pm.Spec.NamespaceSelector.Any && !contains(pm.Spec.NamespaceSelector.MatchNames, ds.Namespace) {
				t.Errorf("PodMonitor namespaceSelector %v does not include %s", pm.Spec.NamespaceSelector, ds.Namespace)
			}
			c := ds.Spec.Template.Spec.Containers[0]
			if !ds.Spec.Template.Spec.HostNetwork || len(c.Ports) != 0 {
				t.Errorf("hostNetwork %v, ports %v: want the host network and no declared port", ds.Spec.Template.Spec.HostNetwork, c.Ports)
			}
			_, port, err := net.SplitHostPort(oneFlag(t, c.Args, "metrics-bind-address"))
			if err != nil {
				t.Fatalf("installer --metrics-bind-address: %v", err)
			}
			if len(pm.Spec.PodMetricsEndpoints) != 1 {
				t.Fatalf("PodMonitor has %d endpoints, want 1", len(pm.Spec.PodMetricsEndpoints))
			}
			ep := pm.Spec.PodMetricsEndpoints[0]
			if ep.Port != nil || ep.PortNumber != nil {
				t.Errorf("endpoint selects port %v/%v, which the pod does not declare", ep.Port, ep.PortNumber)
			}
			for podIP, want := range map[string]string{"10.1.2.3": "10.1.2.3:" + port, "fd00::7": "[fd00::7]:" + port} {
				if got := relabeledAddress(t, ep.RelabelConfigs, podIP); got != want {
					t.Errorf("pod IP %s: scrape address %q, want %q", podIP, got, want)
				}
			}
		})
	}
}

// relabeledAddress runs Prometheus' relabeling over the target Kubernetes
// service discovery makes for a pod without declared ports.
func relabeledAddress(tb testing.TB, rcs []monitoringv1.RelabelConfig, podIP string) string {
	tb.Helper()
	var cfgs []*relabel.Config
	for _, rc := range rcs {
		cfg := relabel.DefaultRelabelConfig
		for _, l := range rc.SourceLabels {
			cfg.SourceLabels = append(cfg.SourceLabels, model.LabelName(l))
		}
		if rc.Regex != "" {
			re, err := relabel.NewRegexp(rc.Regex)
			if err != nil {
				tb.Fatalf("relabeling regex %q: %v", rc.Regex, err)
			}
			cfg.Regex = re
		}
		if rc.Replacement != nil {
			cfg.Replacement = *rc.Replacement
		}
		if rc.Action != "" {
			cfg.Action = relabel.Action(rc.Action)
		}
		cfg.TargetLabel = rc.TargetLabel
		if err := cfg.Validate(model.UTF8Validation); err != nil {
			tb.Fatalf("relabeling %+v: %v", rc, err)
		}
		cfgs = append(cfgs, &cfg)
	}
	lb := promlabels.NewBuilder(promlabels.FromStrings("__address__", podIP, "__meta_kubernetes_pod_ip", podIP))
	if !relabel.ProcessBuilder(lb, cfgs...) {
		tb.Fatalf("pod IP %s: target dropped", podIP)
	}
	return lb.Get("__address__")
}
