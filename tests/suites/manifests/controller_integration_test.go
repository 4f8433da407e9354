//go:build integration

package manifests

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/metrics"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// repairBinary builds cmd/repair, or skips when this tree does not have it.
func repairBinary(t *testing.T) string {
	t.Helper()
	_, inTree := os.Stat(filepath.Join(testbin.RepoRoot(), "cmd", "repair"))
	_, prebuilt := os.Stat(filepath.Join(testbin.Dir(), "repair"))
	if inTree != nil && (os.Getenv("CCR_BIN_DIR") == "" || prebuilt != nil) {
		t.Skip("cmd/repair is not in this tree: the controller cannot be run against the manifests")
	}
	return testbin.Project(t, "repair")
}

// writeKubeconfig writes a kubeconfig for a rest.Config holding a real
// ServiceAccount token.
func writeKubeconfig(t *testing.T, cfg *rest.Config) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := cluster.WriteKubeconfig(path, cfg, controllerName); err != nil {
		t.Fatal(err)
	}
	return path
}

// controllerArgs takes the container args of an overlay's Deployment and
// rebinds the listeners to loopback ports of this test.
func controllerArgs(t *testing.T, ov string, metricsPort, healthPort int) []string {
	t.Helper()
	var d appsv1.Deployment
	decodeStrict(t, find(t, buildOverlay(t, ov), "Deployment", controllerName), &d)
	var args []string
	for _, a := range d.Spec.Template.Spec.Containers[0].Args {
		switch {
		case strings.HasPrefix(a, "--metrics-bind-address="):
			a = fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", metricsPort)
		case strings.HasPrefix(a, "--health-probe-bind-address="):
			a = fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", healthPort)
		}
		args = append(args, a)
	}
	return args
}

// startController runs cmd/repair as a process of this test and stops it
// (SIGTERM, then SIGKILL) at cleanup.
func startController(t *testing.T, bin string, args []string) (logPath string) {
	t.Helper()
	logPath = filepath.Join(t.TempDir(), "repair.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "KUBECONFIG=") // only --kubeconfig
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			if len(b) > 20000 {
				b = b[len(b)-20000:]
			}
			t.Logf("repair %s\n--- log (tail) ---\n%s", strings.Join(args, " "), b)
		}
	})
	return logPath
}

func httpGet(url string) (int, string, error) {
	return httpGetVia(&http.Client{}, url)
}

// httpGetVia is httpGet with the client's transport (a node's network
// namespace, for instance).
func httpGetVia(cl *http.Client, url string) (int, string, error) {
	cl.Timeout = 5 * time.Second
	resp, err := cl.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

func scrape(url string) (map[string]*dto.MetricFamily, error) {
	return scrapeVia(&http.Client{}, url)
}

func scrapeVia(cl *http.Client, url string) (map[string]*dto.MetricFamily, error) {
	code, body, err := httpGetVia(cl, url)
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %d", url, code)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(strings.NewReader(body))
}

// fakeNode is a Node object without a kubelet: the test reports its
// heartbeat (Lease and Ready condition) itself, so the node lifecycle
// controller keeps it Ready while the controller runs.
func fakeNode(t *testing.T, ctx context.Context, cs kubernetes.Interface, name string, taints []corev1.Taint) {
	t.Helper()
	_, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}},
		Spec:       corev1.NodeSpec{Taints: taints},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	hbCtx, stop := context.WithCancel(ctx)
	finished := make(chan struct{})
	t.Cleanup(func() {
		stop()
		<-finished
		_ = cs.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	beat := func() {
		now := metav1.Now()
		n, err := cs.CoreV1().Nodes().Get(hbCtx, name, metav1.GetOptions{})
		if err != nil {
			return
		}
		n.Status.Conditions = []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			LastHeartbeatTime: now, LastTransitionTime: now,
		}}
		_, _ = cs.CoreV1().Nodes().UpdateStatus(hbCtx, n, metav1.UpdateOptions{})
		leases := cs.CoordinationV1().Leases(corev1.NamespaceNodeLease)
		l, err := leases.Get(hbCtx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, _ = leases.Create(hbCtx, &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr(name), LeaseDurationSeconds: ptr(int32(40)), RenewTime: &metav1.MicroTime{Time: now.Time}},
			}, metav1.CreateOptions{})
			return
		}
		if err == nil {
			l.Spec.RenewTime = &metav1.MicroTime{Time: now.Time}
			_, _ = leases.Update(hbCtx, l, metav1.UpdateOptions{})
		}
	}
	beat()
	go func() {
		defer close(finished)
		tick := time.NewTicker(5 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-hbCtx.Done():
				return
			case <-tick.C:
				beat()
			}
		}
	}()
}

