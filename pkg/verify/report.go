package verify

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/cri"
)

// EventReasonUnredirected is the reason of the Warning Event on a pod whose
// current sandbox was verified without its redirect rules.
const EventReasonUnredirected = "UnredirectedSandbox"

// Component is the Events' source.
const Component = "consul-cni-verifier"

// KubeReporter publishes verdicts through the API: the pod condition and the
// Event (pods/status patch, events create) and the Node condition
// (nodes/status patch), from one goroutine (Run) so that a slow API never
// holds a pass up; what is pending is the latest state, not a queue of
// every change. It also keeps the Metrics.
type KubeReporter struct {
	client   kubernetes.Interface
	node     string
	recorder record.EventRecorder
	metrics  *Metrics
	now      func() time.Time

	mu   sync.Mutex
	pods map[types.UID]PodResult // condition patches to send
	sum  *Summary                // the latest node summary
	wake chan struct{}

	// written is the Node condition last written and when (heartbeat).
	written   *corev1.NodeCondition
	writtenAt time.Time
}

// NewKubeReporter returns a reporter for node.
func NewKubeReporter(client kubernetes.Interface, node string, recorder record.EventRecorder, m *Metrics) *KubeReporter {
	return &KubeReporter{client: client, node: node, recorder: recorder, metrics: m, now: time.Now,
		pods: map[types.UID]PodResult{}, wake: make(chan struct{}, 1)}
}

func (r *KubeReporter) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Pod implements Reporter.
func (r *KubeReporter) Pod(p PodResult) {
	r.mu.Lock()
	r.pods[types.UID(p.Sandbox.PodUID)] = p
	r.mu.Unlock()
	r.metrics.Inspected(p.Verdict)
	if p.Verdict == Unredirected {
		r.recorder.Eventf(podRef(p.Sandbox), corev1.EventTypeWarning, EventReasonUnredirected,
			"Sandbox %s of this pod has no Consul traffic redirection in its network namespace (%s): its traffic bypasses the proxy. %s",
			shortID(p.Sandbox.ID), p.Reason, p.Detail)
	}
	r.signal()
}

// Gone implements Reporter.
func (r *KubeReporter) Gone(s cri.Sandbox) {
	r.mu.Lock()
	delete(r.pods, types.UID(s.PodUID))
	r.mu.Unlock()
}

// Node implements Reporter.
func (r *KubeReporter) Node(s Summary) {
	r.metrics.Summary(s)
	r.mu.Lock()
	r.sum = &s
	r.mu.Unlock()
	r.signal()
}

// Run sends what is pending until ctx ends; failed writes are retried.
func (r *KubeReporter) Run(ctx context.Context) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		r.flush(ctx)
		select {
		case <-ctx.Done():
			return
		case <-r.wake:
		case <-t.C:
		}
	}
}

func (r *KubeReporter) flush(ctx context.Context) {
	log := klog.FromContext(ctx)
	r.mu.Lock()
	pods := r.pods
	r.pods = map[types.UID]PodResult{}
	sum := r.sum
	r.mu.Unlock()
	for uid, p := range pods {
		err := r.patchPod(ctx, p)
		switch {
		case err == nil:
		case apierrors.IsNotFound(err) || apierrors.IsInvalid(err) || apierrors.IsConflict(err):
			// The pod is gone or was replaced under the same name.
		default:
			log.Error(err, "Writing the pod condition failed; retrying", "pod", klog.KRef(p.Sandbox.PodNamespace, p.Sandbox.PodName))
			r.mu.Lock()
			if _, newer := r.pods[uid]; !newer {
				r.pods[uid] = p
			}
			r.mu.Unlock()
		}
	}
	if sum != nil {
		if err := r.writeNode(ctx, *sum); err != nil {
			log.Error(err, "Writing the node condition failed; retrying", "node", r.node)
		}
	}
}

