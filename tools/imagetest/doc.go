// Package imagetest checks the built image archives (make images): their
// contents for every platform, and, with podman, that the images of this
// machine's platform run as the manifests expect.
//
//	make test-images
package imagetest
