package scenario

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/proc"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

// controllerManifests are the controller's files of the kustomize base the
// Deployment form applies (RBAC, admission policies, action, Deployment).
var controllerManifests = []string{"base/namespace.yaml", "base/controller/rbac.yaml", "base/controller/admission-policy.yaml",
	"base/controller/action.yaml", "base/controller/deployment.yaml"}

// startController starts the repair controller with node readiness on and
// the run's flags: as the manifests' Deployment when the node kind runs it
// (ControllerPod) and the run does not ask for it outside, else as a
// process of the test with the admin kubeconfig.
func (r *runner) startController(ctx context.Context) error {
	args := []string{"--min-pod-age=" + r.cfg.MinPodAge.String()}
	if r.cfg.Mode == SandboxRecreated || r.cfg.Mode == NodeReboot {
		args = append(args, "--sandbox-slack="+r.cfg.SandboxSlack.String())
	}
	if r.cfg.Profile == ProfileRepairOnly {
		args = append(args, RepairOnlyArgs...)
	}
	args = append(args, r.cfg.RepairArgs...)
	exited := func() error { return nil }
	var err error
	if r.e.Nodes.ControllerPod() && !r.cfg.ControllerOutside {
		err = r.controllerDeployment(ctx, args)
	} else {
		exited, err = r.controllerProcess(args)
	}
	if err != nil {
		return err
	}
	return poll.Until(ctx, 2*time.Minute, waitInterval, func() (bool, error) {
		if err := exited(); err != nil {
			return false, err
		}
		url := r.metricsURL(ctx)
		if url == "" {
			return false, nil
		}
		resp, err := http.Get(url)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}

// controllerProcess runs the controller as a process, its metrics on a
// free port of 127.0.0.1; the returned function reports its exit.
func (r *runner) controllerProcess(args []string) (func() error, error) {
	port, err := testnet.FreePort()
	if err != nil {
		return nil, err
	}
	url := fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
	r.metricsURL = func(context.Context) string { return url }
	args = append([]string{"--kubeconfig=" + r.e.Cluster.Kubeconfig, "--leader-elect=false", "--health-probe-bind-address=0",
		fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", port)}, args...)
	logFile := filepath.Join(r.dir, "repair.log")
	f, err := os.Create(logFile)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cmd := exec.Command(r.e.Bins.Repair, args...)
	cmd.Stdout, cmd.Stderr = f, f
	p, err := proc.Start(cmd, "")
	if err != nil {
		return nil, err
	}
	r.controller = p
	r.onCleanup(func() {
		p.Stop(10 * time.Second)
		if b, err := os.ReadFile(logFile); err == nil {
			r.logf("repair controller log:\n%s", tail(string(b), 40))
		}
	})
	r.logf("repair controller started: %s %s", r.e.Bins.Repair, strings.Join(args, " "))
	return func() error {
		select {
		case <-p.Done():
			b, _ := os.ReadFile(logFile)
			return fmt.Errorf("repair controller exited: %v\n%s", p.Err(), tail(string(b), 30))
		default:
			return nil
		}
	}, nil
}

// controllerDeployment applies the controller's manifests with its
// Deployment pinned to the run's node, one replica and the run's flags
// added, and what the node kind changes (Controller). Its metrics are read
// at its pod's address on the port of the manifest's
// --metrics-bind-address.
func (r *runner) controllerDeployment(ctx context.Context, args []string) error {
	objs, err := readManifests(r.e.Manifests, controllerManifests...)
	if err != nil {
		return err
	}
	for _, o := range objs {
		d, ok := o.(*appsv1.Deployment)
		if !ok {
			continue
		}
		d.Spec.Replicas = ptr.To(int32(1))
		spec := &d.Spec.Template.Spec
		if spec.NodeSelector == nil {
			spec.NodeSelector = map[string]string{}
		}
		spec.NodeSelector[nodeLabel] = r.id
		c := &spec.Containers[0]
		c.Args = withFlags(c.Args, args)
		port := flagValue(c.Args, "--metrics-bind-address")
		if i := strings.LastIndexByte(port, ':'); i >= 0 {
			port = port[i+1:]
		}
		if port == "" || port == "0" {
			return fmt.Errorf("%s: the controller serves no metrics (--metrics-bind-address %q)", "base/controller/deployment.yaml", port)
		}
		if err := r.e.Nodes.Controller(r.node, spec); err != nil {
			return err
		}
		sel := metav1.FormatLabelSelector(d.Spec.Selector)
		r.metricsURL = func(ctx context.Context) string {
			l, err := r.cs.CoreV1().Pods(d.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel, FieldSelector: "spec.nodeName=" + r.node.Name()})
			if err != nil {
				return ""
			}
			for _, p := range l.Items {
				if p.DeletionTimestamp == nil && p.Status.PodIP != "" {
					return "http://" + net.JoinHostPort(p.Status.PodIP, port) + "/metrics"
				}
			}
			return ""
		}
		r.onCleanup(func() {
			r.logf("repair controller log:%s", r.containerLogs(d.Namespace, c.Name, 40))
			if err := r.deleteWorkload(d.Namespace, d.Name, false); err != nil {
				r.logf("cleanup: %v", err)
			}
		})
		r.logf("repair controller Deployment %s/%s: %s", d.Namespace, d.Name, strings.Join(c.Args, " "))
	}
	return apply(ctx, r.cs, objs)
}

// withFlags returns args with every flag of extra set to extra's value
// (the manifest's value of the same flag is dropped).
func withFlags(args, extra []string) []string {
	name := func(a string) string { n, _, _ := strings.Cut(a, "="); return n }
	set := map[string]bool{}
	for _, a := range extra {
		set[name(a)] = true
	}
	var out []string
	for _, a := range args {
		if !set[name(a)] {
			out = append(out, a)
		}
	}
	return append(out, extra...)
}

// flagValue is the value of --flag=value in args (empty when absent).
func flagValue(args []string, flag string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v
		}
	}
	return ""
}

// deleteWorkload deletes the run's DaemonSet (daemonSet) or Deployment
// and waits until its pods on the node are gone, so that the node can
// finalize them before it stops.
func (r *runner) deleteWorkload(ns, name string, daemonSet bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	kind := "Deployment"
	del := metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)}
	get := func() error { _, err := r.cs.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{}); return err }
	var err error
	if daemonSet {
		kind = "DaemonSet"
		err = r.cs.AppsV1().DaemonSets(ns).Delete(ctx, name, del)
		get = func() error { _, err := r.cs.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{}); return err }
	} else {
		err = r.cs.AppsV1().Deployments(ns).Delete(ctx, name, del)
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting %s %s/%s: %w", kind, ns, name, err)
	}
	if err := poll.Until(ctx, time.Minute, waitInterval, func() (bool, error) {
		l, err := r.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + r.node.Name()})
		if err != nil {
			return false, nil
		}
		for _, p := range l.Items {
			if isOwnedBy(&p, name, daemonSet) {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		return fmt.Errorf("waiting for the pods of %s %s/%s to go: %w", kind, ns, name, err)
	}
	if err := poll.Until(ctx, time.Minute, waitInterval, func() (bool, error) {
		return apierrors.IsNotFound(get()), nil
	}); err != nil {
		return fmt.Errorf("waiting for %s %s/%s to go: %w", kind, ns, name, err)
	}
	return nil
}

// isOwnedBy reports whether the pod belongs to the DaemonSet name, or
// (daemonSet false) to a ReplicaSet of the Deployment name.
func isOwnedBy(p *corev1.Pod, name string, daemonSet bool) bool {
	for _, o := range p.OwnerReferences {
		if daemonSet && o.Kind == "DaemonSet" && o.Name == name {
			return true
		}
		hash, ok := strings.CutPrefix(o.Name, name+"-")
		if !daemonSet && o.Kind == "ReplicaSet" && ok && !strings.Contains(hash, "-") {
			return true
		}
	}
	return false
}
