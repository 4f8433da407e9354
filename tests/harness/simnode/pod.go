package simnode

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// podWorker runs one pod, like kubelet's pod worker: every change of the
// pod, exit of a container, probe result or second triggers a sync.
type podWorker struct {
	n   *Node
	uid types.UID

	mu       sync.Mutex
	latest   *corev1.Pod
	removed  bool // the pod is gone from the API
	halt     bool // the node is stopping
	recreate bool // RecreateSandbox asked for a new sandbox
	wake     chan struct{}

	// Owned by the run goroutine.
	vols       *volumes
	volErr     string
	sb         *sandbox
	sbErr      string
	nextTry    time.Time
	init, ctrs []*container
	initDone   bool
	failedInit bool
	startTime  *metav1.Time
	finished   bool // terminal phase reached; containers and sandbox gone
	lastStatus []byte
	condTimes  map[corev1.PodConditionType]corev1.PodCondition
}

func newPodWorker(n *Node, pod *corev1.Pod) *podWorker {
	w := &podWorker{n: n, uid: pod.UID, latest: pod, wake: make(chan struct{}, 1),
		condTimes: map[corev1.PodConditionType]corev1.PodCondition{}}
	for _, c := range pod.Spec.InitContainers {
		sidecar := c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
		w.init = append(w.init, &container{spec: c, init: true, sidecar: sidecar})
	}
	for _, c := range pod.Spec.Containers {
		w.ctrs = append(w.ctrs, &container{spec: c})
	}
	return w
}

func (w *podWorker) update(pod *corev1.Pod) {
	w.mu.Lock()
	w.latest = pod
	w.mu.Unlock()
	w.poke()
}

func (w *podWorker) gone() {
	w.mu.Lock()
	w.removed = true
	w.mu.Unlock()
	w.poke()
}

func (w *podWorker) shutdown() {
	w.mu.Lock()
	w.halt = true
	w.mu.Unlock()
	w.poke()
}

func (w *podWorker) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *podWorker) all() []*container {
	return append(append([]*container(nil), w.init...), w.ctrs...)
}

func (w *podWorker) run() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		w.mu.Lock()
		pod, removed, halt, recreate := w.latest, w.removed, w.halt, w.recreate
		w.recreate = false
		w.mu.Unlock()
		switch {
		case halt:
			w.teardown(pod, 2*time.Second)
			return
		case removed:
			w.teardown(pod, 2*time.Second)
			return
		case pod.DeletionTimestamp != nil:
			if w.terminate(pod) {
				return
			}
		case recreate && !w.finished:
			w.loseSandbox(pod)
		default:
			w.sync(pod)
		}
		select {
		case <-w.wake:
		case <-t.C:
		}
	}
}

func (w *podWorker) logf(pod *corev1.Pod, format string, args ...any) {
	w.n.cfg.Logf("node %s: pod %s/%s: %s", w.n.cfg.Name, pod.Namespace, pod.Name, fmt.Sprintf(format, args...))
}

func (w *podWorker) event(pod *corev1.Pod, typ, reason, format string, args ...any) {
	w.n.recorder.Eventf(pod, typ, reason, format, args...)
}

// stopAll stops every running container concurrently within grace.
func (w *podWorker) stopAll(pod *corev1.Pod, grace time.Duration) {
	var wg sync.WaitGroup
	for _, c := range w.all() {
		if c.p == nil {
			continue
		}
		wg.Add(1)
		go func(c *container) {
			defer wg.Done()
			c.p.Stop(grace)
		}(c)
	}
	wg.Wait()
	for _, c := range w.all() {
		if c.p != nil {
			w.reap(pod, c)
		}
	}
}

func (w *podWorker) destroySandbox(pod *corev1.Pod) {
	if w.sb == nil {
		return
	}
	var err error
	for i := 0; i < 3; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err = w.n.destroySandbox(ctx, pod, w.sb)
		cancel()
		if err == nil {
			break
		}
		time.Sleep(time.Second)
	}
	if err != nil {
		w.logf(pod, "%v", err)
	}
	w.sb = nil
}

