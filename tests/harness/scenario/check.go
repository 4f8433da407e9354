package scenario

import (
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// checkExample is the documented injected Deployment with the
// init-container check; the runs take its check container and volume as
// they are.
const checkExample = "../docs/examples/init-check/app.yaml"

// withCheck puts the init-container check of the documented example first
// in the pod (before consul-k8s's own init container), with the image of
// the node kind, and adds the example's volumes the check mounts.
func (r *runner) withCheck(tmpl *corev1.PodTemplateSpec) error {
	objs, err := readManifests(r.e.Manifests, checkExample)
	if err != nil {
		return err
	}
	var ex *appsv1.Deployment
	for _, o := range objs {
		if d, ok := o.(*appsv1.Deployment); ok {
			ex = d
		}
	}
	if ex == nil || len(ex.Spec.Template.Spec.InitContainers) == 0 {
		return fmt.Errorf("%s: no Deployment with an init container", checkExample)
	}
	check := ex.Spec.Template.Spec.InitContainers[0]
	if img := r.e.Nodes.PodImages().Check; img != "" {
		check.Image = img
		check.ImagePullPolicy = corev1.PullNever
	}
	mounted := map[string]bool{}
	for _, m := range check.VolumeMounts {
		mounted[m.Name] = true
	}
	spec := &tmpl.Spec
	for _, v := range ex.Spec.Template.Spec.Volumes {
		if mounted[v.Name] {
			spec.Volumes = append(spec.Volumes, v)
		}
	}
	spec.InitContainers = append([]corev1.Container{check}, spec.InitContainers...)
	return nil
}
