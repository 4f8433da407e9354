package repair

import (
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
)

func TestDetectMatrix(t *testing.T) {
	d := Detector{InitContainerNames: defaultInitContainerNames, InitExitCode: 88, MinPodAge: 30 * time.Second, SandboxSlack: defaultSandboxSlack}
	slack := defaultSandboxSlack
	now := t0
	yes := true
	// A check init container that failed 5 s ago, its sandbox 10 s old:
	// too young for signal A, so only signal B can make such a pod broken.
	failedCheck := func(name string) podOpt {
		return initStatus(corev1.ContainerStatus{Name: name, State: corev1.ContainerState{Terminated: terminated(88, -10*time.Second, -5*time.Second)}})
	}
	young := sandboxAt(-10 * time.Second)
	crashLoop := func(name string, last int32) podOpt {
		return initStatus(corev1.ContainerStatus{
			Name:                 name,
			RestartCount:         3,
			State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "Back-off 5m0s"}},
			LastTerminationState: corev1.ContainerState{Terminated: terminated(last, -10*time.Second, -5*time.Second)},
		})
	}

	tests := []struct {
		name   string
		pod    *corev1.Pod
		broken bool
		reason Reason
		since  time.Time
		// recheck: signal A will fire later without any change
		recheck time.Time
		// code overrides the configured exit code
		code int32
	}{
		// --- never broken ---
		{name: "not injected", pod: mkPod(withoutLabel(annotations.KeyInjectStatus), withoutAnnotation(annotations.KeyInjectStatus), sandboxAt(-time.Hour), failedCheck(annotations.InitContainerName))},
		{name: "injected, transparent proxy off (no status annotation)", pod: mkPod(withoutAnnotation(annotations.KeyTransparentProxyStatus), sandboxAt(-time.Hour), failedCheck(annotations.InitContainerName))},
		{name: "status complete, even with a failed check", pod: mkPod(withStatus("complete"), sandboxAt(-time.Hour), failedCheck(annotations.InitContainerName))},
		{name: "status completed (accepted spelling)", pod: mkPod(withStatus("completed"), sandboxAt(-time.Hour))},
		{name: "unknown status value", pod: mkPod(withStatus("disabled"), sandboxAt(-time.Hour), failedCheck(annotations.InitContainerName))},
		{name: "being deleted", pod: mkPod(sandboxAt(-time.Hour), failedCheck(annotations.InitContainerName), func(p *corev1.Pod) { ts := at(-time.Second); p.DeletionTimestamp = &ts })},
		{name: "mirror pod (annotation)", pod: mkPod(withAnnotation(annotations.KeyConfigMirror, "abc"), sandboxAt(-time.Hour), failedCheck(annotations.InitContainerName))},
		{name: "static pod owned by its Node", pod: mkPod(sandboxAt(-time.Hour), failedCheck(annotations.InitContainerName), func(p *corev1.Pod) {
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: "n1", Controller: &yes}}
		})},
		{name: "host network (CNI never called)", pod: mkPod(sandboxAt(-time.Hour), func(p *corev1.Pod) { p.Spec.HostNetwork = true })},
		{name: "A: no sandbox yet (Pending, no IP, nothing started)", pod: mkPod()},
		{name: "A: sandbox younger than min age", pod: mkPod(sandboxAt(-10 * time.Second)), recheck: t0.Add(20 * time.Second)},
		{name: "A: pod IP only, start time 10s ago", pod: mkPod(func(p *corev1.Pod) {
			p.Status.PodIP = "10.0.0.9"
			st := at(-10 * time.Second)
			p.Status.StartTime = &st
		}), recheck: t0.Add(20 * time.Second)},
		{name: "B: other exit code", pod: mkPod(young, initStatus(corev1.ContainerStatus{Name: annotations.InitContainerName, State: corev1.ContainerState{Terminated: terminated(1, -10*time.Second, -5*time.Second)}})), recheck: t0.Add(20 * time.Second)},
		{name: "B: exit 88 from a container with another name", pod: mkPod(young, failedCheck("istio-validation")), recheck: t0.Add(20 * time.Second)},
		{name: "B: name prefix without dash does not match", pod: mkPod(young, failedCheck(annotations.InitContainerName+"x")), recheck: t0.Add(20 * time.Second)},
		{name: "B: check succeeded after an earlier failure", pod: mkPod(young, initStatus(corev1.ContainerStatus{
			Name: annotations.InitContainerName, RestartCount: 1,
			State:                corev1.ContainerState{Terminated: terminated(0, -4*time.Second, -3*time.Second)},
			LastTerminationState: corev1.ContainerState{Terminated: terminated(88, -10*time.Second, -5*time.Second)},
		})), recheck: t0.Add(20 * time.Second)},

		// Istio's detectPod validation cases, mapped to ours (126 -> 88,
		// istio-validation -> consul-connect-inject-init, sidecar.istio.io/status -> injected+tproxy).
		{name: "istio: OK pod (check passed)", pod: mkPod(withStatus("complete"), sandboxAt(-time.Hour), initStatus(corev1.ContainerStatus{Name: annotations.InitContainerName, State: corev1.ContainerState{Terminated: terminated(0, -time.Hour, -time.Hour)}}))},
		{name: "istio: working pod that previously died", pod: mkPod(withStatus("complete"), sandboxAt(-time.Hour), initStatus(corev1.ContainerStatus{
			Name: annotations.InitContainerName, State: corev1.ContainerState{Terminated: terminated(0, -time.Hour, -time.Hour)},
			LastTerminationState: corev1.ContainerState{Terminated: terminated(88, -2*time.Hour, -2*time.Hour)},
		}))},
		{name: "istio: broken pod in waiting state", pod: mkPod(young, crashLoop(annotations.InitContainerName, 88)), broken: true, reason: ReasonInitCheckFailed, since: t0.Add(-5 * time.Second)},
		{name: "istio: broken pod, check terminated now", pod: mkPod(young, failedCheck(annotations.InitContainerName)), broken: true, reason: ReasonInitCheckFailed, since: t0.Add(-5 * time.Second)},
		{name: "istio: broken pod with wrong exit code (55 configured)", code: 55, pod: mkPod(young, crashLoop(annotations.InitContainerName, 88)), recheck: t0.Add(20 * time.Second)},
		{name: "istio: broken pod with no sidecar annotation", pod: mkPod(withoutAnnotation(annotations.KeyInjectStatus), withoutLabel(annotations.KeyInjectStatus), young, crashLoop(annotations.InitContainerName, 88))},
		{name: "istio: termination code 121", pod: mkPod(young, crashLoop(annotations.InitContainerName, 121)), recheck: t0.Add(20 * time.Second)},
		{name: "istio: badly formatted pod (empty init status)", pod: mkPod(initStatus(corev1.ContainerStatus{}))},

		// --- broken: signal B ---
		{name: "B: restartPolicy Never, first failure only in State", pod: mkPod(restartNever(), young, failedCheck(annotations.InitContainerName), func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed }), broken: true, reason: ReasonInitCheckFailed, since: t0.Add(-5 * time.Second)},
		{name: "B: running again after a failure", pod: mkPod(young, initStatus(corev1.ContainerStatus{
			Name: annotations.InitContainerName, RestartCount: 1,
			State:                corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: at(-time.Second)}},
			LastTerminationState: corev1.ContainerState{Terminated: terminated(88, -10*time.Second, -5*time.Second)},
		})), broken: true, reason: ReasonInitCheckFailed, since: t0.Add(-5 * time.Second)},
		{name: "B: multi-port consul-connect-inject-init-<service>", pod: mkPod(young, failedCheck(annotations.InitContainerName+"-web")), broken: true, reason: ReasonInitCheckFailed, since: t0.Add(-5 * time.Second)},
		{name: "B: consul-cni-check-<service>", pod: mkPod(young, failedCheck(annotations.CheckContainerName+"-api")), broken: true, reason: ReasonInitCheckFailed, since: t0.Add(-5 * time.Second)},
		{name: "B: status waiting", pod: mkPod(withStatus("waiting"), young, failedCheck(annotations.CheckContainerName)), broken: true, reason: ReasonInitCheckFailed, since: t0.Add(-5 * time.Second)},
		{name: "B: injected by annotation only (no label)", pod: mkPod(withoutLabel(annotations.KeyInjectStatus), young, failedCheck(annotations.InitContainerName)), broken: true, reason: ReasonInitCheckFailed, since: t0.Add(-5 * time.Second)},
		{name: "B: mesh-inject-status", pod: mkPod(withoutLabel(annotations.KeyInjectStatus), withoutAnnotation(annotations.KeyInjectStatus), withAnnotation(annotations.KeyMeshInjectStatus, "injected"), young, failedCheck(annotations.InitContainerName)), broken: true, reason: ReasonInitCheckFailed, since: t0.Add(-5 * time.Second)},
		{name: "B wins over A", pod: mkPod(sandboxAt(-time.Hour), failedCheck(annotations.InitContainerName)), broken: true, reason: ReasonInitCheckFailed, since: t0.Add(-5 * time.Second)},
		{name: "B: bare pods are detected too (the action decides)", pod: mkPod(bare(), young, failedCheck(annotations.InitContainerName)), broken: true, reason: ReasonInitCheckFailed, since: t0.Add(-5 * time.Second)},

		// --- finished pods: never broken unless the check failed them ---
		{name: "Succeeded pod with status enabled (a finished Job)", pod: mkPod(sandboxAt(-time.Hour), inPhase(corev1.PodSucceeded))},
		{name: "Succeeded pod whose sandbox was recreated", pod: mkPod(withStatus("complete"), appliedAt(-2*time.Hour), sandboxAt(-time.Hour), inPhase(corev1.PodSucceeded))},
		{name: "Failed pod (kubelet eviction) with status enabled", pod: mkPod(sandboxAt(-time.Hour), inPhase(corev1.PodFailed))},
		{name: "Failed pod, check exited with another code", pod: mkPod(restartNever(), young, inPhase(corev1.PodFailed), initStatus(corev1.ContainerStatus{Name: annotations.InitContainerName, State: corev1.ContainerState{Terminated: terminated(1, -10*time.Second, -5*time.Second)}}))},
		{name: "Failed pod with status complete and a recreated sandbox", pod: mkPod(withStatus("complete"), appliedAt(-2*time.Hour), sandboxAt(-time.Hour), inPhase(corev1.PodFailed))},

		// --- the latest sandbox decides (signal A) ---
		{name: "A: waiting, new sandbox being set up, old IP and container starts kept", pod: mkPod(withStatus("waiting"), sandboxDown(-5*time.Second), startedApp(-time.Hour), func(p *corev1.Pod) { p.Status.PodIP = "10.0.0.7" })},
		{name: "A: latest sandbox 10s old, containers of the earlier one started 1h ago", pod: mkPod(withStatus("waiting"), sandboxAt(-10*time.Second), startedApp(-time.Hour)), recheck: t0.Add(20 * time.Second)},

		// --- signal C: complete, cni-applied-at against the latest sandbox ---
		{name: "C: complete without cni-applied-at (older plugin), sandbox recreated", pod: mkPod(withStatus("complete"), sandboxAt(-time.Minute), startedApp(-time.Hour))},
		{name: "C: first sandbox ready right after the rules", pod: mkPod(withStatus("complete"), appliedAt(-time.Hour), sandboxAt(-time.Hour+time.Second))},
		{name: "C: first sandbox ready exactly the slack after the rules", pod: mkPod(withStatus("complete"), appliedAt(-time.Hour), sandboxAt(-time.Hour+slack))},
		{name: "C: sandbox ready before cni-applied-at (clock rounding)", pod: mkPod(withStatus("complete"), appliedAt(-time.Hour), sandboxAt(-time.Hour-time.Second))},
		{name: "C: sandbox being recreated (condition False)", pod: mkPod(withStatus("complete"), appliedAt(-time.Hour), sandboxDown(-time.Second))},
		{name: "C: no PodReadyToStartContainers condition", pod: mkPod(withStatus("complete"), appliedAt(-time.Hour), startedApp(-time.Minute))},
		{name: "C: cni-applied-at does not parse", pod: mkPod(withStatus("complete"), withAnnotation(annotations.KeyCNIAppliedAt, "yesterday"), sandboxAt(-time.Minute))},
		{name: "C: status enabled with an old cni-applied-at is judged by signal A", pod: mkPod(appliedAt(-2*time.Hour), sandboxAt(-10*time.Second)), recheck: t0.Add(20 * time.Second)},
		{name: "C: sandbox recreated 1h after the rules", pod: mkPod(withStatus("complete"), appliedAt(-2*time.Hour), sandboxAt(-time.Hour)), broken: true, reason: ReasonSandboxRecreated, since: t0.Add(-time.Hour)},
		{name: "C: completed spelling, sandbox just recreated", pod: mkPod(withStatus("completed"), appliedAt(-time.Hour), sandboxAt(0), startedApp(-time.Hour)), broken: true, reason: ReasonSandboxRecreated, since: t0},
		{name: "C: sandbox ready one second beyond the slack", pod: mkPod(withStatus("complete"), appliedAt(-time.Hour), sandboxAt(-time.Hour+slack+time.Second)), broken: true, reason: ReasonSandboxRecreated, since: t0.Add(-time.Hour + slack + time.Second)},
		{name: "C: check failed long ago, sandbox recreated", pod: mkPod(withStatus("complete"), appliedAt(-2*time.Hour), sandboxAt(-time.Minute), failedCheck(annotations.InitContainerName)), broken: true, reason: ReasonSandboxRecreated, since: t0.Add(-time.Minute)},

		// --- broken: signal A ---
		{name: "A: enabled, latest sandbox 31s old, containers of an earlier one", pod: mkPod(sandboxAt(-31*time.Second), startedApp(-time.Hour)), broken: true, reason: ReasonTProxyStatusStuck, since: t0.Add(-time.Second)},
		{name: "A: enabled, sandbox ready 31s ago", pod: mkPod(sandboxAt(-31 * time.Second)), broken: true, reason: ReasonTProxyStatusStuck, since: t0.Add(-time.Second)},
		{name: "A: waiting, sandbox exactly min age", pod: mkPod(withStatus("waiting"), sandboxAt(-30*time.Second)), broken: true, reason: ReasonTProxyStatusStuck, since: t0},
		{name: "A: pod IP only, start time 1m ago", pod: mkPod(func(p *corev1.Pod) { p.Status.PodIP = "10.0.0.9"; st := at(-time.Minute); p.Status.StartTime = &st }), broken: true, reason: ReasonTProxyStatusStuck, since: t0.Add(-30 * time.Second)},
		{name: "A: a container running for 1m, no condition", pod: mkPod(func(p *corev1.Pod) {
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "app", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: at(-time.Minute)}}}}
		}), broken: true, reason: ReasonTProxyStatusStuck, since: t0.Add(-30 * time.Second)},
		{name: "A: check crash-looping with another code, old sandbox", pod: mkPod(sandboxAt(-time.Hour), crashLoop(annotations.InitContainerName, 1)), broken: true, reason: ReasonTProxyStatusStuck, since: t0.Add(-time.Hour + 30*time.Second)},
		{name: "A: restartPolicy Never pod whose check never ran but sandbox is old", pod: mkPod(restartNever(), sandboxAt(-time.Minute)), broken: true, reason: ReasonTProxyStatusStuck, since: t0.Add(-30 * time.Second)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Detection must give the same answer on the slimmed object
			// the informer caches.
			slim, _ := slimDefault(tc.pod)
			d := d
			if tc.code != 0 {
				d.InitExitCode = tc.code
			}
			for _, p := range []*corev1.Pod{tc.pod, slim.(*corev1.Pod)} {
				v := d.Detect(p, now)
				if v.Broken != tc.broken {
					t.Fatalf("broken = %v, want %v (verdict %+v)", v.Broken, tc.broken, v)
				}
				if v.Broken {
					if v.Reason != tc.reason {
						t.Errorf("reason = %s, want %s", v.Reason, tc.reason)
					}
					if !v.Since.Equal(tc.since) {
						t.Errorf("since = %s, want %s", v.Since, tc.since)
					}
					if v.Detail == "" {
						t.Error("empty detail")
					}
				}
				if !v.RecheckAt.Equal(tc.recheck) {
					t.Errorf("recheckAt = %s, want %s", v.RecheckAt, tc.recheck)
				}
			}
		})
	}
}