// loseSandbox does to the pod what a node reboot does: its containers stop,
// its sandbox is gone (torn down with the network configuration of this
// moment) and the status says so (PodReadyToStartContainers False). The
// next sync makes a new sandbox with the configuration of that moment and
// runs the init containers again, then the others, as kubelet does for a
// pod whose sandbox changed.
func (w *podWorker) loseSandbox(pod *corev1.Pod) {
	w.logf(pod, "sandbox lost")
	w.stopAll(pod, w.gracePeriod(pod))
	w.destroySandbox(pod)
	w.initDone = false
	for _, c := range w.init {
		if !c.sidecar && c.last != nil {
			c.prev, c.last = c.last, nil
		}
	}
	w.writeStatus(w.n.ctx, pod)
}

// teardown stops everything without talking to the API (the pod is gone or
// the node is stopping).
func (w *podWorker) teardown(pod *corev1.Pod, grace time.Duration) {
	w.stopAll(pod, grace)
	w.destroySandbox(pod)
	w.removePodDir()
}

// removePodDir removes the pod's volumes and kubeconfig (container logs
// stay until the node stops, so tests can read a deleted pod's output).
func (w *podWorker) removePodDir() {
	_ = os.RemoveAll(w.podDir())
}

// terminate handles a pod being deleted: containers get SIGTERM and the
// rest of the grace period, the sandbox is torn down (CNI DEL, namespace
// removed), the final status is written and the deletion is completed with
// grace period 0, as kubelet does. It returns true when the pod is gone.
func (w *podWorker) terminate(pod *corev1.Pod) bool {
	grace := 30 * time.Second
	if pod.DeletionGracePeriodSeconds != nil {
		grace = time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
	} else if pod.Spec.TerminationGracePeriodSeconds != nil {
		grace = time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
	}
	if rem := time.Until(pod.DeletionTimestamp.Time); rem < grace {
		grace = rem
	}
	if grace < 2*time.Second {
		grace = 2 * time.Second // kubelet's minimum when killing
	}
	if !w.finished {
		for _, c := range w.all() {
			if c.p != nil {
				w.event(pod, corev1.EventTypeNormal, "Killing", "Stopping container %s", c.spec.Name)
			}
		}
		w.stopAll(pod, grace)
		w.destroySandbox(pod)
		w.removePodDir()
		w.finished = true
	}
	ctx, cancel := context.WithTimeout(w.n.ctx, 30*time.Second)
	defer cancel()
	w.writeStatus(ctx, pod)
	err := w.n.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: new(int64),
		Preconditions:      metav1.NewUIDPreconditions(string(pod.UID)),
	})
	if err == nil || apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		w.logf(pod, "deleted")
		return true
	}
	w.logf(pod, "finalize deletion: %v", err)
	return w.n.ctx.Err() != nil
}

// backoff returns the wait before the next start of a container that has
// run runs times: none for the first restart, then Initial doubling up to
// Max (kubelet's crash-loop back-off).
func (w *podWorker) backoff(runs int) time.Duration {
	if runs <= 1 {
		return 0
	}
	d := w.n.cfg.RestartBackoff
	for i := 2; i < runs && d < w.n.cfg.MaxRestartBackoff; i++ {
		d *= 2
	}
	if d > w.n.cfg.MaxRestartBackoff {
		d = w.n.cfg.MaxRestartBackoff
	}
	return d
}

func (w *podWorker) willRestart(pod *corev1.Pod, c *container) bool {
	if c.last == nil || c.p != nil || w.finished || pod.DeletionTimestamp != nil {
		return false
	}
	if c.sidecar {
		return true
	}
	policy := pod.Spec.RestartPolicy
	if c.init {
		return c.last.ExitCode != 0 && policy != corev1.RestartPolicyNever
	}
	switch policy {
	case corev1.RestartPolicyNever:
		return false
	case corev1.RestartPolicyOnFailure:
		return c.last.ExitCode != 0
	}
	return true
}

