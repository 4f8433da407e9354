package judgetest

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
)

// DetectCase is a pod of the detector's test matrix and the verdict
// expected of Detector at T0.
type DetectCase struct {
	Name   string
	Pod    *corev1.Pod
	Broken bool
	Reason judge.Reason
	Since  time.Time
	// Recheck: signal A will fire later without any change.
	Recheck time.Time
	// Code overrides the detector's exit code.
	Code int32
}

// Detector is the detector the matrix is judged with: the defaults.
func Detector() judge.Detector {
	c := judge.DefaultConfig()
	return c.Detector()
}

// Detector is the detector the case is judged with: Detector, with the
// case's exit code.
func (c DetectCase) Detector() judge.Detector {
	d := Detector()
	if c.Code != 0 {
		d.InitExitCode = c.Code
	}
	return d
}

// DetectMatrix returns the detector's test matrix: pods never broken, and
// pods broken by each signal, at and around each threshold.
func DetectMatrix() []DetectCase {
	return append(append(neverBroken(), bySignal()...), byStatusWritten()...)
}

// failedCheck is a check init container that failed 5 s ago; with a sandbox
// 10 s old (young) it is too young for signal A, so only signal B can make
// such a pod broken.
func failedCheck(name string) PodOpt {
	return InitStatus(corev1.ContainerStatus{Name: name, State: corev1.ContainerState{Terminated: Terminated(88, -10*time.Second, -5*time.Second)}})
}

var young = SandboxAt(-10 * time.Second)

// crashLoop is a check init container in back-off after exiting with last.
func crashLoop(name string, last int32) PodOpt {
	return InitStatus(corev1.ContainerStatus{
		Name:                 name,
		RestartCount:         3,
		State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "Back-off 5m0s"}},
		LastTerminationState: corev1.ContainerState{Terminated: Terminated(last, -10*time.Second, -5*time.Second)},
	})
}

