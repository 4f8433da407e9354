//go:build integration

package repair_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
)

// The benchmarks run the real `repair` binary as its own process against the
// local control plane, rate limit lifted, and report what an operator would
// measure: seconds from a pod turning broken (its status write sent) to the
// controller's eviction being visible in a watch, actions per second, and
// the controller's resident memory with many injected pods cached.
//
//	make bench-repair   (go test -tags integration -run '^$' -bench Repair -benchtime 1x ./pkg/repair)
//
// Two latencies are printed per burst: from the status write being sent
// (which includes the control plane's queueing of the burst's own writes)
// and from the broken status being visible in a watch (the write committed,
// as the controller's informer receives it) to the eviction being visible.
//
// REPAIR_BENCH_WORKERS sets the controller's --workers (default 16);
// REPAIR_BENCH_V sets the controller's log verbosity (its log file is named
// in the output); REPAIR_BENCH_HEAP_PROFILE=<file> saves a heap profile of
// the controller after the RSS measurement.

func BenchmarkRepairBurst100(b *testing.B)  { benchBurst(b, 100) }
func BenchmarkRepairBurst1000(b *testing.B) { benchBurst(b, 1000) }

// BenchmarkRepairEvictionCeiling1000 is the reference for the bursts: the
// same 1,000 evictions sent straight from the benchmark with 16 concurrent
// clients, no controller involved: what this control plane on this machine
// can do at the moment.
func BenchmarkRepairEvictionCeiling1000(b *testing.B) {
	const n = 1000
	c := cluster.Shared(b)
	client := adminClient(b, c)
	var rates []float64
	for iter := 0; iter < b.N; iter++ {
		ns := c.Namespace(b)
		node := createNode(b, c, true)
		createPods(b, client, ns, node, n)
		b.ResetTimer()
		start := time.Now()
		parallelOrFatal(b, n, 16, func(i int) error {
			return client.PolicyV1().Evictions(ns).Evict(context.Background(), &policyv1.Eviction{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%05d", i), Namespace: ns}})
		})
		b.StopTimer()
		rates = append(rates, n/time.Since(start).Seconds())
	}
	b.ReportMetric(mean(rates), "evictions/s")
	fmt.Printf("eviction ceiling: %d evictions sent directly by 16 clients: %.0f evictions/s\n", n, mean(rates))
}

// BenchmarkRepairRSS10000 runs last: deleting its 10,000 pods keeps the
// control plane busy for a while.
func BenchmarkRepairRSS10000(b *testing.B) { benchRSS(b, 10000) }

// BenchmarkRepairRSS100000 is the row of a large cluster: 100,000 injected
// pods (creating them takes minutes; REPAIR_BENCH_SKIP_100K=1 leaves it
// out).
func BenchmarkRepairRSS100000(b *testing.B) {
	if os.Getenv("REPAIR_BENCH_SKIP_100K") != "" {
		b.Skip("REPAIR_BENCH_SKIP_100K is set")
	}
	benchRSS(b, 100000)
}

func adminClient(b *testing.B, c *cluster.Cluster) kubernetes.Interface {
	cfg := rest.CopyConfig(c.Config)
	cfg.QPS, cfg.Burst = 5000, 5000
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	return kubernetes.NewForConfigOrDie(cfg)
}

func freeAddr(b *testing.B) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

type controllerProc struct {
	cmd     *exec.Cmd
	metrics string
	health  string
}

// startProcess runs the repair binary watching the pods labelled for ns.
func startProcess(b *testing.B, c *cluster.Cluster, ns string) *controllerProc {
	b.Helper()
	bin := testbin.Project(b, "repair")
	p := &controllerProc{metrics: freeAddr(b), health: freeAddr(b)}
	logPath := filepath.Join(os.TempDir(), "repair-bench-"+ns+".log")
	log, err := os.Create(logPath)
	if err != nil {
		b.Fatal(err)
	}
	p.cmd = exec.Command(bin,
		"--kubeconfig="+c.Kubeconfig,
		"--leader-elect=false", "--node-readiness=false",
		"--injected-pod-selector="+annotations.KeyInjectStatus+"="+annotations.InjectStatusInjected+","+testLabel+"="+ns,
		"--max-repairs-per-minute=100000000", "--max-repairs-per-node-per-minute=100000000",
		"--circuit-breaker=false", "--workers="+envOr("REPAIR_BENCH_WORKERS", "16"), "--kube-api-qps=5000", "--kube-api-burst=5000",
		"--profiling", "--metrics-bind-address="+p.metrics, "--health-probe-bind-address="+p.health, "-v="+envOr("REPAIR_BENCH_V", "0"))
	p.cmd.Stdout, p.cmd.Stderr = log, log
	if err := p.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Logf("controller log: %s", logPath)
	b.Cleanup(func() {
		_ = p.cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = p.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-done
		}
	})
	poll.Eventually(b, waitTimeout, "controller /readyz", func() (bool, error) {
		resp, err := http.Get("http://" + p.health + "/readyz")
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		return resp.StatusCode == 200, nil
	})
	return p
}

// metric returns the value of the first sample whose line starts with prefix.
func (p *controllerProc) metric(prefix string) float64 {
	resp, err := http.Get("http://" + p.metrics + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, prefix) {
			f := strings.Fields(l)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			return v
		}
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return -1
}

func (p *controllerProc) rssMiB() float64 { return p.status("VmRSS:") }

// status reads a kB field of /proc/<pid>/status in MiB.
func (p *controllerProc) status(field string) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, field) {
			kb, _ := strconv.ParseFloat(strings.Fields(l)[1], 64)
			return kb / 1024
		}
	}
	return -1
}

