package scenario

import (
	"context"

	"k8s.io/client-go/kubernetes"
)

// ApplyManifests creates the objects of files under the manifests
// directory dir (plain resources of the kustomize base, read as they are);
// objects that exist are left as they are.
func ApplyManifests(ctx context.Context, cs kubernetes.Interface, dir string, files ...string) error {
	objs, err := readManifests(dir, files...)
	if err != nil {
		return err
	}
	return apply(ctx, cs, objs)
}