func neverBroken() []DetectCase {
	yes := true
	return []DetectCase{
		// --- never broken ---
		{Name: "not injected", Pod: Pod(WithoutLabel(annotations.KeyInjectStatus), WithoutAnnotation(annotations.KeyInjectStatus), SandboxAt(-time.Hour), failedCheck(annotations.InitContainerName))},
		{Name: "injected, transparent proxy off (no status annotation)", Pod: Pod(WithoutAnnotation(annotations.KeyTransparentProxyStatus), SandboxAt(-time.Hour), failedCheck(annotations.InitContainerName))},
		{Name: "status complete, even with a failed check", Pod: Pod(WithStatus("complete"), SandboxAt(-time.Hour), failedCheck(annotations.InitContainerName))},
		{Name: "status completed (accepted spelling)", Pod: Pod(WithStatus("completed"), SandboxAt(-time.Hour))},
		{Name: "unknown status value", Pod: Pod(WithStatus("disabled"), SandboxAt(-time.Hour), failedCheck(annotations.InitContainerName))},
		{Name: "being deleted", Pod: Pod(SandboxAt(-time.Hour), failedCheck(annotations.InitContainerName), func(p *corev1.Pod) { ts := At(-time.Second); p.DeletionTimestamp = &ts })},
		{Name: "mirror pod (annotation)", Pod: Pod(WithAnnotation(annotations.KeyConfigMirror, "abc"), SandboxAt(-time.Hour), failedCheck(annotations.InitContainerName))},
		{Name: "static pod owned by its Node", Pod: Pod(SandboxAt(-time.Hour), failedCheck(annotations.InitContainerName), func(p *corev1.Pod) {
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: "n1", Controller: &yes}}
		})},
		{Name: "host network (CNI never called)", Pod: Pod(SandboxAt(-time.Hour), func(p *corev1.Pod) { p.Spec.HostNetwork = true })},
		{Name: "A: no sandbox yet (Pending, no IP, nothing started)", Pod: Pod()},
		{Name: "A: sandbox younger than min age", Pod: Pod(SandboxAt(-10 * time.Second)), Recheck: T0.Add(20 * time.Second)},
		{Name: "A: pod IP only, start time 10s ago", Pod: Pod(func(p *corev1.Pod) {
			p.Status.PodIP = "10.0.0.9"
			st := At(-10 * time.Second)
			p.Status.StartTime = &st
		}), Recheck: T0.Add(20 * time.Second)},
		{Name: "B: other exit code", Pod: Pod(young, InitStatus(corev1.ContainerStatus{Name: annotations.InitContainerName, State: corev1.ContainerState{Terminated: Terminated(1, -10*time.Second, -5*time.Second)}})), Recheck: T0.Add(20 * time.Second)},
		{Name: "B: exit 88 from a container with another name", Pod: Pod(young, failedCheck("istio-validation")), Recheck: T0.Add(20 * time.Second)},
		{Name: "B: name prefix without dash does not match", Pod: Pod(young, failedCheck(annotations.InitContainerName+"x")), Recheck: T0.Add(20 * time.Second)},
		{Name: "B: check succeeded after an earlier failure", Pod: Pod(young, InitStatus(corev1.ContainerStatus{
			Name: annotations.InitContainerName, RestartCount: 1,
			State:                corev1.ContainerState{Terminated: Terminated(0, -4*time.Second, -3*time.Second)},
			LastTerminationState: corev1.ContainerState{Terminated: Terminated(88, -10*time.Second, -5*time.Second)},
		})), Recheck: T0.Add(20 * time.Second)},

		// Istio's detectPod validation cases, mapped to ours (126 -> 88,
		// istio-validation -> consul-connect-inject-init, sidecar.istio.io/status -> injected+tproxy).
		{Name: "istio: OK pod (check passed)", Pod: Pod(WithStatus("complete"), SandboxAt(-time.Hour), InitStatus(corev1.ContainerStatus{Name: annotations.InitContainerName, State: corev1.ContainerState{Terminated: Terminated(0, -time.Hour, -time.Hour)}}))},
		{Name: "istio: working pod that previously died", Pod: Pod(WithStatus("complete"), SandboxAt(-time.Hour), InitStatus(corev1.ContainerStatus{
			Name: annotations.InitContainerName, State: corev1.ContainerState{Terminated: Terminated(0, -time.Hour, -time.Hour)},
			LastTerminationState: corev1.ContainerState{Terminated: Terminated(88, -2*time.Hour, -2*time.Hour)},
		}))},
		{Name: "istio: broken pod in waiting state", Pod: Pod(young, crashLoop(annotations.InitContainerName, 88)), Broken: true, Reason: judge.ReasonInitCheckFailed, Since: T0.Add(-5 * time.Second)},
		{Name: "istio: broken pod, check terminated now", Pod: Pod(young, failedCheck(annotations.InitContainerName)), Broken: true, Reason: judge.ReasonInitCheckFailed, Since: T0.Add(-5 * time.Second)},
		{Name: "istio: broken pod with wrong exit code (55 configured)", Code: 55, Pod: Pod(young, crashLoop(annotations.InitContainerName, 88)), Recheck: T0.Add(20 * time.Second)},
		{Name: "istio: broken pod with no sidecar annotation", Pod: Pod(WithoutAnnotation(annotations.KeyInjectStatus), WithoutLabel(annotations.KeyInjectStatus), young, crashLoop(annotations.InitContainerName, 88))},
		{Name: "istio: termination code 121", Pod: Pod(young, crashLoop(annotations.InitContainerName, 121)), Recheck: T0.Add(20 * time.Second)},
		{Name: "istio: badly formatted pod (empty init status)", Pod: Pod(InitStatus(corev1.ContainerStatus{}))},
	}
}