func TestMatchesInitContainer(t *testing.T) {
	names := []string{"consul-connect-inject-init", "consul-cni-check"}
	for name, want := range map[string]bool{
		"consul-connect-inject-init":      true,
		"consul-connect-inject-init-web":  true,
		"consul-cni-check":                true,
		"consul-cni-check-a":              true,
		"consul-connect-inject-init-":     false,
		"consul-connect-inject-initx":     false,
		"consul-connect-inject":           false,
		"x-consul-connect-inject-init":    false,
		"":                                false,
		"consul-connect-inject-init-a-b2": true,
	} {
		if got := matchesInitContainer(name, names); got != want {
			t.Errorf("%q: got %v want %v", name, got, want)
		}
	}
}

func TestSlimInjectedPodDropsWhatIsNotRead(t *testing.T) {
	p := mkPod(sandboxAt(-time.Hour), withAnnotation("kubectl.kubernetes.io/last-applied-configuration", "{big}"))
	p.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}
	p.Spec.Containers = []corev1.Container{{Name: "app", Image: "nginx", Env: []corev1.EnvVar{{Name: "A", Value: "B"}}}}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{
		{Name: "app", Image: "nginx", ImageID: "sha", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Message: "long log", StartedAt: at(-time.Minute)}}},
		{Name: "envoy", Image: "envoy", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: at(-2 * time.Minute)}}},
	}
	p.Status.InitContainerStatuses = []corev1.ContainerStatus{
		{Name: "other-init", Image: "x", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, StartedAt: at(-3 * time.Minute)}}},
		{Name: annotations.InitContainerName + "-web", Image: "y", RestartCount: 2, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "m"}},
			LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 88, Message: "not redirected", StartedAt: at(-time.Minute), FinishedAt: at(-time.Minute)}}},
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
	if len(s.Status.ContainerStatuses) != 1 || s.Status.ContainerStatuses[0].State.Running == nil || !s.Status.ContainerStatuses[0].State.Running.StartedAt.Equal(ptrTime(at(-3*time.Minute))) {
		t.Errorf("container summary: %+v", s.Status.ContainerStatuses)
	}
	if len(s.Status.Conditions) != 1 || s.Status.Conditions[0].Type != corev1.PodReadyToStartContainers {
		t.Errorf("conditions: %+v", s.Status.Conditions)
	}
	if st, _ := sandboxTime(s); !st.Equal(t0.Add(-time.Hour)) {
		t.Errorf("sandbox time on the slim pod: %s", st)
	}
	if s.UID != p.UID || s.ResourceVersion != p.ResourceVersion || controllerOf(s) == nil || s.Spec.NodeName != "n1" || s.Annotations[annotations.KeyTransparentProxyStatus] != "enabled" {
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

func ptrTime(t metav1.Time) *metav1.Time { return &t }

func TestSlimSharesIdenticalMarkerMaps(t *testing.T) {
	a, _ := slimDefault(mkPod())
	b, _ := slimDefault(mkPod())
	pa, pb := a.(*corev1.Pod), b.(*corev1.Pod)
	if reflect.ValueOf(pa.Annotations).UnsafePointer() != reflect.ValueOf(pb.Annotations).UnsafePointer() ||
		reflect.ValueOf(pa.Labels).UnsafePointer() != reflect.ValueOf(pb.Labels).UnsafePointer() {
		t.Error("identical markers are not shared")
	}
	c, _ := slimDefault(mkPod(withStatus("complete")))
	if pc := c.(*corev1.Pod); pc.Annotations[annotations.KeyTransparentProxyStatus] != "complete" || pa.Annotations[annotations.KeyTransparentProxyStatus] != "enabled" {
		t.Error("different markers were shared")
	}
	// Unique values (mirror hashes, cni-applied-at times) never enter the
	// table: common marker sets seen after them are still shared.
	interned.mu.Lock()
	before := len(interned.m)
	interned.mu.Unlock()
	for i := 0; i < 3*maxInterned; i++ {
		_, _ = slimDefault(mkPod(withAnnotation(annotations.KeyConfigMirror, time.Duration(i).String())))
		_, _ = slimDefault(mkPod(withStatus("complete"), appliedAt(time.Duration(i)*time.Second)))
	}
	interned.mu.Lock()
	n := len(interned.m)
	interned.mu.Unlock()
	if n > maxInterned || n != before {
		t.Fatalf("intern table has %d entries, %d before the unique values", n, before)
	}
	d, _ := slimDefault(mkPod(withStatus("waiting")))
	e, _ := slimDefault(mkPod(withStatus("waiting")))
	if reflect.ValueOf(d.(*corev1.Pod).Annotations).UnsafePointer() != reflect.ValueOf(e.(*corev1.Pod).Annotations).UnsafePointer() {
		t.Error("a common marker set seen after unique ones is not shared")
	}
}

// slimDefault is the injected-pod transform with the default init container
// names.
func slimDefault(obj interface{}) (interface{}, error) {
	return slimInjectedPod(obj, defaultInitContainerNames)
}

// The breaker counts a pod by its latest sandbox, not by its creation: a
// sandbox_recreated pod created long before the CNI became ready but whose
// sandbox was made after that tests the ready CNI like a new pod and counts;
// one whose sandbox was recreated before (a node reboot, the CNI not yet
// chained again) is of the race and does not, nor does one dated less than
// the sandbox slack after readiness (the kubelet dates a sandbox late, so it
// may have been made before).
func TestCountedByBreakerSandboxRecreated(t *testing.T) {
	d := Detector{InitContainerNames: defaultInitContainerNames, InitExitCode: 88, MinPodAge: 30 * time.Second, SandboxSlack: defaultSandboxSlack}
	ready := -5 * time.Minute
	since := t0.Add(ready) // the CNI became ready
	recreated := func(opts ...podOpt) *corev1.Pod {
		return mkPod(append([]podOpt{withStatus(annotations.TProxyStatusComplete), appliedAt(-2 * time.Hour)}, opts...)...)
	}
	tests := []struct {
		name    string
		pod     *corev1.Pod
		counted bool
	}{
		{"created before, sandbox recreated before readiness (reboot race)", recreated(sandboxAt(ready - 10*time.Second)), false},
		{"created before, sandbox recreated after readiness", recreated(sandboxAt(-time.Minute)), true},
		{"sandbox dated the second of readiness", recreated(sandboxAt(ready + 500*time.Millisecond)), false},
		{"sandbox dated within the slack after readiness", recreated(sandboxAt(ready + defaultSandboxSlack - time.Second)), false},
		{"sandbox dated a whole slack after readiness", recreated(sandboxAt(ready + defaultSandboxSlack)), true},
		{"created after, sandbox after", recreated(sandboxAt(-time.Minute), func(p *corev1.Pod) { p.CreationTimestamp = at(-2 * time.Minute) }), true},
		{"sandbox being recreated", recreated(sandboxDown(-5 * time.Second)), false},
		{"complete, not recreated, sandbox after", mkPod(withStatus(annotations.TProxyStatusComplete), appliedAt(-time.Minute), sandboxAt(-time.Minute)), true},
		{"finished", recreated(sandboxAt(-time.Minute), inPhase(corev1.PodFailed)), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := d.Detect(tc.pod, t0)
			if got := d.CountedByBreaker(tc.pod, since); got != tc.counted {
				t.Fatalf("counted %v, want %v (verdict %+v)", got, tc.counted, v)
			}
		})
	}
}
