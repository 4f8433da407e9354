package manifests

import (
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

// TestVerifierDaemonSet checks the node verifier's DaemonSet in every
// overlay and in repair-only: its own identity, every node, the node's root
// read-only with host-to-container propagation (netns bind mounts made
// after it started), the flags pointing below that mount, and exactly the
// capabilities it needs.
func TestVerifierDaemonSet(t *testing.T) {
	dirs := map[string]string{"repair-only": "overlays/repair-only"}
	for _, ov := range overlayNames() {
		dirs[ov] = overlays[ov]
	}
	for ov, dir := range dirs {
		t.Run(ov, func(t *testing.T) {
			objs := build(t, filepath.Join(manifestsDir(t), dir))
			var ds appsv1.DaemonSet
			decodeStrict(t, find(t, objs, "DaemonSet", verifierName), &ds)
			ps := ds.Spec.Template.Spec
			if ps.ServiceAccountName != verifierName {
				t.Errorf("serviceAccountName %q, want %q", ps.ServiceAccountName, verifierName)
			}
			if ps.AutomountServiceAccountToken != nil && !*ps.AutomountServiceAccountToken {
				t.Error("the verifier needs its pod-bound token (its admission policy requires the node it names)")
			}
			if !ps.HostNetwork {
				t.Error("hostNetwork: the verifier runs before and without the pod network")
			}
			taint := corev1.Taint{Key: startupTaintKey, Effect: corev1.TaintEffectNoSchedule}
			if !slices.ContainsFunc(ps.Tolerations, func(tol corev1.Toleration) bool { return tol.ToleratesTaint(klog.Background(), &taint, false) }) {
				t.Error("the startup taint is not tolerated: the verifier must report on nodes whose chain is not ready")
			}
			if len(ps.Containers) != 1 {
				t.Fatalf("%d containers, want 1", len(ps.Containers))
			}
			c := ps.Containers[0]
			checkImage(t, c.Image, "consul-cni-installer")
			if len(c.Command) != 1 || c.Command[0] != "consul-cni-verifier" {
				t.Errorf("command %v, want [consul-cni-verifier]", c.Command)
			}
			root := oneFlag(t, c.Args, "host-root")
			var mount *corev1.VolumeMount
			for i := range c.VolumeMounts {
				if c.VolumeMounts[i].MountPath == root {
					mount = &c.VolumeMounts[i]
				}
			}
			if mount == nil {
				t.Fatalf("--host-root=%s is not a mount", root)
			}
			if !mount.ReadOnly || mount.MountPropagation == nil || *mount.MountPropagation != corev1.MountPropagationHostToContainer {
				t.Errorf("mount %s: want read-only with HostToContainer propagation", root)
			}
			for _, v := range ps.Volumes {
				if v.Name == mount.Name && (v.HostPath == nil || v.HostPath.Path != "/") {
					t.Errorf("volume %s: want hostPath /", v.Name)
				}
			}
			for _, f := range []string{"cri-socket", "cni-net-dir"} {
				if v := oneFlag(t, c.Args, f); !strings.HasPrefix(v, root+"/") {
					t.Errorf("--%s=%s is not below --host-root=%s", f, v, root)
				}
			}
			if len(c.Env) != 1 || c.Env[0].Name != "NODE_NAME" || c.Env[0].ValueFrom == nil || c.Env[0].ValueFrom.FieldRef == nil ||
				c.Env[0].ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
				t.Errorf("env %+v: want NODE_NAME from spec.nodeName", c.Env)
			}
			port := strings.TrimPrefix(oneFlag(t, c.Args, "metrics-bind-address"), ":")
			if lp := c.LivenessProbe; lp == nil || lp.HTTPGet == nil || lp.HTTPGet.Path != "/healthz" || strconv.Itoa(lp.HTTPGet.Port.IntValue()) != port {
				t.Errorf("liveness probe %+v: want /healthz on the metrics port %s", lp, port)
			}
			sc := c.SecurityContext
			if sc == nil || (sc.Privileged != nil && *sc.Privileged) || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
				sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
				t.Fatal("the verifier needs neither privileged mode nor privilege escalation, and writes nothing")
			}
			var add []string
			for _, c := range sc.Capabilities.Add {
				add = append(add, string(c))
			}
			slices.Sort(add)
			if strings.Join(add, ",") != "NET_ADMIN,NET_RAW,SYS_ADMIN,SYS_CHROOT" || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
				t.Errorf("capabilities %+v: want ALL dropped, SYS_ADMIN, NET_ADMIN, NET_RAW and SYS_CHROOT added", sc.Capabilities)
			}
		})
	}
}