// setRunning reports a pod as kubelet would once its sandbox exists and its
// containers started, with the given readiness.
func setRunning(ctx context.Context, cs kubernetes.Interface, p *corev1.Pod, ip string, ready bool) error {
	p, err := cs.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	started := metav1.NewTime(time.Now().Add(-2 * time.Minute))
	rs := corev1.ConditionFalse
	if ready {
		rs = corev1.ConditionTrue
	}
	p.Status.Phase = corev1.PodRunning
	p.Status.PodIP = ip
	p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	p.Status.HostIP = "198.18.255.1"
	p.Status.StartTime = &started
	p.Status.Conditions = []corev1.PodCondition{
		{Type: corev1.PodReadyToStartContainers, Status: corev1.ConditionTrue, LastTransitionTime: started},
		{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: started},
		{Type: corev1.ContainersReady, Status: rs, LastTransitionTime: started},
		{Type: corev1.PodReady, Status: rs, LastTransitionTime: started},
	}
	p.Status.ContainerStatuses = nil
	for _, c := range p.Spec.Containers {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, Ready: ready, Started: ptr(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: started}},
		})
	}
	_, err = cs.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
	return err
}

// injectedTemplate is what the consul-k8s webhook leaves on a
// transparent-proxy pod before the CNI plugin ran.
func injectedMeta(labels map[string]string) metav1.ObjectMeta {
	l := map[string]string{annotations.KeyInjectStatus: annotations.InjectStatusInjected}
	for k, v := range labels {
		l[k] = v
	}
	return metav1.ObjectMeta{
		Labels: l,
		Annotations: map[string]string{
			annotations.KeyInjectStatus:           annotations.InjectStatusInjected,
			annotations.KeyTransparentProxyStatus: annotations.TProxyStatusEnabled,
			// consul-k8s's plugin fails ADD without it; its webhook writes it.
			annotations.KeyDualStack: "false",
		},
	}
}

// webRedirectConfig is the redirect-traffic-config annotation of the tests'
// injected "web" workloads, as the webhook writes it.
const webRedirectConfig = `{"ProxyUserID":"5995","ProxyInboundPort":20000,"ProxyOutboundPort":15001,"ExcludeUIDs":["5996"]}`