// benchPod is an injected pod as the webhook leaves it (two containers with
// env, resources, probes, volumes: what the informer transform strips),
// bound to node and owned by a controller (a ConfigMap stands in for the
// owner, so that kube-controller-manager neither adopts nor collects it).
func benchPod(ns, name, node string, owner *corev1.ConfigMap) *corev1.Pod {
	t := injectedPodTemplate(ns, "bench", node)
	yes := true
	res := corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")}}
	env := []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
		{Name: "CONSUL_ADDRESSES", Value: "consul-server.consul.svc"}, {Name: "CONSUL_GRPC_PORT", Value: "8502"}, {Name: "CONSUL_HTTP_PORT", Value: "8501"}}
	probe := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intOrStr(20000)}}, PeriodSeconds: 10}
	t.Spec.InitContainers[0].Env = env
	t.Spec.InitContainers[0].Command = []string{"/bin/sh", "-ec", "consul-k8s-control-plane connect-init -pod-name=${POD_NAME} -pod-namespace=" + ns + " -log-level=info -log-json=false"}
	t.Spec.Containers = []corev1.Container{
		{Name: "app", Image: "registry.invalid/app:1", Resources: res, Env: env, ReadinessProbe: probe,
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}, VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}},
		{Name: "consul-dataplane", Image: "registry.invalid/consul-dataplane:1.6", Resources: res, Env: env, ReadinessProbe: probe,
			Args:         []string{"-addresses", "consul-server.consul.svc", "-grpc-port=8502", "-proxy-service-id-path=/consul/connect-inject/proxyid", "-log-level=info", "-tls-disabled", "-envoy-admin-bind-port=19000"},
			VolumeMounts: []corev1.VolumeMount{{Name: "consul-connect-inject-data", MountPath: "/consul/connect-inject"}}},
	}
	t.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		{Name: "consul-connect-inject-data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}}}
	t.Annotations["consul.hashicorp.com/connect-service"] = "bench"
	t.Annotations[annotations.KeyRedirectTrafficConfig] = `{"ConsulDNSIP":"127.0.0.1","ConsulDNSPort":8600,"ProxyUserID":"5995","ProxyInboundPort":20000,"ProxyOutboundPort":15001,"ExcludeInboundPorts":["20200","21000"],"ExcludeOutboundPorts":null,"ExcludeOutboundCIDRs":null,"ExcludeUIDs":["5996"],"NetNS":"","IptablesProvider":null}`
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: t.Labels, Annotations: t.Annotations,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID, Controller: &yes}}},
		Spec: t.Spec,
	}
}

func intOrStr(p int32) intstr.IntOrString { return intstr.FromInt32(p) }

// createPods creates n bench pods with 32 concurrent clients.
func createPods(b *testing.B, client kubernetes.Interface, ns, node string, n int) {
	b.Helper()
	owner, err := client.CoreV1().ConfigMaps(ns).Create(context.Background(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "owner"}}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	parallelOrFatal(b, n, 32, func(i int) error {
		_, err := client.CoreV1().Pods(ns).Create(context.Background(), benchPod(ns, fmt.Sprintf("p-%05d", i), node, owner), metav1.CreateOptions{})
		return err
	})
}

// brokenStatus is signal B as a merge patch of the status subresource.
func brokenStatus() []byte {
	now := time.Now().UTC().Format(time.RFC3339)
	return []byte(`{"status":{"phase":"Pending","podIP":"198.18.0.10","startTime":"` + now + `",` +
		`"conditions":[{"type":"PodReadyToStartContainers","status":"True","lastTransitionTime":"` + now + `"}],` +
		`"initContainerStatuses":[{"name":"` + annotations.InitContainerName + `","image":"registry.invalid/consul-k8s-control-plane:1","imageID":"","ready":false,"restartCount":0,` +
		`"state":{"terminated":{"exitCode":88,"reason":"Error","startedAt":"` + now + `","finishedAt":"` + now + `"}},"lastState":{}}]}}`)
}

