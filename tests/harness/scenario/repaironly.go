package scenario

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/consulk8s"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
)

// Profile is what chains consul-cni on the run's node.
type Profile string

const (
	// ProfileDefault: this project's installer DaemonSet chains this
	// project's plugin; the controller is the kustomize base's.
	ProfileDefault Profile = ""
	// ProfileRepairOnly: consul-k8s's own CNI DaemonSet (namespace consul,
	// labels app=consul, component=cni) runs consul-k8s's real install-cni,
	// which chains consul-k8s's real consul-cni; the controller is the
	// repair-only overlay's (node readiness from consul-k8s's CNI pod),
	// and nothing of this project's installer is on the cluster.
	ProfileRepairOnly Profile = "repair-only"
)

// consul-k8s's CNI DaemonSet as its chart makes it for release "consul".
const (
	consulK8sNamespace = "consul"
	consulK8sAccount   = "consul-cni"
	// consulK8sContainer is the chart's container name.
	consulK8sContainer = "install-cni"
)

var consulK8sLabels = map[string]string{"app": "consul", "chart": "consul-helm", "release": "consul", "component": "cni"}

// RepairOnlyArgs are the controller's flags the repair-only overlay sets.
var RepairOnlyArgs = []string{"--cni-namespace=" + consulK8sNamespace, "--cni-pod-selector=app=consul,component=cni"}

// containerNamespaces is a node on which a process of the test can run as
// a privileged hostNetwork container of the node does.
type containerNamespaces interface {
	// ContainerNamespaces returns the mount namespace (a /proc/<pid>/ns/mnt
	// path) and the network namespace of such a container, and the API
	// server as it reaches it.
	ContainerNamespaces() (mountNS, netNS, apiServer string)
}

// consulK8sObjects are consul-k8s's CNI ServiceAccount, the rights of its
// chart's ClusterRole, and its DaemonSet pinned to the run's node. The
// DaemonSet's container idles: the test runs consul-k8s's install-cni in
// that pod's stead, in the node's namespaces with the pod's token
// (startConsulK8s), since the program is not built for the node's images.
func (r *runner) consulK8sObjects() []runtime.Object {
	role := "consul-k8s-cni"
	img := r.e.Nodes.PodImages()
	return []runtime.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: consulK8sNamespace}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: consulK8sAccount, Namespace: consulK8sNamespace}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: role},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch", "patch", "update"}}}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: consulK8sNamespace, Name: consulK8sAccount}}},
		&appsv1.DaemonSet{
			ObjectMeta: metav1.ObjectMeta{Name: "consul-cni-" + r.id, Namespace: consulK8sNamespace, Labels: consulK8sLabels},
			Spec: appsv1.DaemonSetSpec{
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "consul", "component": "cni", nodeLabel: r.id}},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: mergeLabels(consulK8sLabels, map[string]string{nodeLabel: r.id}),
						Annotations: map[string]string{"consul.hashicorp.com/connect-inject": "false"}},
					Spec: corev1.PodSpec{
						ServiceAccountName:            consulK8sAccount,
						NodeSelector:                  map[string]string{nodeLabel: r.id},
						Tolerations:                   []corev1.Toleration{{Key: "CriticalAddonsOnly", Operator: corev1.TolerationOpExists}, {Effect: corev1.TaintEffectNoExecute, Operator: corev1.TolerationOpExists}},
						PriorityClassName:             "system-node-critical",
						TerminationGracePeriodSeconds: ptr.To(int64(5)),
						Containers: []corev1.Container{{
							Name: consulK8sContainer, Image: img.App, ImagePullPolicy: corev1.PullNever, Args: []string{"idle"},
						}},
					},
				},
			},
		},
	}
}