// createInjectedWeb creates the Deployment "web" in ns: replicas injected
// pods (labels app=web) pinned to node.
func createInjectedWeb(t *testing.T, c *cluster.Cluster, ns, node string, replicas int32) {
	t.Helper()
	meta := injectedMeta(map[string]string{"app": "web"})
	meta.Annotations[annotations.KeyRedirectTrafficConfig] = webRedirectConfig
	if _, err := c.Client.AppsV1().Deployments(ns).Create(context.Background(), &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: meta, Spec: corev1.PodSpec{
				NodeSelector: map[string]string{"kubernetes.io/hostname": node},
				Containers:   []corev1.Container{{Name: "web", Image: "registry.example/web:1"}},
			}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// webOutsideMesh lists the running "web" pods in ns whose
// transparent-proxy-status is still enabled: their sandbox was made
// without the plugin.
func webOutsideMesh(ctx context.Context, c *cluster.Cluster, ns string) ([]corev1.Pod, error) {
	l, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
	if err != nil {
		return nil, err
	}
	var out []corev1.Pod
	for _, p := range l.Items {
		if p.Status.Phase == corev1.PodRunning && p.Annotations[annotations.KeyTransparentProxyStatus] == annotations.TProxyStatusEnabled {
			out = append(out, p)
		}
	}
	return out, nil
}

// TestControllerUnderManifests runs the real controller (cmd/repair) with
// each overlay's exact container args, under the overlay's RBAC (a real
// token of the consul-cni-repair ServiceAccount), against the local control
// plane: a node whose installer pod is Ready gets labelled (and loses its
// startup taint; in audit it is left as it is), a ReplicaSet pod that bypassed the CNI gets the overlay's
// action (or none, in audit), a bare one is only reported. Its /metrics is
// then scraped: every metric a dashboard panel or an alert names must be
// exported, with exactly the labels docs/reference/metrics.md lists.
func TestControllerUnderManifests(t *testing.T) {
	bin := repairBinary(t)
	c := cluster.Shared(t)
	a := newApplier(t, c)
	ctx := context.Background()
	specs := architectureMetrics(t)
	exported := map[string]*dto.MetricFamily{}
	// panel target -> the overlay runs in which it returned data
	panelData := map[string][]string{}
	dash, _ := dashboardFromBuild(t, buildOverlay(t, "base"))

	for _, ov := range []string{"audit", "base", "delete", "label"} {
		t.Run(ov, func(t *testing.T) {
			objs := buildOverlay(t, ov)
			applyRBAC(t, a, objs)
			// A fresh leader election for each run.
			_ = c.Client.CoordinationV1().Leases(namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})

			nodeName := "node-" + ov
			fakeNode(t, ctx, c.Client, nodeName, []corev1.Taint{{Key: annotations.TaintCNINotReady, Value: "true", Effect: corev1.TaintEffectNoSchedule}})

			// The installer pod on that node, Ready (what the exec probe
			// reports on a real node).
			inst := createInstallerPod(t, c, objs, installerName+"-"+ov, nodeName)
			if err := setRunning(ctx, c.Client, inst, "198.18.255.1", true); err != nil {
				t.Fatal(err)
			}

			// Injected workload: a ReplicaSet of 10 on that node; 9 pods got
			// their redirection (complete), one bypassed the CNI (enabled, with
			// a sandbox). Plus one bare pod that bypassed too.
			ns := c.Namespace(t)
			app := map[string]string{"app": "web"}
			tmplMeta := injectedMeta(app)
			_, err := c.Client.AppsV1().ReplicaSets(ns).Create(ctx, &appsv1.ReplicaSet{
				ObjectMeta: metav1.ObjectMeta{Name: "web"},
				Spec: appsv1.ReplicaSetSpec{
					Replicas: ptr(int32(10)),
					Selector: &metav1.LabelSelector{MatchLabels: app},
					Template: corev1.PodTemplateSpec{
						ObjectMeta: tmplMeta,
						Spec: corev1.PodSpec{
							NodeName:   nodeName,
							Containers: []corev1.Container{{Name: "web", Image: "registry.example/web:1"}},
						},
					},
				},
			}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var pods []corev1.Pod
			poll.Eventually(t, 90*time.Second, "ReplicaSet pods created by kube-controller-manager", func() error {
				l, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
				if err != nil {
					return err
				}
				if len(l.Items) != 10 {
					return fmt.Errorf("%d pods", len(l.Items))
				}
				pods = l.Items
				return nil
			})
			sort.Slice(pods, func(i, j int) bool { return pods[i].Name < pods[j].Name })
			broken := pods[0]
			for i := range pods {
				p := &pods[i]
				if i > 0 {
					patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, annotations.KeyTransparentProxyStatus, annotations.TProxyStatusComplete)
					if _, err := c.Client.CoreV1().Pods(ns).Patch(ctx, p.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
						t.Fatal(err)
					}
				}
				if err := setRunning(ctx, c.Client, p, "198.18.250."+strconv.Itoa(10+i), i > 0); err != nil {
					t.Fatal(err)
				}
			}
			bareMeta := injectedMeta(map[string]string{"app": "bare"})
			bareMeta.Name = "bare"
			bare, err := c.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
				ObjectMeta: bareMeta,
				Spec:       corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "bare", Image: "registry.example/bare:1"}}},
			}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if err := setRunning(ctx, c.Client, bare, "198.18.250.99", false); err != nil {
				t.Fatal(err)
			}

			// The controller, as its ServiceAccount, with the overlay's args.
			kubeconfig := writeKubeconfig(t, c.ServiceAccountConfig(t, namespace, controllerName))
			mport, err := testnet.FreePort()
			if err != nil {
				t.Fatal(err)
			}
			hport, err := testnet.FreePort()
			if err != nil {
				t.Fatal(err)
			}
			args := append(controllerArgs(t, ov, mport, hport), "--kubeconfig="+kubeconfig, "--min-pod-age=1s")
			logPath := startController(t, bin, args)
			poll.Eventually(t, 90*time.Second, "/readyz", func() error {
				code, body, err := httpGet(fmt.Sprintf("http://127.0.0.1:%d/readyz", hport))
				if err != nil {
					return err
				}
				if code != http.StatusOK {
					return fmt.Errorf("%d %s", code, body)
				}
				return nil
			})
			if code, _, err := httpGet(fmt.Sprintf("http://127.0.0.1:%d/healthz", hport)); err != nil || code != http.StatusOK {
				t.Errorf("/healthz: %d %v", code, err)
			}
			metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", mport)
			var firstScrape map[string]*dto.MetricFamily
			poll.Eventually(t, 30*time.Second, "a first scrape", func() error {
				var err error
				firstScrape, err = scrape(metricsURL)
				return err
			})

			// Node readiness: label added, startup taint removed; in audit
			// only a Normal Event says so and the node is left as it is.
			if ov == "audit" {
				poll.Eventually(t, 90*time.Second, "a WouldMarkCNIReady node Event", func() error {
					l, err := c.Client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + nodeName + ",reason=WouldMarkCNIReady"})
					if err != nil || len(l.Items) == 0 {
						return fmt.Errorf("no Event yet (%v)", err)
					}
					return nil
				})
				if err := nodeCNIReady(ctx, c.Client, nodeName); err == nil {
					t.Errorf("audit mode marked node %s ready", nodeName)
				}
			} else {
				poll.Eventually(t, 90*time.Second, "node labelled cni=ready without its startup taint", func() error {
					return nodeCNIReady(ctx, c.Client, nodeName)
				})
			}

			// The action on the broken pod.
			poll.Eventually(t, 120*time.Second, "the overlay's action on the broken pod", func() error {
				p, err := c.Client.CoreV1().Pods(ns).Get(ctx, broken.Name, metav1.GetOptions{})
				gone := apierrors.IsNotFound(err)
				if err != nil && !gone {
					return err
				}
				switch ov {
				case "base", "delete":
					if !gone && p.DeletionTimestamp == nil {
						return fmt.Errorf("pod %s neither deleted nor terminating", broken.Name)
					}
				case "label":
					if gone || p.Labels[annotations.LabelUninitialized] != annotations.LabelUninitializedValue {
						return fmt.Errorf("pod %s not labelled %s", broken.Name, annotations.LabelUninitialized)
					}
				case "audit":
					fams, err := scrape(metricsURL)
					if err != nil {
						return err
					}
					if counterSum(fams[metrics.DryRunPodRepairs], map[string]string{"namespace": ns}) < 1 {
						return fmt.Errorf("no dry-run decision counted yet")
					}
				}
				return nil
			})
			// Nothing else was touched: the healthy pods and the bare one
			// are intact.
			for _, p := range append(pods[1:], *bare) {
				got, err := c.Client.CoreV1().Pods(ns).Get(ctx, p.Name, metav1.GetOptions{})
				if err != nil {
					t.Errorf("pod %s: %v", p.Name, err)
					continue
				}
				if got.DeletionTimestamp != nil || got.Labels[annotations.LabelUninitialized] != "" {
					t.Errorf("pod %s was acted on (deleting %v, labels %v)", p.Name, got.DeletionTimestamp, got.Labels)
				}
			}
			if ov == "audit" {
				got, err := c.Client.CoreV1().Pods(ns).Get(ctx, broken.Name, metav1.GetOptions{})
				if err != nil || got.DeletionTimestamp != nil || got.Labels[annotations.LabelUninitialized] != "" {
					t.Errorf("audit mode changed the broken pod: %v %+v", err, got.ObjectMeta)
				}
				if nodeCNIReady(ctx, c.Client, nodeName) == nil {
					t.Errorf("audit mode labelled node %s or removed its startup taint", nodeName)
				}
			}
			// An Event on the pod says what was (or would have been) done.
			poll.Eventually(t, 60*time.Second, "an Event on the broken pod", func() error {
				l, err := c.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + broken.Name})
				if err != nil {
					return err
				}
				if len(l.Items) == 0 {
					return fmt.Errorf("no Event")
				}
				return nil
			})

			// Metrics: whatever this run exported, checked against the
			// table, and kept for the coverage check below.
			var fams map[string]*dto.MetricFamily
			poll.Eventually(t, 60*time.Second, "metrics of the run", func() error {
				var err error
				fams, err = scrape(metricsURL)
				if err != nil {
					return err
				}
				if outcomes(fams, ns) < 1 {
					return fmt.Errorf("neither %s nor %s counts anything for %s", metrics.PodRepairs, metrics.DryRunPodRepairs, ns)
				}
				if counterSum(fams["consul_cni_repair_skipped_total"], map[string]string{"reason": "bare_pod"}) < 1 {
					return fmt.Errorf("the bare pod was not counted as skipped (reason bare_pod)")
				}
				return nil
			})
			// Every panel's query, on the two scrapes as Prometheus would
			// store them (30 s apart, with the target's labels).
			tgt := map[string]string{"job": metricsSvcName, "instance": fmt.Sprintf("127.0.0.1:%d", mport)}
			for id, n := range queriesWithData(t, dash, []map[string]float64{flatten(firstScrape, tgt), flatten(fams, tgt)}) {
				if n > 0 {
					panelData[id] = append(panelData[id], ov)
				}
			}
			if f, ok := fams["process_start_time_seconds"]; ok {
				exported["process_start_time_seconds"] = f // the alerts use it
			}
			for name, f := range fams {
				if !strings.HasPrefix(name, "consul_cni_repair_") {
					continue
				}
				if err := checkFamily(specs, f); err != nil {
					t.Error(err)
				}
				exported[name] = f
			}
			// Under exactly the overlay's RBAC nothing it tried was refused
			// (Events included).
			if b, err := os.ReadFile(logPath); err != nil {
				t.Error(err)
			} else if i := strings.Index(strings.ToLower(string(b)), "forbidden"); i >= 0 {
				t.Errorf("the controller was refused something under the %s RBAC: ...%s...", ov, string(b[max(0, i-300):min(len(b), i+200)]))
			}
			nodeDone := "labelled, startup taint removed"
			if ov == "audit" {
				nodeDone = "left as it was (WouldMarkCNIReady)"
			}
			t.Logf("%s: node %s %s; broken pod %s handled; repairs (real or dry run)=%v, skipped bare_pod=%v",
				ov, nodeName, nodeDone, broken.Name, outcomes(fams, ns),
				counterSum(fams["consul_cni_repair_skipped_total"], map[string]string{"reason": "bare_pod"}))
			wantAction := map[string]string{"audit": "evict", "base": "evict", "delete": "delete", "label": "label"}[ov]
			dry := ov == "audit"
			family := map[bool]string{false: metrics.PodRepairs, true: metrics.DryRunPodRepairs}[dry]
			if n := counterSum(fams[family], map[string]string{"namespace": ns, "action": wantAction, "reason": "tproxy_status_stuck"}); n != 1 {
				t.Errorf("%s{namespace=%s,action=%s,reason=tproxy_status_stuck} = %v, want 1", family, ns, wantAction, n)
			}
			if n := counterSum(fams[metrics.PodRepairFailures], map[string]string{"namespace": ns}); n != 0 {
				t.Errorf("%s{namespace=%s} = %v, want 0", metrics.PodRepairFailures, ns, n)
			}
			if want := map[bool]float64{true: 1}[dry]; gaugeValue(fams[metrics.DryRun]) != want {
				t.Errorf("%s = %v, want %v", metrics.DryRun, gaugeValue(fams[metrics.DryRun]), want)
			}
			checkBornAtZero(t, fams, ns, judge.Action(wantAction), dry)
		})
	}

	// Every metric the dashboard and the alerts use is one the controller
	// really exports.
	t.Run("dashboard and alerts", func(t *testing.T) {
		if len(exported) == 0 {
			t.Skip("no controller run succeeded")
		}
		used := map[string][]string{}
		for _, p := range allPanels(dash.Panels) {
			for _, tg := range p.Targets {
				id := p.Title + " / " + tg.RefID
				// The installer serves its metrics, not the controller.
				ofController := !strings.Contains(tg.Expr, installerMetricsPrefix)
				if ofController && len(panelData[id]) == 0 {
					t.Errorf("panel %q query %s returned no data in any run of the controller\n  expr: %s", p.Title, tg.RefID, tg.Expr)
				} else if ofController {
					t.Logf("panel %q query %s: data in runs %v", p.Title, tg.RefID, panelData[id])
				}
				use, err := checkQuery(specs, grafanaToPromQL(tg.Expr))
				if err != nil {
					t.Errorf("panel %q: %v", p.Title, err)
				}
				for _, m := range use.Metrics {
					used[m] = append(used[m], "panel "+p.Title)
				}
			}
		}
		groups, errs := parseRuleGroups(t, find(t, buildOverlay(t, "base"), "PrometheusRule", controllerName).Object["spec"])
		if len(errs) > 0 {
			t.Fatal(errs)
		}
		for _, g := range groups.Groups {
			for _, r := range g.Rules {
				use, err := checkQuery(specs, r.Expr)
				if err != nil {
					t.Error(err)
				}
				for _, m := range use.Metrics {
					used[m] = append(used[m], "alert "+r.Alert)
				}
			}
		}
		var names []string
		for m := range used {
			names = append(names, m)
		}
		sort.Strings(names)
		for _, m := range names {
			if !strings.HasPrefix(m, installerMetricsPrefix) && !isExported(exported, m) {
				t.Errorf("%s (used by %s) is not exported by the running controller", m, strings.Join(used[m], ", "))
			}
		}
		t.Logf("%d metrics used by the dashboard and alerts, all exported", len(names))
	})
}

