package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Platform is one os/arch an image is built for; BinDir holds its
// cross-compiled binaries.
type Platform struct {
	OS, Arch string
	BinDir   string
}

func (p Platform) String() string { return p.OS + "/" + p.Arch }

// Build returns the multi-arch index of spec: one image per platform, in
// the order given.
func Build(spec Spec, platforms []Platform, labels Labels, created time.Time) (v1.ImageIndex, error) {
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range platforms {
		img, err := buildImage(spec, p, labels, created)
		if err != nil {
			return nil, fmt.Errorf("image %s for %s: %w", spec.Name, p, err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add: img,
			Descriptor: v1.Descriptor{
				MediaType: types.OCIManifestSchema1,
				Platform:  &v1.Platform{OS: p.OS, Architecture: p.Arch},
			},
		})
	}
	return mutate.Annotations(idx, labels.Map()).(v1.ImageIndex), nil
}

func buildImage(spec Spec, p Platform, labels Labels, created time.Time) (v1.Image, error) {
	content, err := layerTar(spec, p.BinDir, created)
	if err != nil {
		return nil, err
	}
	// Compressed once here (the library would compress again for the
	// digest and for every read); gzip without header time or name, at the
	// default level (level 9 gave 0.4 % less for 60 % more time).
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.DefaultCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(content); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(gz.Bytes())), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History: v1.History{
			Created:   v1.Time{Time: created},
			CreatedBy: fmt.Sprintf("ociimage: %s in %s, /etc/passwd and /etc/group for %s", strings.Join(spec.Binaries, ", "), BinDir, spec.UserString()),
		},
	})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = p.OS, p.Arch
	cf.Created = v1.Time{Time: created}
	cf.Config = v1.Config{
		Entrypoint: spec.Entrypoint(),
		User:       spec.UserString(),
		Env:        []string{"PATH=" + BinDir},
		WorkingDir: "/",
		Labels:     labels.Map(),
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, err
	}
	return mutate.Annotations(img, labels.Map()).(v1.Image), nil
}

// layerTar is the image's one layer: directories, passwd, group and the
// binaries, owned by root, all with the creation time, in a fixed order.
func layerTar(spec Spec, binDir string, created time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	hdr := func(name string, mode int64, typ byte, size int64) *tar.Header {
		return &tar.Header{Name: name, Mode: mode, Typeflag: typ, Size: size, ModTime: created.UTC(), Format: tar.FormatPAX}
	}
	for _, d := range []string{"etc/", "usr/", "usr/local/", strings.TrimPrefix(BinDir, "/") + "/"} {
		if err := tw.WriteHeader(hdr(d, 0o755, tar.TypeDir, 0)); err != nil {
			return nil, err
		}
	}
	files := []struct {
		name string
		mode int64
		data []byte
	}{
		{"etc/passwd", 0o644, []byte(passwd(spec))},
		{"etc/group", 0o644, []byte(group(spec))},
	}
	for _, b := range spec.Binaries {
		data, err := os.ReadFile(filepath.Join(binDir, b))
		if err != nil {
			return nil, fmt.Errorf("binary %s: %w", b, err)
		}
		files = append(files, struct {
			name string
			mode int64
			data []byte
		}{strings.TrimPrefix(BinDir, "/") + "/" + b, 0o755, data})
	}
	for _, f := range files {
		if err := tw.WriteHeader(hdr(f.name, f.mode, tar.TypeReg, int64(len(f.data)))); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// passwd has root and, when the image runs as another UID, that user; no
// login shell exists in the image.
func passwd(s Spec) string {
	out := "root:x:0:0:root:/root:/sbin/nologin\n"
	if s.UID != 0 {
		out += fmt.Sprintf("%s:x:%d:%d:%s:/nonexistent:/sbin/nologin\n", s.User, s.UID, s.GID, s.User)
	}
	return out
}

func group(s Spec) string {
	out := "root:x:0:\n"
	if s.GID != 0 {
		out += fmt.Sprintf("%s:x:%d:\n", s.User, s.GID)
	}
	return out
}
