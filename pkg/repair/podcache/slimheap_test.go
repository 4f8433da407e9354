package podcache

import (
	"encoding/json"
	"fmt"
	"runtime"
	"testing"
	"time"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge/judgetest"
)

// BenchmarkSlimPodHeap prints the heap a cached injected pod holds after
// the informer's transform: 20,000 meshed pods of one Deployment, decoded
// from JSON as the informer receives them (every string its own
// allocation), slimmed, the decoded originals dropped. It measures the
// transform's output only; `make bench-repair` measures the whole process.
func BenchmarkSlimPodHeap(b *testing.B) {
	const n = 20000
	raw := make([][]byte, n)
	for i := range raw {
		p := judgetest.Pod(judgetest.WithStatus("complete"), judgetest.SandboxAt(-time.Hour), judgetest.AppliedAt(-time.Hour),
			judgetest.StartedApp(-time.Hour), judgetest.StatusWritten("consul-cni", -time.Hour), judgetest.InNamespace("web-shop"),
			judgetest.OnNode(fmt.Sprintf("ip-10-0-%d-%d.ec2.internal", i%50/10, i%50)))
		p.Name = fmt.Sprintf("web-5d8f7c9b6-%05d", i)
		p.UID = types.UID(fmt.Sprintf("0b6c2f0e-6a4e-4d1c-9b1e-%012d", i))
		p.OwnerReferences[0].Name = "web-5d8f7c9b6"
		var err error
		if raw[i], err = json.Marshal(p); err != nil {
			b.Fatal(err)
		}
	}
	var perPod float64
	for iter := 0; iter < b.N; iter++ {
		kept := make([]interface{}, n)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for i := range raw {
			var p corev1.Pod
			if err := json.Unmarshal(raw[i], &p); err != nil {
				b.Fatal(err)
			}
			s, err := cacheDefault(&p)
			if err != nil {
				b.Fatal(err)
			}
			kept[i] = s
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		// The slice of n interfaces is the benchmark's, not the cache's.
		perPod = float64(after.HeapAlloc-before.HeapAlloc)/n - 16
		runtime.KeepAlive(kept)
	}
	b.ReportMetric(perPod, "heap-B/pod")
	fmt.Printf("slim injected pod: %.0f B of heap per cached pod (transform output only)\n", perPod)
}

// Two pods decoded apart (each string its own allocation) share, once
// slimmed, one copy of the values many pods carry: namespace, node, owner,
// manager, marker values. Fails when the transform keeps the decoded copies.
func TestSlimPodsShareCommonStrings(t *testing.T) {
	decode := func(name string) *corev1.Pod {
		p := judgetest.Pod(judgetest.WithStatus("complete"), judgetest.AppliedAt(-time.Hour), judgetest.StatusWritten("consul-cni", -time.Hour))
		p.Name = name
		raw, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		var out corev1.Pod
		if err := json.Unmarshal(raw, &out); err != nil {
			t.Fatal(err)
		}
		s, err := slimDefault(&out)
		if err != nil {
			t.Fatal(err)
		}
		return s.(*corev1.Pod)
	}
	a, b := decode("web-1"), decode("web-2")
	same := func(what, x, y string) {
		if x == "" || unsafe.StringData(x) != unsafe.StringData(y) {
			t.Errorf("%s %q: two copies, want one shared", what, x)
		}
	}
	same("namespace", a.Namespace, b.Namespace)
	same("node", a.Spec.NodeName, b.Spec.NodeName)
	same("owner name", a.OwnerReferences[0].Name, b.OwnerReferences[0].Name)
	same("owner kind", a.OwnerReferences[0].Kind, b.OwnerReferences[0].Kind)
	same("owner UID", string(a.OwnerReferences[0].UID), string(b.OwnerReferences[0].UID))
	same("status annotation", a.Annotations[annotations.KeyTransparentProxyStatus], b.Annotations[annotations.KeyTransparentProxyStatus])
	if len(a.ManagedFields) != 1 || len(b.ManagedFields) != 1 {
		t.Fatalf("managed fields %v, %v: want the status annotation's entry", a.ManagedFields, b.ManagedFields)
	}
	same("manager", a.ManagedFields[0].Manager, b.ManagedFields[0].Manager)
	if a.Name == b.Name || unsafe.StringData(a.Name) == unsafe.StringData(b.Name) {
		t.Errorf("names %q, %q: each pod keeps its own", a.Name, b.Name)
	}
}