// exited records the exit of a container and schedules its restart.
func (w *podWorker) exited(pod *corev1.Pod, c *container) {
	w.reap(pod, c)
	c.waiting, c.waitMsg = "", ""
	if w.willRestart(pod, c) {
		d := w.backoff(c.runs)
		c.nextStart = time.Now().Add(d)
		if d > 0 {
			c.waiting = "CrashLoopBackOff"
			c.waitMsg = fmt.Sprintf("back-off %s restarting failed container=%s pod=%s_%s(%s)", d, c.spec.Name, pod.Name, pod.Namespace, pod.UID)
			w.event(pod, corev1.EventTypeWarning, "BackOff", "Back-off restarting failed container %s in pod %s_%s(%s)", c.spec.Name, pod.Name, pod.Namespace, pod.UID)
		}
	}
}

// start starts c, recording a start failure as a terminated instance with
// exit code 128 (StartError) like the runtime does.
func (w *podWorker) start(ctx context.Context, pod *corev1.Pod, c *container) {
	if err := w.startContainer(ctx, pod, c); err != nil {
		w.logf(pod, "start container %s: %v", c.spec.Name, err)
		w.event(pod, corev1.EventTypeWarning, "Failed", "Error: %v", err)
		now := metav1.Now()
		c.prev, c.last = c.last, &corev1.ContainerStateTerminated{ExitCode: 128, Reason: "StartError", Message: err.Error(), StartedAt: now, FinishedAt: now}
		c.waiting, c.waitMsg = "", ""
		if w.willRestart(pod, c) {
			c.nextStart = time.Now().Add(w.backoff(c.runs))
			c.waiting = "CrashLoopBackOff"
		}
		return
	}
	if c.runs > 1 {
		w.event(pod, corev1.EventTypeNormal, "Started", "Started container %s (restart %d)", c.spec.Name, c.runs-1)
	} else {
		w.event(pod, corev1.EventTypeNormal, "Started", "Started container %s", c.spec.Name)
	}
}

// sync moves the pod one step towards its spec.
func (w *podWorker) sync(pod *corev1.Pod) {
	ctx := w.n.ctx
	now := time.Now()
	if w.startTime == nil {
		t := metav1.Now()
		w.startTime = &t
	}
	if w.finished || !w.ensureVolumes(ctx, pod, now) || !w.ensureSandbox(ctx, pod, now) {
		w.writeStatus(ctx, pod)
		return
	}
	w.reapContainers(pod)
	w.stepInit(ctx, pod, now)
	if w.initDone && !w.failedInit {
		for _, c := range w.ctrs {
			if c.p != nil {
				continue
			}
			if (c.runs == 0 || w.willRestart(pod, c)) && !now.Before(c.nextStart) {
				w.start(ctx, pod, c)
			}
		}
	}
	if ph := w.phase(pod); ph == corev1.PodSucceeded || ph == corev1.PodFailed {
		// A finished pod keeps no running sidecar and no sandbox.
		w.stopAll(pod, w.gracePeriod(pod))
		w.destroySandbox(pod)
		w.finished = true
		w.logf(pod, "finished: %s", ph)
	}
	w.writeStatus(ctx, pod)
}

// ensureVolumes sets the pod's volumes up (retrying after SyncRetry) or
// refreshes them; false when they are not there yet.
func (w *podWorker) ensureVolumes(ctx context.Context, pod *corev1.Pod, now time.Time) bool {
	if w.vols != nil {
		if err := w.refreshVolumes(ctx, pod, w.vols, false); err != nil {
			w.logf(pod, "refresh volumes: %v", err)
		}
		return true
	}
	if now.Before(w.nextTry) {
		return false
	}
	v, err := w.setupVolumes(ctx, pod)
	if err != nil {
		if err.Error() != w.volErr {
			w.event(pod, corev1.EventTypeWarning, "FailedMount", "MountVolume.SetUp failed: %v", err)
			w.logf(pod, "volumes: %v", err)
		}
		w.volErr = err.Error()
		w.nextTry = now.Add(w.n.cfg.SyncRetry)
		return false
	}
	w.vols, w.volErr = v, ""
	return true
}

