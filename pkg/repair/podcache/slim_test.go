package podcache

import (
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge/judgetest"
)

func TestSlimInjectedPodDropsWhatIsNotRead(t *testing.T) {
	p := judgetest.Pod(judgetest.SandboxAt(-time.Hour), judgetest.WithAnnotation("kubectl.kubernetes.io/last-applied-configuration", "{big}"))
	p.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}
	p.Spec.Containers = []corev1.Container{{Name: "app", Image: "nginx", Env: []corev1.EnvVar{{Name: "A", Value: "B"}}}}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{
		{Name: "app", Image: "nginx", ImageID: "sha", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Message: "long log", StartedAt: judgetest.At(-time.Minute)}}},
		{Name: "envoy", Image: "envoy", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: judgetest.At(-2 * time.Minute)}}},
	}
	p.Status.InitContainerStatuses = []corev1.ContainerStatus{
		{Name: "other-init", Image: "x", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, StartedAt: judgetest.At(-3 * time.Minute)}}},
		{Name: annotations.InitContainerName + "-web", Image: "y", RestartCount: 2, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "m"}},
			LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 88, Message: "not redirected", StartedAt: judgetest.At(-time.Minute), FinishedAt: judgetest.At(-time.Minute)}}},
	}
	p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionFalse, Message: "x"})
	o, err := slimDefault(p)
	if err != nil {
		t.Fatal(err)
	}
	s := o.(*corev1.Pod)
	if s.ManagedFields != nil || s.Spec.Containers != nil || s.Annotations["kubectl.kubernetes.io/last-applied-configuration"] != "" || s.Labels["app"] != "" {
		t.Errorf("kept data the controller never reads: %+v", s)
	}
	// The check init container is kept (exit code, no message); every other
	// container is summed up in one status: started, earliest start time.
	if len(s.Status.InitContainerStatuses) != 1 {
		t.Fatalf("init statuses: %+v", s.Status.InitContainerStatuses)
	}
	if ic := s.Status.InitContainerStatuses[0]; ic.Image != "" || ic.RestartCount != 2 || ic.LastTerminationState.Terminated.ExitCode != 88 || ic.LastTerminationState.Terminated.Message != "" || ic.State.Waiting == nil {
		t.Errorf("check init status not slimmed right: %+v", ic)
	}
	if len(s.Status.ContainerStatuses) != 1 || s.Status.ContainerStatuses[0].State.Running == nil || !s.Status.ContainerStatuses[0].State.Running.StartedAt.Equal(ptrTime(judgetest.At(-3*time.Minute))) {
		t.Errorf("container summary: %+v", s.Status.ContainerStatuses)
	}
	if len(s.Status.Conditions) != 1 || s.Status.Conditions[0].Type != corev1.PodReadyToStartContainers {
		t.Errorf("conditions: %+v", s.Status.Conditions)
	}
	if st, _ := judge.SandboxTime(s); !st.Equal(judgetest.T0.Add(-time.Hour)) {
		t.Errorf("sandbox time on the slim pod: %s", st)
	}
	if s.UID != p.UID || s.ResourceVersion != p.ResourceVersion || metav1.GetControllerOf(s) == nil || s.Spec.NodeName != "n1" || s.Annotations[annotations.KeyTransparentProxyStatus] != "enabled" {
		t.Errorf("lost data the controller reads: %+v", s)
	}
	if p.ManagedFields == nil || p.Spec.Containers == nil {
		t.Error("the input object was modified")
	}
	// Tombstones pass through.
	if o, _ := slimDefault("x"); o != "x" {
		t.Error("non-pod not passed through")
	}
}