func bySignal() []DetectCase {
	slack := judge.DefaultConfig().SandboxSlack
	return []DetectCase{
		// --- Broken: signal B ---
		{Name: "B: restartPolicy Never, first failure only in State", Pod: Pod(RestartNever(), young, failedCheck(annotations.InitContainerName), func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed }), Broken: true, Reason: judge.ReasonInitCheckFailed, Since: T0.Add(-5 * time.Second)},
		{Name: "B: running again after a failure", Pod: Pod(young, InitStatus(corev1.ContainerStatus{
			Name: annotations.InitContainerName, RestartCount: 1,
			State:                corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: At(-time.Second)}},
			LastTerminationState: corev1.ContainerState{Terminated: Terminated(88, -10*time.Second, -5*time.Second)},
		})), Broken: true, Reason: judge.ReasonInitCheckFailed, Since: T0.Add(-5 * time.Second)},
		{Name: "B: multi-port consul-connect-inject-init-<service>", Pod: Pod(young, failedCheck(annotations.InitContainerName+"-web")), Broken: true, Reason: judge.ReasonInitCheckFailed, Since: T0.Add(-5 * time.Second)},
		{Name: "B: consul-cni-check-<service>", Pod: Pod(young, failedCheck(annotations.CheckContainerName+"-api")), Broken: true, Reason: judge.ReasonInitCheckFailed, Since: T0.Add(-5 * time.Second)},
		{Name: "B: status waiting", Pod: Pod(WithStatus("waiting"), young, failedCheck(annotations.CheckContainerName)), Broken: true, Reason: judge.ReasonInitCheckFailed, Since: T0.Add(-5 * time.Second)},
		{Name: "B: injected by annotation only (no label)", Pod: Pod(WithoutLabel(annotations.KeyInjectStatus), young, failedCheck(annotations.InitContainerName)), Broken: true, Reason: judge.ReasonInitCheckFailed, Since: T0.Add(-5 * time.Second)},
		{Name: "B: mesh-inject-status", Pod: Pod(WithoutLabel(annotations.KeyInjectStatus), WithoutAnnotation(annotations.KeyInjectStatus), WithAnnotation(annotations.KeyMeshInjectStatus, "injected"), young, failedCheck(annotations.InitContainerName)), Broken: true, Reason: judge.ReasonInitCheckFailed, Since: T0.Add(-5 * time.Second)},
		{Name: "B wins over A", Pod: Pod(SandboxAt(-time.Hour), failedCheck(annotations.InitContainerName)), Broken: true, Reason: judge.ReasonInitCheckFailed, Since: T0.Add(-5 * time.Second)},
		{Name: "B: bare pods are detected too (the action decides)", Pod: Pod(Bare(), young, failedCheck(annotations.InitContainerName)), Broken: true, Reason: judge.ReasonInitCheckFailed, Since: T0.Add(-5 * time.Second)},

		// --- finished pods: never broken unless the check failed them ---
		{Name: "Succeeded pod with status enabled (a finished Job)", Pod: Pod(SandboxAt(-time.Hour), InPhase(corev1.PodSucceeded))},
		{Name: "Succeeded pod whose sandbox was recreated", Pod: Pod(WithStatus("complete"), AppliedAt(-2*time.Hour), SandboxAt(-time.Hour), InPhase(corev1.PodSucceeded))},
		{Name: "Failed pod (kubelet eviction) with status enabled", Pod: Pod(SandboxAt(-time.Hour), InPhase(corev1.PodFailed))},
		{Name: "Failed pod, check exited with another code", Pod: Pod(RestartNever(), young, InPhase(corev1.PodFailed), InitStatus(corev1.ContainerStatus{Name: annotations.InitContainerName, State: corev1.ContainerState{Terminated: Terminated(1, -10*time.Second, -5*time.Second)}}))},
		{Name: "Failed pod with status complete and a recreated sandbox", Pod: Pod(WithStatus("complete"), AppliedAt(-2*time.Hour), SandboxAt(-time.Hour), InPhase(corev1.PodFailed))},

		// --- the latest sandbox decides (signal A) ---
		{Name: "A: waiting, new sandbox being set up, old IP and container starts kept", Pod: Pod(WithStatus("waiting"), SandboxDown(-5*time.Second), StartedApp(-time.Hour), func(p *corev1.Pod) { p.Status.PodIP = "10.0.0.7" })},
		{Name: "A: waiting written 10s ago by a new ADD, the condition still dates the old sandbox", Pod: Pod(WithStatus("waiting"), SandboxAt(-time.Hour), StartedApp(-time.Hour), StatusWritten("consul-cni", -10*time.Second)), Recheck: T0.Add(20 * time.Second)},
		{Name: "A: waiting written before the sandbox: the sandbox dates it", Pod: Pod(WithStatus("waiting"), SandboxAt(-10*time.Second), StatusWritten("consul-cni", -time.Hour)), Recheck: T0.Add(20 * time.Second)},
		{Name: "A: latest sandbox 10s old, containers of the earlier one started 1h ago", Pod: Pod(WithStatus("waiting"), SandboxAt(-10*time.Second), StartedApp(-time.Hour)), Recheck: T0.Add(20 * time.Second)},

		// --- signal C: complete, cni-applied-at against the latest sandbox ---
		{Name: "C: complete without cni-applied-at (older plugin), sandbox recreated", Pod: Pod(WithStatus("complete"), SandboxAt(-time.Minute), StartedApp(-time.Hour))},
		{Name: "C: first sandbox ready right after the rules", Pod: Pod(WithStatus("complete"), AppliedAt(-time.Hour), SandboxAt(-time.Hour+time.Second))},
		{Name: "C: first sandbox ready exactly the slack after the rules", Pod: Pod(WithStatus("complete"), AppliedAt(-time.Hour), SandboxAt(-time.Hour+slack))},
		{Name: "C: sandbox ready before cni-applied-at (clock rounding)", Pod: Pod(WithStatus("complete"), AppliedAt(-time.Hour), SandboxAt(-time.Hour-time.Second))},
		{Name: "C: sandbox being recreated (condition False)", Pod: Pod(WithStatus("complete"), AppliedAt(-time.Hour), SandboxDown(-time.Second))},
		{Name: "C: no PodReadyToStartContainers condition", Pod: Pod(WithStatus("complete"), AppliedAt(-time.Hour), StartedApp(-time.Minute))},
		{Name: "C: cni-applied-at does not parse", Pod: Pod(WithStatus("complete"), WithAnnotation(annotations.KeyCNIAppliedAt, "yesterday"), SandboxAt(-time.Minute))},
		{Name: "C: first image pull longer than the slack, nothing ran before the sandbox", Pod: Pod(WithStatus("complete"), AppliedAt(-time.Hour), SandboxAt(-time.Hour+slack+time.Minute), StartedApp(-time.Hour+slack+time.Minute), RanAgain(annotations.CheckContainerName, -time.Hour+slack+time.Minute+5*time.Second, -time.Hour+slack+time.Minute+10*time.Second))},
		{Name: "C: first image pull longer than the slack, an app container restarted in that sandbox", Pod: Pod(WithStatus("complete"), AppliedAt(-time.Hour), SandboxAt(-time.Hour+slack+time.Minute), Restarted(-time.Hour+slack+2*time.Minute))},
		{Name: "C: first image pull longer than the slack, init container running its first run", Pod: Pod(WithStatus("complete"), AppliedAt(-time.Hour), SandboxAt(-time.Hour+slack+time.Minute), InitStatus(corev1.ContainerStatus{Name: "copy-config", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: At(-time.Hour + slack + time.Minute)}}}))},
		{Name: "C: a container restarted before the sandbox, but within the slack", Pod: Pod(WithStatus("complete"), AppliedAt(-time.Hour), SandboxAt(-time.Hour+slack), Restarted(-time.Hour+time.Minute))},
		{Name: "C: status enabled with an old cni-applied-at is judged by signal A", Pod: Pod(AppliedAt(-2*time.Hour), SandboxAt(-10*time.Second)), Recheck: T0.Add(20 * time.Second)},
		{Name: "C: sandbox recreated 1h after the rules", Pod: Pod(WithStatus("complete"), AppliedAt(-2*time.Hour), SandboxAt(-time.Hour), Restarted(-time.Hour-time.Minute)), Broken: true, Reason: judge.ReasonSandboxRecreated, Since: T0.Add(-time.Hour)},
		{Name: "C: completed spelling, sandbox just recreated", Pod: Pod(WithStatus("completed"), AppliedAt(-time.Hour), SandboxAt(0), Restarted(-time.Second)), Broken: true, Reason: judge.ReasonSandboxRecreated, Since: T0},
		{Name: "C: sandbox ready one second beyond the slack", Pod: Pod(WithStatus("complete"), AppliedAt(-time.Hour), SandboxAt(-time.Hour+slack+time.Second), Restarted(-time.Hour+slack)), Broken: true, Reason: judge.ReasonSandboxRecreated, Since: T0.Add(-time.Hour + slack + time.Second)},
		{Name: "C: init container ran again in a recreated sandbox", Pod: Pod(WithStatus("complete"), AppliedAt(-2*time.Hour), SandboxAt(-time.Hour), RanAgain(annotations.InitContainerName, -90*time.Minute, -time.Hour+time.Second)), Broken: true, Reason: judge.ReasonSandboxRecreated, Since: T0.Add(-time.Hour)},
		{Name: "C: an app container lost with its sandbox (no times)", Pod: Pod(WithStatus("complete"), AppliedAt(-2*time.Hour), SandboxAt(-time.Hour), Lost()), Broken: true, Reason: judge.ReasonSandboxRecreated, Since: T0.Add(-time.Hour)},
		{Name: "C: check failed long ago, sandbox recreated", Pod: Pod(WithStatus("complete"), AppliedAt(-2*time.Hour), SandboxAt(-time.Minute), failedCheck(annotations.InitContainerName), Lost()), Broken: true, Reason: judge.ReasonSandboxRecreated, Since: T0.Add(-time.Minute)},

		// --- Broken: signal A ---
		{Name: "A: enabled, latest sandbox 31s old, containers of an earlier one", Pod: Pod(SandboxAt(-31*time.Second), StartedApp(-time.Hour)), Broken: true, Reason: judge.ReasonTProxyStatusStuck, Since: T0.Add(-time.Second)},
		{Name: "A: enabled, sandbox ready 31s ago", Pod: Pod(SandboxAt(-31 * time.Second)), Broken: true, Reason: judge.ReasonTProxyStatusStuck, Since: T0.Add(-time.Second)},
		{Name: "A: waiting written 31s ago, the condition still dates the old sandbox", Pod: Pod(WithStatus("waiting"), SandboxAt(-time.Hour), StatusWritten("consul-cni", -31*time.Second)), Broken: true, Reason: judge.ReasonTProxyStatusStuck, Since: T0.Add(-time.Second)},
		{Name: "A: enabled ages from the sandbox whatever wrote the status", Pod: Pod(SandboxAt(-time.Hour), StatusWritten("kubectl-annotate", -10*time.Second)), Broken: true, Reason: judge.ReasonTProxyStatusStuck, Since: T0.Add(-time.Hour + 30*time.Second)},
		{Name: "A: waiting, sandbox exactly min age", Pod: Pod(WithStatus("waiting"), SandboxAt(-30*time.Second)), Broken: true, Reason: judge.ReasonTProxyStatusStuck, Since: T0},
		{Name: "A: pod IP only, start time 1m ago", Pod: Pod(func(p *corev1.Pod) { p.Status.PodIP = "10.0.0.9"; st := At(-time.Minute); p.Status.StartTime = &st }), Broken: true, Reason: judge.ReasonTProxyStatusStuck, Since: T0.Add(-30 * time.Second)},
		{Name: "A: a container running for 1m, no condition", Pod: Pod(func(p *corev1.Pod) {
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "app", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: At(-time.Minute)}}}}
		}), Broken: true, Reason: judge.ReasonTProxyStatusStuck, Since: T0.Add(-30 * time.Second)},
		{Name: "A: check crash-looping with another code, old sandbox", Pod: Pod(SandboxAt(-time.Hour), crashLoop(annotations.InitContainerName, 1)), Broken: true, Reason: judge.ReasonTProxyStatusStuck, Since: T0.Add(-time.Hour + 30*time.Second)},
		{Name: "A: restartPolicy Never pod whose check never ran but sandbox is old", Pod: Pod(RestartNever(), SandboxAt(-time.Minute)), Broken: true, Reason: judge.ReasonTProxyStatusStuck, Since: T0.Add(-30 * time.Second)},
	}
}