// ensureSandbox creates the pod's sandbox through the CNI chain (retrying
// after SyncRetry); false when it is not there yet.
func (w *podWorker) ensureSandbox(ctx context.Context, pod *corev1.Pod, now time.Time) bool {
	if w.sb != nil || pod.Spec.HostNetwork {
		return true
	}
	if now.Before(w.nextTry) {
		return false
	}
	sb, err := w.n.createSandbox(ctx, pod)
	if err != nil {
		w.sbErr = err.Error()
		w.nextTry = time.Now().Add(w.n.cfg.SyncRetry)
		w.logf(pod, "sandbox: %v", err)
		w.event(pod, corev1.EventTypeWarning, "FailedCreatePodSandBox", "Failed to create pod sandbox: %v", err)
		return false
	}
	w.sb, w.sbErr = sb, ""
	w.logf(pod, "sandbox %s: netns %s, IPs %v", sb.id[:12], sb.netnsName, sb.ips)
	return true
}

// reapContainers records the containers that exited and restarts the ones
// that failed their liveness probe.
func (w *podWorker) reapContainers(pod *corev1.Pod) {
	for _, c := range w.all() {
		if c.p == nil {
			continue
		}
		select {
		case <-c.p.Done():
			w.exited(pod, c)
			continue
		default:
		}
		if c.ps.liveFail.Load() {
			w.event(pod, corev1.EventTypeNormal, "Killing", "Container %s failed liveness probe, will be restarted", c.spec.Name)
			c.p.Stop(w.gracePeriod(pod))
			w.exited(pod, c)
		}
	}
}

// stepInit runs the init containers in order (sidecars keep running) and
// sets initDone once all have succeeded, failedInit when one failed and
// the pod never restarts.
func (w *podWorker) stepInit(ctx context.Context, pod *corev1.Pod, now time.Time) {
	policy := pod.Spec.RestartPolicy
	initDone := true
	for _, c := range w.init {
		if c.sidecar {
			if c.p == nil && (c.runs == 0 || w.willRestart(pod, c)) && !now.Before(c.nextStart) {
				w.start(ctx, pod, c)
			}
			if c.p == nil && !w.initDone {
				initDone = false
				break
			}
			continue
		}
		if c.p == nil && c.last != nil && c.last.ExitCode == 0 {
			continue // succeeded
		}
		initDone = false
		if c.p != nil {
			break
		}
		if c.last != nil && policy == corev1.RestartPolicyNever {
			w.failedInit = true
			break
		}
		if !now.Before(c.nextStart) {
			w.start(ctx, pod, c)
		}
		break
	}
	if initDone && !w.initDone {
		w.initDone = true
	}
}

func (w *podWorker) gracePeriod(pod *corev1.Pod) time.Duration {
	if pod.Spec.TerminationGracePeriodSeconds != nil {
		g := time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
		if g < 2*time.Second {
			g = 2 * time.Second
		}
		return g
	}
	return 30 * time.Second
}

// phase follows kubelet's getPhase.
func (w *podWorker) phase(pod *corev1.Pod) corev1.PodPhase {
	if w.failedInit {
		return corev1.PodFailed
	}
	if !w.initDone {
		return corev1.PodPending
	}
	var running, waiting, stopped, succeeded int
	for _, c := range w.ctrs {
		switch {
		case c.p != nil:
			running++
		case c.last != nil:
			stopped++
			if c.last.ExitCode == 0 {
				succeeded++
			}
		default:
			waiting++
		}
	}
	policy := pod.Spec.RestartPolicy
	switch {
	case waiting > 0:
		return corev1.PodPending
	case running > 0:
		return corev1.PodRunning
	case stopped > 0:
		if policy == corev1.RestartPolicyAlways && pod.DeletionTimestamp == nil {
			return corev1.PodRunning
		}
		if stopped == succeeded {
			return corev1.PodSucceeded
		}
		if policy == corev1.RestartPolicyNever || pod.DeletionTimestamp != nil {
			return corev1.PodFailed
		}
		return corev1.PodRunning
	}
	return corev1.PodPending
}

