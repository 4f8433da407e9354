package ociimage

import (
	"archive/tar"
	"errors"
	"io"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// File is one entry of an image's flattened file system.
type File struct {
	Header *tar.Header
	Data   []byte
}

// Files returns the image's flattened file system by path (as in the layer
// tar, without a leading "/").
func Files(img v1.Image) (map[string]File, error) {
	rc := mutate.Extract(img)
	defer rc.Close()
	out := map[string]File{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return nil, err
		}
		out[h.Name] = File{Header: h, Data: data}
	}
}