func mergeLabels(a, b map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range []map[string]string{a, b} {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// consulK8sRun is consul-k8s's installer of the run: its pod and the
// process running in its stead.
type consulK8sRun struct {
	pod       *corev1.Pod
	container string // the pod's container ID the process stands for
	tokenFile string
	inst      *consulk8s.Installer
}

// startConsulK8s deploys consul-k8s's CNI DaemonSet on the run's node and,
// once its pod's container runs, consul-k8s's install-cni with the pod's
// token, in the node's mount and network namespaces, with the flags of
// consul-k8s's chart: it copies consul-k8s's plugin to the node and chains
// it (at once on a node without a plugin binary; 100 s later on one that
// has one, as its binary watcher waits for the old binary to go).
func (r *runner) startConsulK8s(ctx context.Context) error {
	if r.cfg.ConsulK8s == nil {
		return errors.New("the repair-only profile needs consul-k8s's binaries (Config.ConsulK8s)")
	}
	if _, ok := r.node.(containerNamespaces); !ok {
		return fmt.Errorf("the repair-only profile runs consul-k8s's installer on real nodes, not on %s nodes", r.e.Nodes.Kind())
	}
	if r.consulK8s == nil {
		objs := r.consulK8sObjects()
		if err := apply(ctx, r.cs, objs); err != nil {
			return err
		}
		ds := objs[len(objs)-1].(*appsv1.DaemonSet)
		r.onCleanup(func() { r.stopConsulK8s(ds.Name) })
		r.consulK8s = &consulK8sRun{}
	}
	return r.runConsulK8s(ctx)
}

// runConsulK8s waits for the pod's container to run (a new one after a
// reboot) and starts install-cni in its stead.
func (r *runner) runConsulK8s(ctx context.Context) error {
	ck := r.consulK8s
	if err := poll.Until(ctx, 3*time.Minute, waitInterval, func() (bool, error) {
		l, err := r.cs.CoreV1().Pods(consulK8sNamespace).List(ctx, metav1.ListOptions{LabelSelector: nodeLabel + "=" + r.id})
		if err != nil || len(l.Items) != 1 {
			return false, nil
		}
		p := &l.Items[0]
		for _, s := range p.Status.ContainerStatuses {
			if s.Name == consulK8sContainer && s.State.Running != nil && s.ContainerID != ck.container {
				ck.pod, ck.container = p, s.ContainerID
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		return fmt.Errorf("consul-k8s's CNI pod on %s did not run: %w", r.node.Name(), err)
	}
	if err := r.consulK8sToken(ctx); err != nil {
		return err
	}
	mnt, netns, api := r.node.(containerNamespaces).ContainerNamespaces()
	log, err := os.OpenFile(filepath.Join(r.dir, "consul-k8s-install-cni.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	ck.inst, err = consulk8s.Start(*r.cfg.ConsulK8s, consulk8s.Options{
		BinDir: "/opt/cni/bin", NetDir: "/etc/cni/net.d", InstallationID: string(ck.pod.UID),
		Server: api, CA: r.e.Cluster.CAData, TokenFile: ck.tokenFile, MountNS: mnt, NetNS: netns, Log: log,
	})
	log.Close()
	if err != nil {
		return err
	}
	r.logf("consul-k8s's install-cni runs for pod %s/%s (container %s)", consulK8sNamespace, ck.pod.Name, ck.container)
	return nil
}

// consulK8sToken writes a token of consul-k8s's CNI ServiceAccount bound to
// its pod, as kubelet projects it into the container.
func (r *runner) consulK8sToken(ctx context.Context) error {
	ck := r.consulK8s
	tr, err := r.cs.CoreV1().ServiceAccounts(consulK8sNamespace).CreateToken(ctx, consulK8sAccount, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: ptr.To(int64(3600)),
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: ck.pod.Name, UID: ck.pod.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("token of %s/%s bound to pod %s: %w", consulK8sNamespace, consulK8sAccount, ck.pod.Name, err)
	}
	dir := filepath.Join(r.dir, "consul-k8s-sa")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	ck.tokenFile = filepath.Join(dir, "token")
	return os.WriteFile(ck.tokenFile, []byte(tr.Status.Token), 0o600)
}

// killConsulK8s ends consul-k8s's installer without its cleanup, as a node
// that loses power does.
func (r *runner) killConsulK8s() {
	if ck := r.consulK8s; ck != nil && ck.inst != nil {
		ck.inst.Kill()
		ck.inst = nil
	}
}

// stopConsulK8s stops consul-k8s's installer (SIGTERM: its cleanup runs),
// then deletes its DaemonSet.
func (r *runner) stopConsulK8s(name string) {
	if ck := r.consulK8s; ck != nil && ck.inst != nil {
		ck.inst.Stop(10 * time.Second)
	}
	if b, err := os.ReadFile(filepath.Join(r.dir, "consul-k8s-install-cni.log")); err == nil {
		r.logf("consul-k8s's install-cni log:\n%s", tail(string(b), 25))
	}
	if err := r.deleteWorkload(consulK8sNamespace, name, true); err != nil {
		r.logf("cleanup: %v", err)
	}
}