// installerMetricsPrefix starts the installer's metrics, which dashboard
// panels and alerts use and the controller does not serve.
const installerMetricsPrefix = "consul_cni_installer_"

// checkBornAtZero: the running controller exports, for the namespace of the
// pods it saw, every action-counting series of its configuration (each
// family and cause it can count, each reason), and skipped_total for every
// reason, whether or not they counted anything.
func checkBornAtZero(t *testing.T, fams map[string]*dto.MetricFamily, ns string, action judge.Action, dryRun bool) {
	t.Helper()
	has := func(name string, want map[string]string) bool {
		f := fams[name]
		if f == nil {
			return false
		}
		for _, m := range f.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			match := len(got) == len(want)
			for k, v := range want {
				match = match && got[k] == v
			}
			if match {
				return true
			}
		}
		return false
	}
	for _, fam := range metrics.RepairFamilies(dryRun) {
		causes := []string{""}
		if fam == metrics.PodRepairFailures {
			causes = metrics.FailureCauses(action)
		}
		for _, r := range judge.AllReasons {
			for _, c := range causes {
				want := map[string]string{metrics.LabelNamespace: ns, metrics.LabelAction: string(action), metrics.LabelReason: string(r)}
				if c != "" {
					want[metrics.LabelCause] = c
				}
				if !has(fam, want) {
					t.Errorf("%s%v is not exported", fam, want)
				}
			}
		}
	}
	for _, r := range metrics.AllSkipReasons {
		if !has(metrics.Skipped, map[string]string{metrics.LabelReason: r}) {
			t.Errorf("%s{reason=%s} is not exported", metrics.Skipped, r)
		}
	}
}

