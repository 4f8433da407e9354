package ociimage

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Annotation keys naming the image in an archive's index.json: the OCI one
// (read by podman/skopeo) and containerd's (read by `ctr images import`).
const (
	AnnotationRefName        = "org.opencontainers.image.ref.name"
	AnnotationContainerdName = "io.containerd.image.name"
)

// WriteArchive writes idx as an OCI archive to path: oci-layout,
// index.json (one entry, idx, named ref) and every blob, in a fixed order
// with the creation time, so equal inputs give equal bytes.
func WriteArchive(path string, idx v1.ImageIndex, ref string, created time.Time) error {
	blobs, err := collectBlobs(idx)
	if err != nil {
		return err
	}
	desc, err := partial.Descriptor(idx)
	if err != nil {
		return err
	}
	desc.Annotations = map[string]string{AnnotationRefName: ref, AnnotationContainerdName: ref}
	top, err := json.Marshal(v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex, Manifests: []v1.Descriptor{*desc}})
	if err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	write := func(name string, mode int64, typ byte, data []byte) error {
		h := &tar.Header{Name: name, Mode: mode, Typeflag: typ, Size: int64(len(data)), ModTime: created.UTC(), Format: tar.FormatPAX}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	err = errors.Join(
		write("blobs/", 0o755, tar.TypeDir, nil),
		write("blobs/sha256/", 0o755, tar.TypeDir, nil),
		write("oci-layout", 0o644, tar.TypeReg, []byte(`{"imageLayoutVersion":"1.0.0"}`)),
		write("index.json", 0o644, tar.TypeReg, top),
	)
	digests := make([]string, 0, len(blobs))
	for d := range blobs {
		digests = append(digests, d)
	}
	sort.Strings(digests)
	for _, d := range digests {
		if err == nil {
			err = write("blobs/sha256/"+strings.TrimPrefix(d, "sha256:"), 0o644, tar.TypeReg, blobs[d])
		}
	}
	return errors.Join(err, tw.Close(), f.Close())
}

// collectBlobs returns the index manifest, every image manifest and config
// and every compressed layer, by digest.
func collectBlobs(idx v1.ImageIndex) (map[string][]byte, error) {
	blobs := map[string][]byte{}
	raw, err := idx.RawManifest()
	if err != nil {
		return nil, err
	}
	d, err := idx.Digest()
	if err != nil {
		return nil, err
	}
	blobs[d.String()] = raw
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	for _, m := range im.Manifests {
		img, err := idx.Image(m.Digest)
		if err != nil {
			return nil, err
		}
		if err := imageBlobs(img, blobs); err != nil {
			return nil, fmt.Errorf("image %s: %w", m.Digest, err)
		}
	}
	return blobs, nil
}

func imageBlobs(img v1.Image, blobs map[string][]byte) error {
	raw, err := img.RawManifest()
	if err != nil {
		return err
	}
	d, err := img.Digest()
	if err != nil {
		return err
	}
	blobs[d.String()] = raw
	cfg, err := img.RawConfigFile()
	if err != nil {
		return err
	}
	cd, err := img.ConfigName()
	if err != nil {
		return err
	}
	blobs[cd.String()] = cfg
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	for _, l := range layers {
		ld, err := l.Digest()
		if err != nil {
			return err
		}
		rc, err := l.Compressed()
		if err != nil {
			return err
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return err
		}
		blobs[ld.String()] = b
	}
	return nil
}

// ReadArchive unpacks the OCI archive at path into dir and returns the
// image index its index.json names, with that entry's ref name.
func ReadArchive(path, dir string) (v1.ImageIndex, string, error) {
	if err := untar(path, dir); err != nil {
		return nil, "", fmt.Errorf("unpacking %s: %w", path, err)
	}
	top, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", path, err)
	}
	im, err := top.IndexManifest()
	if err != nil {
		return nil, "", err
	}
	if len(im.Manifests) != 1 || im.Manifests[0].MediaType != types.OCIImageIndex {
		return nil, "", fmt.Errorf("%s: index.json has %d entries, want one OCI image index", path, len(im.Manifests))
	}
	idx, err := top.ImageIndex(im.Manifests[0].Digest)
	return idx, im.Manifests[0].Annotations[AnnotationRefName], err
}

func untar(path, dir string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := filepath.Clean(h.Name)
		if !filepath.IsLocal(name) {
			return fmt.Errorf("entry %q leaves the archive", h.Name)
		}
		target := filepath.Join(dir, name)
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(target, 0o755)
		case tar.TypeReg:
			err = writeFile(target, tr)
		default:
			err = fmt.Errorf("entry %q has unexpected type %q", h.Name, h.Typeflag)
		}
		if err != nil {
			return err
		}
	}
}

func writeFile(path string, r io.Reader) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r)
	return errors.Join(err, f.Close())
}

// DigestLines lists ref with the index digest and each platform's image
// digest, one "<ref>@<digest> <platform|index>" line each.
func DigestLines(idx v1.ImageIndex, ref string) (string, error) {
	d, err := idx.Digest()
	if err != nil {
		return "", err
	}
	out := fmt.Sprintf("%s@%s index\n", ref, d)
	im, err := idx.IndexManifest()
	if err != nil {
		return "", err
	}
	for _, m := range im.Manifests {
		p := "unknown"
		if m.Platform != nil {
			p = m.Platform.OS + "/" + m.Platform.Architecture
		}
		out += fmt.Sprintf("%s@%s %s\n", ref, m.Digest, p)
	}
	return out, nil
}
