package audit

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
)

// Checks turn the audit into a test of the install, as the chart's `helm
// test` runs it: is the controller working (a leader holds its Lease and
// renews it) and, where it acts with node readiness, is every node whose
// CNI pod is Ready labelled ready. They only read.
type Checks struct {
	// Lease is NAMESPACE/NAME of the controller's leader-election Lease;
	// empty: not checked.
	Lease string
	// NodeReadiness checks the readiness label of every node with a Ready
	// CNI pod (--cni-namespace, --cni-pod-selector).
	NodeReadiness bool
	// Timeout: how long to repeat the checks until they pass (0: once).
	Timeout time.Duration
}

// enabled tells whether any check was asked for.
func (c Checks) enabled() bool { return c.Lease != "" || c.NodeReadiness }

// validate checks the flags' values.
func (c Checks) validate() error {
	if c.Lease != "" {
		if ns, name, ok := strings.Cut(c.Lease, "/"); !ok || ns == "" || name == "" || strings.Contains(name, "/") {
			return fmt.Errorf("--controller-lease: %q is not NAMESPACE/NAME", c.Lease)
		}
	}
	if c.Timeout < 0 {
		return fmt.Errorf("--checks-timeout: %v must not be negative", c.Timeout)
	}
	return nil
}

// checkInterval is the pause between two rounds of checks.
var checkInterval = 2 * time.Second

// runChecks repeats the checks until they all pass or the timeout ends; it
// writes what each found to w and returns the failures of the last round.
func runChecks(ctx context.Context, client kubernetes.Interface, o *Options, w io.Writer) ([]string, error) {
	deadline := time.Now().Add(o.Checks.Timeout)
	for {
		passed, failed, err := checkOnce(ctx, client, o, time.Now())
		if err != nil {
			return nil, err
		}
		if len(failed) == 0 || !time.Now().Add(checkInterval).Before(deadline) {
			for _, s := range passed {
				fmt.Fprintf(w, "ok: %s\n", s)
			}
			for _, s := range failed {
				fmt.Fprintf(w, "FAIL: %s\n", s)
			}
			return failed, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(checkInterval):
		}
	}
}

// checkOnce runs every check asked for once.
func checkOnce(ctx context.Context, client kubernetes.Interface, o *Options, now time.Time) (passed, failed []string, err error) {
	add := func(ok bool, s string) {
		if ok {
			passed = append(passed, s)
		} else {
			failed = append(failed, s)
		}
	}
	if o.Checks.Lease != "" {
		ok, s, err := checkLease(ctx, client, o.Checks.Lease, now)
		if err != nil {
			return nil, nil, err
		}
		add(ok, s)
	}
	if o.Checks.NodeReadiness {
		ok, s, err := checkNodeReadiness(ctx, client, o)
		if err != nil {
			return nil, nil, err
		}
		add(ok, s)
	}
	return passed, failed, nil
}

// checkLease: the Lease has a holder that renewed it within its duration.
func checkLease(ctx context.Context, client kubernetes.Interface, ref string, now time.Time) (bool, string, error) {
	ns, name, _ := strings.Cut(ref, "/")
	l, err := client.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, fmt.Sprintf("controller: no Lease %s: no controller has led yet", ref), nil
	}
	if err != nil {
		return false, "", fmt.Errorf("controller Lease %s: %w", ref, err)
	}
	holder := ""
	if l.Spec.HolderIdentity != nil {
		holder = *l.Spec.HolderIdentity
	}
	if holder == "" || l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		return false, fmt.Sprintf("controller: Lease %s has no leader (holder %q): no controller is acting", ref, holder), nil
	}
	age := now.Sub(l.Spec.RenewTime.Time)
	duration := time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	if age > duration {
		return false, fmt.Sprintf("controller: Lease %s last renewed by %s %v ago, longer than its duration %v: the leader stopped", ref, holder, age.Round(time.Second), duration), nil
	}
	return true, fmt.Sprintf("controller: Lease %s held by %s, renewed %v ago", ref, holder, age.Round(time.Second)), nil
}

// checkNodeReadiness: there is a Ready CNI pod, and every node with one
// carries the readiness label.
func checkNodeReadiness(ctx context.Context, client kubernetes.Interface, o *Options) (bool, string, error) {
	pods, err := client.CoreV1().Pods(o.Config.CNINamespace).List(ctx, metav1.ListOptions{LabelSelector: o.Config.CNIPodSelector})
	if err != nil {
		return false, "", fmt.Errorf("listing the CNI pods: %w", err)
	}
	ready, unlabelled := 0, []string{}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName == "" || p.DeletionTimestamp != nil || !podReady(p) {
			continue
		}
		ready++
		n, err := client.CoreV1().Nodes().Get(ctx, p.Spec.NodeName, metav1.GetOptions{})
		if err != nil {
			return false, "", fmt.Errorf("node %s: %w", p.Spec.NodeName, err)
		}
		if n.Labels[annotations.LabelCNIReady] != annotations.LabelCNIReadyValue {
			unlabelled = append(unlabelled, n.Name)
		}
	}
	where := fmt.Sprintf("CNI pods %s in %s", o.Config.CNIPodSelector, o.Config.CNINamespace)
	switch {
	case ready == 0:
		return false, fmt.Sprintf("node readiness: no Ready pod of the %s: nothing to label", where), nil
	case len(unlabelled) > 0:
		return false, fmt.Sprintf("node readiness: %d of %d nodes with a Ready pod of the %s lack the label %s=%s: %s",
			len(unlabelled), ready, where, annotations.LabelCNIReady, annotations.LabelCNIReadyValue, strings.Join(unlabelled, ", ")), nil
	}
	return true, fmt.Sprintf("node readiness: the %d nodes with a Ready pod of the %s are labelled %s=%s", ready, where,
		annotations.LabelCNIReady, annotations.LabelCNIReadyValue), nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