// outcomes is what the controller did or, in audit mode, decided for the
// pods of ns: pod_repairs_total and dry_run_pod_repairs_total.
func outcomes(fams map[string]*dto.MetricFamily, ns string) float64 {
	return counterSum(fams[metrics.PodRepairs], map[string]string{"namespace": ns}) +
		counterSum(fams[metrics.DryRunPodRepairs], map[string]string{"namespace": ns})
}

// gaugeValue is the value of a family's only gauge series (-1 without one).
func gaugeValue(f *dto.MetricFamily) float64 {
	if f == nil || len(f.GetMetric()) != 1 {
		return -1
	}
	return f.GetMetric()[0].GetGauge().GetValue()
}

// createInstallerPod creates, bound to node, a pod of the installer
// DaemonSet's template as the overlay objs ships it, deleted at cleanup.
func createInstallerPod(t *testing.T, c *cluster.Cluster, objs []*unstructured.Unstructured, name, node string) *corev1.Pod {
	t.Helper()
	var ds appsv1.DaemonSet
	decodeStrict(t, find(t, objs, "DaemonSet", installerName), &ds)
	inst := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: ds.Spec.Template.Labels},
		Spec:       *ds.Spec.Template.Spec.DeepCopy(),
	}
	inst.Spec.NodeName = node
	inst, err := c.Client.CoreV1().Pods(namespace).Create(context.Background(), inst, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Client.CoreV1().Pods(namespace).Delete(context.Background(), inst.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))})
	})
	return inst
}