// Of the managed fields, the slim pod keeps exactly one entry: the time and
// manager of the latest entry that owns the status annotation, naming only
// that field (signal C for consul-k8s's plugin); none when no entry owns it.
func TestSlimKeepsOnlyTheEntryOwningTheStatus(t *testing.T) {
	const labels = `{"f:metadata":{"f:labels":{"f:app":{}}},"f:spec":{"f:containers":{}}}`
	p := judgetest.Pod(judgetest.WithStatus("complete"), judgetest.SandboxAt(-time.Hour),
		judgetest.ManagedFields("kube-controller-manager", -3*time.Hour, labels),
		judgetest.StatusWritten("kubectl-annotate", -2*time.Hour),
		judgetest.ManagedFields("consul-cni", -90*time.Minute, `{"f:metadata":{"f:annotations":{"f:`+annotations.KeyTransparentProxyStatus+`":{},"f:other":{}}}}`),
		judgetest.ManagedFields("kubelet", -time.Minute, `{"f:status":{"f:conditions":{}}}`))
	o, err := slimDefault(p)
	if err != nil {
		t.Fatal(err)
	}
	s := o.(*corev1.Pod)
	if len(s.ManagedFields) != 1 {
		t.Fatalf("kept %d managed fields entries, want 1: %+v", len(s.ManagedFields), s.ManagedFields)
	}
	e := s.ManagedFields[0]
	if e.Manager != "consul-cni" || e.Time == nil || !e.Time.Equal(ptrTime(judgetest.At(-90*time.Minute))) || e.FieldsV1 == nil ||
		string(e.FieldsV1.Raw) != `{"f:metadata":{"f:annotations":{"f:`+annotations.KeyTransparentProxyStatus+`":{}}}}` {
		t.Errorf("kept entry: %+v (fields %s)", e, e.FieldsV1)
	}
	if at, m, ok := judge.StatusWrittenAt(s); !ok || m != "consul-cni" || !at.Equal(judgetest.T0.Add(-90*time.Minute)) {
		t.Errorf("status written on the slim pod: %s by %q (%v)", at, m, ok)
	}
	if len(p.ManagedFields) != 4 {
		t.Error("the input object was modified")
	}
	none := judgetest.Pod(judgetest.WithStatus("complete"), judgetest.ManagedFields("kube-controller-manager", -3*time.Hour, labels))
	if o, _ := slimDefault(none); o.(*corev1.Pod).ManagedFields != nil {
		t.Errorf("kept entries that do not own the status: %+v", o.(*corev1.Pod).ManagedFields)
	}
}

func ptrTime(t metav1.Time) *metav1.Time { return &t }

func TestSlimSharesIdenticalMarkerMaps(t *testing.T) {
	a, _ := slimDefault(judgetest.Pod())
	b, _ := slimDefault(judgetest.Pod())
	pa, pb := a.(*corev1.Pod), b.(*corev1.Pod)
	if reflect.ValueOf(pa.Annotations).UnsafePointer() != reflect.ValueOf(pb.Annotations).UnsafePointer() ||
		reflect.ValueOf(pa.Labels).UnsafePointer() != reflect.ValueOf(pb.Labels).UnsafePointer() {
		t.Error("identical markers are not shared")
	}
	c, _ := slimDefault(judgetest.Pod(judgetest.WithStatus("complete")))
	if pc := c.(*corev1.Pod); pc.Annotations[annotations.KeyTransparentProxyStatus] != "complete" || pa.Annotations[annotations.KeyTransparentProxyStatus] != "enabled" {
		t.Error("different markers were shared")
	}
	// Unique values (mirror hashes, cni-applied-at times) never enter the
	// table: common marker sets seen after them are still shared.
	interned.mu.Lock()
	before := len(interned.m)
	interned.mu.Unlock()
	for i := 0; i < 3*maxInterned; i++ {
		_, _ = slimDefault(judgetest.Pod(judgetest.WithAnnotation(annotations.KeyConfigMirror, time.Duration(i).String())))
		_, _ = slimDefault(judgetest.Pod(judgetest.WithStatus("complete"), judgetest.AppliedAt(time.Duration(i)*time.Second)))
	}
	interned.mu.Lock()
	n := len(interned.m)
	interned.mu.Unlock()
	if n > maxInterned || n != before {
		t.Fatalf("intern table has %d entries, %d before the unique values", n, before)
	}
	d, _ := slimDefault(judgetest.Pod(judgetest.WithStatus("waiting")))
	e, _ := slimDefault(judgetest.Pod(judgetest.WithStatus("waiting")))
	if reflect.ValueOf(d.(*corev1.Pod).Annotations).UnsafePointer() != reflect.ValueOf(e.(*corev1.Pod).Annotations).UnsafePointer() {
		t.Error("a common marker set seen after unique ones is not shared")
	}
}

// slimDefault is the injected-pod transform with the default init container
// names.
// cacheDefault is the injected-pod informer's transform with the default
// settings: what the cache holds.
func cacheDefault(obj interface{}) (interface{}, error) {
	return InjectedPodTransform(judge.DefaultConfig().InitContainerNames)(obj)
}

// slimDefault is what a reader of the cache gets for obj: the informer's
// transform, read back through PodOf (a pod when the cache holds one).
func slimDefault(obj interface{}) (interface{}, error) {
	o, err := cacheDefault(obj)
	if p, ok := PodOf(o); ok && err == nil {
		return p, nil
	}
	return o, err
}