func benchBurst(b *testing.B, n int) {
	c := cluster.Shared(b)
	client := adminClient(b, c)
	var lat, latSeen []float64
	var rates, windowRates []float64
	var lastCPU, lastInside float64
	for iter := 0; iter < b.N; iter++ {
		ns := c.Namespace(b)
		node := createNode(b, c, true)
		createPods(b, client, ns, node, n)
		p := startProcess(b, c, ns)
		poll.Eventually(b, waitTimeout, "controller to cache the pods", func() (bool, error) {
			return p.metric(`consul_cni_repair_workqueue_adds_total{name="pods"}`) >= float64(n) &&
				p.metric(`consul_cni_repair_workqueue_depth{name="pods"}`) == 0, nil
		})
		// An informer of the bench (not the controller) timestamps each
		// pod's eviction as soon as it is visible.
		acted := map[types.UID]time.Time{}
		// The same informer timestamps when each pod's broken status is
		// visible: the write committed, as the controller's watch gets it.
		seenBroken := map[types.UID]time.Time{}
		var mu sync.Mutex
		doneWatch := make(chan struct{})
		record := func(obj interface{}) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			pod, ok := obj.(*corev1.Pod)
			if !ok {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if _, seen := acted[pod.UID]; !seen {
				acted[pod.UID] = time.Now()
				if len(acted) == n {
					close(doneWatch)
				}
			}
		}
		f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns))
		inf := f.Core().V1().Pods().Informer()
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			UpdateFunc: func(_, obj interface{}) {
				pod := obj.(*corev1.Pod)
				if pod.DeletionTimestamp != nil {
					record(obj)
					return
				}
				if checkFailed(pod) {
					mu.Lock()
					if _, ok := seenBroken[pod.UID]; !ok {
						seenBroken[pod.UID] = time.Now()
					}
					mu.Unlock()
				}
			},
			DeleteFunc: record,
		}); err != nil {
			b.Fatal(err)
		}
		stop := make(chan struct{})
		f.Start(stop)
		f.WaitForCacheSync(stop)
		list, err := f.Core().V1().Pods().Lister().Pods(ns).List(labels.Everything())
		if err != nil || len(list) != n {
			b.Fatalf("bench pods: %d, %v", len(list), err)
		}
		broken := make([]time.Time, n)
		uids := make([]types.UID, n)
		for i := range list {
			uids[i] = list[i].UID
		}
		b.ResetTimer()
		start := time.Now()
		parallelOrFatal(b, n, 64, func(i int) error {
			broken[i] = time.Now()
			_, err := client.CoreV1().Pods(ns).Patch(context.Background(), list[i].Name, types.MergePatchType, brokenStatus(), metav1.PatchOptions{}, "status")
			return err
		})
		select {
		case <-doneWatch:
		case <-time.After(5 * time.Minute):
			mu.Lock()
			k := len(acted)
			mu.Unlock()
			b.Fatalf("only %d of %d pods acted on after 5 minutes", k, n)
		}
		close(stop)
		f.Shutdown()
		b.StopTimer()
		var first, last time.Time
		mu.Lock()
		for i := range uids {
			t := acted[uids[i]]
			lat = append(lat, t.Sub(broken[i]).Seconds())
			if seen, ok := seenBroken[uids[i]]; ok {
				latSeen = append(latSeen, t.Sub(seen).Seconds())
			}
			if first.IsZero() || t.Before(first) {
				first = t
			}
			if t.After(last) {
				last = t
			}
		}
		mu.Unlock()
		lastCPU = p.metric("process_cpu_seconds_total")
		lastInside = p.metric(`consul_cni_repair_detection_to_action_seconds_sum{action="evict"}`) / p.metric(`consul_cni_repair_detection_to_action_seconds_count{action="evict"}`)
		rates = append(rates, float64(n)/last.Sub(start).Seconds())
		windowRates = append(windowRates, float64(n)/last.Sub(first).Seconds())
		// The watch can see an eviction before the controller's call
		// returns and is counted.
		poll.Eventually(b, waitTimeout, "the controller to count every eviction", func() (bool, error) {
			got := p.metric(`consul_cni_repair_pod_repairs_total{action="evict",namespace="` + ns + `",reason="init_check_failed"}`)
			if got > float64(n) {
				return false, fmt.Errorf("controller counted %v evictions for %d pods", got, n)
			}
			return got == float64(n), nil
		})
	}
	sort.Float64s(lat)
	sort.Float64s(latSeen)
	p50, p99 := quantile(lat, 0.5), quantile(lat, 0.99)
	seen50, seen99 := quantile(latSeen, 0.5), quantile(latSeen, 0.99)
	rate, window := mean(rates), mean(windowRates)
	b.ReportMetric(p50, "p50-s")
	b.ReportMetric(p99, "p99-s")
	b.ReportMetric(seen99, "p99-from-commit-s")
	b.ReportMetric(rate, "actions/s")
	fmt.Printf("controller: CPU time %.1f s in all; mean %.3f s from seeing a pod broken to its eviction call returning\n", lastCPU, lastInside)
	fmt.Printf("repair burst of %d broken pods: broken->eviction median %.3f s, p99 %.3f s, max %.3f s; %.0f actions/s from the first status write to the last eviction (%.0f/s between first and last eviction)\n",
		n, p50, p99, lat[len(lat)-1], rate, window)
	fmt.Printf("repair burst of %d broken pods: broken status visible in a watch->eviction visible: median %.3f s, p99 %.3f s (%d of %d pods seen broken before their eviction)\n",
		n, seen50, seen99, len(latSeen), n)
}