func (w *podWorker) condition(t corev1.PodConditionType, ok bool, reason, msg string) corev1.PodCondition {
	st := corev1.ConditionFalse
	if ok {
		st = corev1.ConditionTrue
		reason, msg = "", ""
	}
	c := corev1.PodCondition{Type: t, Status: st, Reason: reason, Message: msg, LastTransitionTime: metav1.Now()}
	if old, found := w.condTimes[t]; found && old.Status == st {
		c.LastTransitionTime = old.LastTransitionTime
	}
	w.condTimes[t] = c
	return c
}

// status renders the pod status from the worker's state.
func (w *podWorker) status(pod *corev1.Pod) corev1.PodStatus {
	phase := w.phase(pod)
	nodeIP := w.n.cfg.NodeIP.String()
	st := corev1.PodStatus{
		Phase:     phase,
		HostIP:    nodeIP,
		HostIPs:   []corev1.HostIP{{IP: nodeIP}},
		StartTime: w.startTime,
		QOSClass:  pod.Status.QOSClass,
	}
	if ips := w.podIPs(pod, nodeIP); len(ips) > 0 {
		st.PodIP = ips[0]
		for _, ip := range ips {
			st.PodIPs = append(st.PodIPs, corev1.PodIP{IP: ip})
		}
	}
	sandboxReady := (pod.Spec.HostNetwork && w.vols != nil) || w.sb != nil
	var unready, uninit []string
	st.InitContainerStatuses, st.ContainerStatuses, unready, uninit = w.containerStatuses(pod, sandboxReady)
	st.Conditions = w.conditions(pod, phase, sandboxReady, unready, uninit)
	return st
}

// podIPs are the node's IP for a host-network pod, else the sandbox's; a
// finished pod keeps the IPs it had.
func (w *podWorker) podIPs(pod *corev1.Pod, nodeIP string) []string {
	var ips []string
	if pod.Spec.HostNetwork {
		ips = []string{nodeIP}
	} else if w.sb != nil {
		for _, a := range w.sb.ips {
			ips = append(ips, a.String())
		}
	} else if len(pod.Status.PodIPs) > 0 && w.finished {
		for _, ip := range pod.Status.PodIPs {
			ips = append(ips, ip.IP) // kubelet keeps the IPs of a finished pod
		}
	}
	return ips
}

// containerStatuses are the statuses of the init and regular containers,
// with the names of the containers not ready and of the init containers
// not done.
func (w *podWorker) containerStatuses(pod *corev1.Pod, sandboxReady bool) (inits, ctrs []corev1.ContainerStatus, unready, uninit []string) {
	for _, c := range w.init {
		s := c.status(w.willRestart(pod, c))
		if c.p == nil && c.last == nil && c.waiting == "" {
			s.State.Waiting.Reason = "PodInitializing"
			if !sandboxReady {
				s.State.Waiting.Reason = "ContainerCreating"
			}
		}
		inits = append(inits, s)
	}
	for _, c := range w.ctrs {
		s := c.status(w.willRestart(pod, c))
		if c.p == nil && c.last == nil && c.waiting == "" {
			if !sandboxReady {
				s.State.Waiting.Reason = "ContainerCreating"
			} else if !w.initDone {
				s.State.Waiting.Reason = "PodInitializing"
			}
		}
		if !s.Ready {
			unready = append(unready, c.spec.Name)
		}
		ctrs = append(ctrs, s)
	}
	for _, c := range w.init {
		if c.sidecar && !(c.p != nil && c.ps.ready.Load()) {
			unready = append(unready, c.spec.Name)
		}
		if !w.initDone && !c.sidecar && !(c.p == nil && c.last != nil && c.last.ExitCode == 0) {
			uninit = append(uninit, c.spec.Name)
		}
	}
	return inits, ctrs, unready, uninit
}

func bracketList(s []string) string { return "[" + strings.Join(s, " ") + "]" }

