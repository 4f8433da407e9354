package scenario

import (
	"context"
	"fmt"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
)

// startupTaintPolicyFile holds the MutatingAdmissionPolicy and its binding
// that taint Nodes at CREATE.
const startupTaintPolicyFile = "components/node-startup-taint/admission-policy.yaml"

// installStartupTaintPolicy creates the component's policy and binding and
// waits until the API server applies them; the run's cleanup deletes them
// and waits until new Nodes are left alone again.
func (r *runner) installStartupTaintPolicy(ctx context.Context) error {
	objs, err := readManifests(r.e.Manifests, startupTaintPolicyFile)
	if err != nil {
		return err
	}
	var names []string
	for _, o := range objs {
		if p, ok := o.(*admissionregistrationv1.MutatingAdmissionPolicy); ok {
			names = append(names, p.Name)
		}
	}
	if len(names) != 1 {
		return fmt.Errorf("%s: %d MutatingAdmissionPolicies, want 1", startupTaintPolicyFile, len(names))
	}
	r.onCleanup(func() { r.removeStartupTaintPolicy(names[0]) })
	if err := apply(ctx, r.cs, objs); err != nil {
		return err
	}
	return poll.Until(ctx, 2*time.Minute, waitInterval, func() (bool, error) {
		on, err := r.probeStartupTaint(ctx)
		return err == nil && on, nil
	})
}

func (r *runner) removeStartupTaintPolicy(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	api := r.cs.AdmissionregistrationV1()
	_ = api.MutatingAdmissionPolicyBindings().Delete(ctx, name, metav1.DeleteOptions{})
	_ = api.MutatingAdmissionPolicies().Delete(ctx, name, metav1.DeleteOptions{})
	_ = poll.Until(ctx, 2*time.Minute, waitInterval, func() (bool, error) {
		on, err := r.probeStartupTaint(ctx)
		return err == nil && !on, nil
	})
}

// probeStartupTaint creates a Node in a server-side dry run, labelled as
// kubelet registers a Linux node (the policy taints only nodes the
// installer's nodeSelector targets), and reports whether admission gave it
// the startup taint.
func (r *runner) probeStartupTaint(ctx context.Context) (bool, error) {
	probe := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "race-" + r.id + "-probe", Labels: map[string]string{corev1.LabelOSStable: "linux"}}}
	n, err := r.cs.CoreV1().Nodes().Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		return false, err
	}
	for _, t := range n.Spec.Taints {
		if t.Key == annotations.TaintCNINotReady {
			return true, nil
		}
	}
	return false, nil
}