// checkFailed: the pod's check init container terminated with the exit
// code of signal B (the status brokenStatus writes).
func checkFailed(pod *corev1.Pod) bool {
	for _, st := range pod.Status.InitContainerStatuses {
		if st.Name == annotations.InitContainerName && st.State.Terminated != nil && st.State.Terminated.ExitCode == annotations.InitCheckExitCode {
			return true
		}
	}
	return false
}

func benchRSS(b *testing.B, n int) {
	c := cluster.Shared(b)
	client := adminClient(b, c)
	ns := c.Namespace(b)
	node := createNode(b, c, true)
	start := time.Now()
	createPods(b, client, ns, node, n)
	b.Logf("created %d pods in %s", n, time.Since(start).Round(time.Second))
	var rss, heap, anon, file float64
	var cached time.Duration
	// Built before the clock starts: the time to all cached is the
	// process's, not the compiler's.
	testbin.Project(b, "repair")
	for iter := 0; iter < b.N; iter++ {
		b.ResetTimer()
		began := time.Now()
		p := startProcess(b, c, ns)
		poll.Eventually(b, waitTimeout+time.Duration(n/1000)*time.Second, "controller to cache the pods", func() (bool, error) {
			return p.metric(`consul_cni_repair_workqueue_adds_total{name="pods"}`) >= float64(n) &&
				p.metric(`consul_cni_repair_workqueue_depth{name="pods"}`) == 0, nil
		})
		cached = time.Since(began)
		b.StopTimer()
		// Let a scrape or two and the GC settle, then take the peak of a
		// few samples (the figure that matters for a memory limit).
		for i := 0; i < 10; i++ {
			time.Sleep(time.Second)
			if r := p.rssMiB(); r > rss {
				rss, anon, file = r, p.status("RssAnon:"), p.status("RssFile:")
			}
		}
		heap = p.metric("go_memstats_heap_inuse_bytes") / (1 << 20)
		if prof := os.Getenv("REPAIR_BENCH_HEAP_PROFILE"); prof != "" {
			saveURL(b, "http://"+p.metrics+"/debug/pprof/heap?gc=1", prof)
		}
		_ = p.cmd.Process.Signal(os.Interrupt)
	}
	b.ReportMetric(rss, "rss-MiB")
	b.ReportMetric(heap*(1<<20)/float64(n), "heap-B/pod")
	fmt.Printf("repair with %d injected pods cached: RSS %.1f MiB (anonymous %.1f, file-backed %.1f; Go heap in use %.1f MiB, %.0f B per pod with the fixed heap); all cached %.1f s after start\n",
		n, rss, anon, file, heap, heap*(1<<20)/float64(n), cached.Seconds())
}

func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	if i < 0 {
		i = 0
	}
	if i >= len(sorted) {
		i = len(sorted) - 1
	}
	return sorted[i]
}

func mean(v []float64) float64 {
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func saveURL(b *testing.B, url, path string) {
	resp, err := http.Get(url)
	if err != nil {
		b.Log(err)
		return
	}
	defer resp.Body.Close()
	f, err := os.Create(path)
	if err != nil {
		b.Log(err)
		return
	}
	defer f.Close()
	_, _ = io.Copy(f, resp.Body)
}

func parallelOrFatal(b *testing.B, n, workers int, f func(i int) error) {
	b.Helper()
	if err := cluster.Parallel(n, workers, f); err != nil {
		b.Fatal(err)
	}
}