// Detection gives the same verdict on the slimmed object the informer
// caches as on the pod itself, for every pod of the detector's matrix.
func TestDetectionSameOnSlimPods(t *testing.T) {
	for _, tc := range judgetest.DetectMatrix() {
		t.Run(tc.Name, func(t *testing.T) {
			d := tc.Detector()
			slim, _ := slimDefault(tc.Pod)
			want, got := d.Detect(tc.Pod, judgetest.T0), d.Detect(slim.(*corev1.Pod), judgetest.T0)
			if got.Broken != want.Broken || got.Reason != want.Reason || !got.Since.Equal(want.Since) ||
				!got.RecheckAt.Equal(want.RecheckAt) || got.Ignored != want.Ignored || got.Detail != want.Detail {
				t.Fatalf("slim pod: %+v, pod: %+v", got, want)
			}
		})
	}
}

// The cache's compact form reads back as exactly the slim pod it was made
// from, for every pod of the detector's matrix and the slim tests' pods:
// whatever the detector, the gate, the breaker and the actions read of a
// cached pod is what slimInjectedPod kept.
func TestCachedPodReadsBackAsTheSlimPod(t *testing.T) {
	names := judge.DefaultConfig().InitContainerNames
	pods := []*corev1.Pod{judgetest.Pod(judgetest.WithStatus("complete"), judgetest.SandboxAt(-time.Hour),
		judgetest.AppliedAt(-time.Hour), judgetest.StartedApp(-time.Hour), judgetest.StatusWritten("consul-cni", -time.Hour),
		judgetest.WithAnnotation(annotations.KeyConfigMirror, "hash"))}
	for _, tc := range judgetest.DetectMatrix() {
		pods = append(pods, tc.Pod)
	}
	for _, tc := range judgetest.VerifiedMatrix() {
		pods = append(pods, tc.Pod)
	}
	// One buffer for every pod, as a pass over the cache reads them.
	var buf Buffer
	for _, p := range pods {
		want, _ := slimInjectedPod(p, names)
		c, _ := cacheDefault(p)
		if _, ok := c.(*cachedPod); !ok {
			t.Fatalf("pod %s cached as %T, want its compact form", p.Name, c)
		}
		got, _ := PodOf(c)
		if !apiequality.Semantic.DeepEqual(got, want) {
			t.Errorf("pod %s read back from the cache:\n%+v\nwant the slim pod\n%+v", p.Name, got, want)
		}
		if again, _ := PodIn(c, &buf); !apiequality.Semantic.DeepEqual(again, want) {
			t.Errorf("pod %s read back into a used buffer:\n%+v\nwant the slim pod\n%+v", p.Name, again, want)
		}
		if m, _ := c.(*cachedPod).GetObjectMeta().(*metav1.ObjectMeta); m.Name != p.Name || m.Namespace != p.Namespace || m.UID != p.UID {
			t.Errorf("pod %s keyed as %s/%s %s", p.Name, m.Namespace, m.Name, m.UID)
		}
	}
}

// A pod with a time the compact form cannot hold (before 1678) is cached as
// the slim pod itself: nothing read is ever changed.
func TestPodWithATimeOutOfRangeIsCachedSlim(t *testing.T) {
	p := judgetest.Pod(judgetest.SandboxAt(-time.Hour))
	p.CreationTimestamp = metav1.NewTime(time.Date(1600, 1, 1, 0, 0, 0, 0, time.UTC))
	c, _ := cacheDefault(p)
	got, ok := c.(*corev1.Pod)
	if !ok || !got.CreationTimestamp.Equal(&p.CreationTimestamp) {
		t.Fatalf("cached %T %+v, want the slim pod with its creation time", c, c)
	}
}

// The cache keeps the node verifier's pod condition (with its message when
// it is evidence against the pod) and its Node condition's heartbeat.
func TestSlimCacheKeepsTheVerifiersConditions(t *testing.T) {
	p := judgetest.Pod(judgetest.SandboxAt(-time.Minute), judgetest.Verified(corev1.ConditionFalse, annotations.ReasonRulesMissing, -time.Second))
	p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionFalse})
	s, _ := slimDefault(p)
	got := s.(*corev1.Pod).Status.Conditions
	if len(got) != 2 || got[1].Type != annotations.ConditionRedirectVerified || got[1].LastProbeTime.IsZero() || got[1].Message == "" {
		t.Fatalf("slim conditions: %+v", got)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{
		Type: annotations.NodeConditionCNIVerified, Status: corev1.ConditionFalse, Reason: annotations.ReasonPodsUnredirected,
		LastHeartbeatTime: judgetest.At(-time.Second), Message: "1 without"}}}}
	n, _ := NodeTransform(node)
	if hb, ok := judge.NodeVerifierHeartbeat(n.(*corev1.Node)); !ok || !hb.Equal(judgetest.T0.Add(-time.Second)) {
		t.Fatalf("slim node heartbeat %v %v", hb, ok)
	}
}