// PodCondition is the condition written for a verdict.
func PodCondition(p PodResult, now time.Time) corev1.PodCondition {
	st := corev1.ConditionUnknown
	switch p.Verdict {
	case Redirected:
		st = corev1.ConditionTrue
	case Unredirected:
		st = corev1.ConditionFalse
	}
	reason := p.Reason
	if reason == "" {
		reason = "Unverifiable"
	}
	msg := "sandbox " + shortID(p.Sandbox.ID)
	if p.Backend != "" {
		msg += ": " + p.Backend + " rules as configured"
	}
	if p.Detail != "" {
		msg += ": " + p.Detail
	}
	if len(msg) > 1024 {
		msg = msg[:1021] + "..."
	}
	t := metav1.NewTime(now)
	return corev1.PodCondition{Type: annotations.ConditionRedirectVerified, Status: st, Reason: reason, Message: msg,
		LastProbeTime: t, LastTransitionTime: t}
}

func (r *KubeReporter) patchPod(ctx context.Context, p PodResult) error {
	patch, err := json.Marshal(map[string]any{
		// The UID makes the patch fail on a pod recreated under the name.
		"metadata": map[string]any{"uid": p.Sandbox.PodUID},
		"status":   map[string]any{"conditions": []corev1.PodCondition{PodCondition(p, r.now())}},
	})
	if err != nil {
		return err
	}
	_, err = r.client.CoreV1().Pods(p.Sandbox.PodNamespace).Patch(ctx, p.Sandbox.PodName, types.StrategicMergePatchType,
		patch, metav1.PatchOptions{FieldManager: Component}, "status")
	return err
}

// NodeCondition is the Node condition for a summary.
func NodeCondition(s Summary) corev1.NodeCondition {
	c := corev1.NodeCondition{Type: annotations.NodeConditionCNIVerified}
	pods := fmt.Sprintf("%d injected pods verified with their redirect rules, %d without, %d not verifiable", s.Redirected, s.Unredirected, s.Unknown)
	switch {
	case s.Chain != nil && !s.Chain.OK:
		c.Status, c.Reason, c.Message = corev1.ConditionFalse, annotations.ReasonChainMissing, s.Chain.Detail+"; "+pods
	case s.Unredirected > 0:
		c.Status, c.Reason, c.Message = corev1.ConditionFalse, annotations.ReasonPodsUnredirected, pods
	case s.Unknown > 0:
		c.Status, c.Reason, c.Message = corev1.ConditionFalse, annotations.ReasonPodsUnverified, pods
	default:
		c.Status, c.Reason, c.Message = corev1.ConditionTrue, annotations.ReasonNodeVerified, pods
		if s.Chain != nil {
			c.Message = "consul-cni is last in the runtime's CNI chain; " + pods
		}
	}
	return c
}

// writeNode writes the Node condition when it changed or its heartbeat is
// due.
func (r *KubeReporter) writeNode(ctx context.Context, s Summary) error {
	want := NodeCondition(s)
	now := r.now()
	if r.written != nil && r.written.Status == want.Status && r.written.Reason == want.Reason &&
		r.written.Message == want.Message && now.Sub(r.writtenAt) < annotations.NodeConditionHeartbeat {
		return nil
	}
	want.LastHeartbeatTime = metav1.NewTime(now)
	want.LastTransitionTime = want.LastHeartbeatTime
	if r.written != nil && r.written.Status == want.Status {
		want.LastTransitionTime = r.written.LastTransitionTime
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{want}}})
	if err != nil {
		return err
	}
	if _, err := r.client.CoreV1().Nodes().Patch(ctx, r.node, types.StrategicMergePatchType, patch,
		metav1.PatchOptions{FieldManager: Component}, "status"); err != nil {
		return err
	}
	r.written, r.writtenAt = &want, now
	return nil
}

func podRef(s cri.Sandbox) *corev1.ObjectReference {
	return &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: s.PodNamespace, Name: s.PodName, UID: types.UID(s.PodUID)}
}

func shortID(id string) string {
	if len(id) > 13 {
		return id[:13]
	}
	return id
}