// conditions are the pod conditions kubelet reports.
func (w *podWorker) conditions(pod *corev1.Pod, phase corev1.PodPhase, sandboxReady bool, unready, uninit []string) []corev1.PodCondition {
	var conds []corev1.PodCondition
	conds = append(conds, w.condition(corev1.PodReadyToStartContainers, sandboxReady && !w.finished, "", ""))
	conds = append(conds, w.condition(corev1.PodInitialized, w.initDone, "ContainersNotInitialized",
		"containers with incomplete status: "+bracketList(uninit)))
	switch {
	case phase == corev1.PodSucceeded || phase == corev1.PodFailed:
		conds = append(conds, w.condition(corev1.ContainersReady, false, "PodCompleted", ""))
		conds = append(conds, w.condition(corev1.PodReady, false, "PodCompleted", ""))
	case len(unready) > 0:
		msg := "containers with unready status: " + bracketList(unready)
		conds = append(conds, w.condition(corev1.ContainersReady, false, "ContainersNotReady", msg))
		conds = append(conds, w.condition(corev1.PodReady, false, "ContainersNotReady", msg))
	default:
		conds = append(conds, w.condition(corev1.ContainersReady, true, "", ""))
		gates := unmetGates(pod)
		conds = append(conds, w.condition(corev1.PodReady, len(gates) == 0, "ReadinessGatesNotReady",
			"corresponding condition of pod readiness gate "+bracketList(gates)+" does not exist or is not True"))
	}
	// kubelet reports PodScheduled too, also for pods bound without the
	// scheduler.
	scheduled := false
	for _, c := range pod.Status.Conditions {
		scheduled = scheduled || c.Type == corev1.PodScheduled
	}
	if !scheduled {
		conds = append(conds, w.condition(corev1.PodScheduled, true, "", ""))
	}
	return conds
}

// unmetGates are the pod's readiness gates whose condition is not True.
func unmetGates(pod *corev1.Pod) []string {
	var gates []string
	for _, g := range pod.Spec.ReadinessGates {
		ok := false
		for _, pc := range pod.Status.Conditions {
			if pc.Type == g.ConditionType && pc.Status == corev1.ConditionTrue {
				ok = true
			}
		}
		if !ok {
			gates = append(gates, string(g.ConditionType))
		}
	}
	return gates
}

var ownConditions = map[corev1.PodConditionType]bool{
	corev1.PodReadyToStartContainers: true, corev1.PodInitialized: true,
	corev1.ContainersReady: true, corev1.PodReady: true,
}

func hasCondition(conds []corev1.PodCondition, t corev1.PodConditionType) bool {
	for _, c := range conds {
		if c.Type == t {
			return true
		}
	}
	return false
}

// writeStatus writes the pod status when it changed, keeping conditions
// other components own (PodScheduled, DisruptionTarget, readiness gates).
func (w *podWorker) writeStatus(ctx context.Context, pod *corev1.Pod) {
	st := w.status(pod)
	b, _ := json.Marshal(st)
	if string(b) == string(w.lastStatus) {
		return
	}
	cur := pod.DeepCopy()
	for i := 0; i < 5; i++ {
		s := st.DeepCopy()
		for _, c := range cur.Status.Conditions {
			if !ownConditions[c.Type] && !hasCondition(s.Conditions, c.Type) {
				s.Conditions = append(s.Conditions, c)
			}
		}
		sort.SliceStable(s.Conditions, func(i, j int) bool { return condOrder(s.Conditions[i].Type) < condOrder(s.Conditions[j].Type) })
		cur.Status = *s
		_, err := w.n.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		if err == nil {
			w.lastStatus = b
			return
		}
		if !apierrors.IsConflict(err) {
			if !apierrors.IsNotFound(err) && ctx.Err() == nil {
				w.logf(pod, "update status: %v", err)
			}
			return
		}
		if cur, err = w.n.client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{}); err != nil || cur.UID != pod.UID {
			return
		}
	}
}

func condOrder(t corev1.PodConditionType) int {
	for i, o := range []corev1.PodConditionType{corev1.PodReadyToStartContainers, corev1.PodInitialized,
		corev1.PodReady, corev1.ContainersReady, corev1.PodScheduled} {
		if t == o {
			return i
		}
	}
	return 10
}