// byStatusWritten is signal C for consul-k8s's plugin, which writes no
// cni-applied-at: the time of the managedFields entry that owns the status
// annotation stands for it.
func byStatusWritten() []DetectCase {
	slack := judge.DefaultConfig().SandboxSlack
	complete := WithStatus("complete")
	const plugin, creator = "consul-cni", "kube-controller-manager"
	labels := `{"f:metadata":{"f:labels":{"f:app":{}}}}`
	return []DetectCase{
		// --- not broken ---
		{Name: "C written: first sandbox ready right after the plugin wrote the status", Pod: Pod(complete, StatusWritten(plugin, -time.Hour), SandboxAt(-time.Hour+5*time.Second))},
		{Name: "C written: sandbox ready exactly the slack after the status was written", Pod: Pod(complete, StatusWritten(plugin, -time.Hour), SandboxAt(-time.Hour+slack))},
		{Name: "C written: sandbox ready before the status was written (clock rounding)", Pod: Pod(complete, StatusWritten(plugin, -time.Hour), SandboxAt(-time.Hour-time.Second))},
		{Name: "C written: no PodReadyToStartContainers condition", Pod: Pod(complete, StatusWritten(plugin, -2*time.Hour), StartedApp(-time.Minute))},
		{Name: "C written: sandbox being recreated (condition False)", Pod: Pod(complete, StatusWritten(plugin, -2*time.Hour), SandboxDown(-time.Second))},
		{Name: "C written: the plugin wrote the status again after the recreated sandbox", Pod: Pod(complete, StatusWritten(plugin, -time.Hour+10*time.Second), SandboxAt(-time.Hour), StartedApp(-2*time.Hour))},
		{Name: "C written: someone rewrote the status after the sandbox (the latest owner counts)", Pod: Pod(complete, StatusWritten(plugin, -2*time.Hour), StatusWritten("kubectl-annotate", -30*time.Minute), SandboxAt(-time.Hour))},
		{Name: "C written: managed fields own only other fields", Pod: Pod(complete, ManagedFields(creator, -2*time.Hour, labels), ManagedFields("kubelet", -time.Hour, `{"f:status":{"f:conditions":{}}}`), SandboxAt(-time.Hour))},
		{Name: "C written: entry owning the status without a time", Pod: Pod(complete, StatusWritten(plugin, -2*time.Hour), func(p *corev1.Pod) { p.ManagedFields[0].Time = nil }, SandboxAt(-time.Hour))},
		{Name: "C written: fieldsV1 that does not parse", Pod: Pod(complete, ManagedFields(plugin, -2*time.Hour, `{"f:metadata":`), SandboxAt(-time.Hour))},
		{Name: "C written: status enabled, written at creation, is judged by signal A", Pod: Pod(StatusWritten(creator, -time.Hour), SandboxAt(-10*time.Second)), Recheck: T0.Add(20 * time.Second)},
		{Name: "C written: cni-applied-at decides when present (rules applied to this sandbox)", Pod: Pod(complete, AppliedAt(-time.Hour), StatusWritten(plugin, -2*time.Hour), SandboxAt(-time.Hour+time.Second))},

		{Name: "C written: first image pull longer than the slack, nothing ran before the sandbox", Pod: Pod(complete, StatusWritten(plugin, -time.Hour), SandboxAt(-time.Hour+slack+time.Minute), StartedApp(-time.Hour+slack+time.Minute))},
		// --- broken ---
		{Name: "C written: sandbox recreated 1h after the plugin wrote the status (reboot)", Pod: Pod(complete, StatusWritten(plugin, -2*time.Hour), ManagedFields("kubelet", -time.Minute, `{"f:status":{"f:conditions":{}}}`), SandboxAt(-time.Hour), Restarted(-time.Hour-time.Minute)), Broken: true, Reason: judge.ReasonSandboxRecreated, Since: T0.Add(-time.Hour)},
		{Name: "C written: sandbox ready one second beyond the slack", Pod: Pod(complete, StatusWritten(plugin, -time.Hour), SandboxAt(-time.Hour+slack+time.Second), RanAgain(annotations.InitContainerName, -time.Hour+slack, -time.Hour+slack+2*time.Second)), Broken: true, Reason: judge.ReasonSandboxRecreated, Since: T0.Add(-time.Hour + slack + time.Second)},
		{Name: "C written: completed spelling, other entries own other fields only", Pod: Pod(WithStatus("completed"), ManagedFields(creator, -3*time.Hour, labels), StatusWritten(plugin, -2*time.Hour), SandboxAt(-time.Minute), Lost()), Broken: true, Reason: judge.ReasonSandboxRecreated, Since: T0.Add(-time.Minute)},
		{Name: "C written: status complete owned by the creating request, sandbox made after creation", Pod: Pod(complete, StatusWritten(creator, -time.Hour), SandboxAt(-time.Minute), Restarted(-2*time.Minute)), Broken: true, Reason: judge.ReasonSandboxRecreated, Since: T0.Add(-time.Minute)},
		{Name: "C written: cni-applied-at decides when present (sandbox recreated, status rewritten since)", Pod: Pod(complete, AppliedAt(-2*time.Hour), StatusWritten("kubectl-annotate", -time.Minute), SandboxAt(-time.Hour), Restarted(-time.Hour-time.Second)), Broken: true, Reason: judge.ReasonSandboxRecreated, Since: T0.Add(-time.Hour)},
	}
}
