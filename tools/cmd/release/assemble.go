package main

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/consul-cni-repair/consul-cni-repair/tools/ociimage"
)

const sumsFile = "SHA256SUMS"

func assemble(o *options) error {
	tag, err := ociimage.Tag(o.version)
	if err != nil {
		return err
	}
	for _, d := range []string{"images", "manifests", "sbom"} {
		if err := os.MkdirAll(filepath.Join(o.out, d), 0o755); err != nil {
			return err
		}
	}
	var digests strings.Builder
	registry := o.registry
	for _, spec := range ociimage.Specs {
		reg, lines, err := releaseImage(o, spec, tag)
		if err != nil {
			return fmt.Errorf("image %s: %w", spec.Name, err)
		}
		if registry == "" {
			registry = reg
		}
		digests.WriteString(lines)
	}
	if err := os.WriteFile(filepath.Join(o.out, "images", "digests.txt"), []byte(digests.String()), 0o644); err != nil {
		return err
	}
	for name, dir := range overlays {
		y, err := renderOverlay(o.manifests, dir, registry, tag)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(o.out, "manifests", "consul-cni-repair-"+name+".yaml"), y, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// releaseImage copies spec's archive into the release, checks it is named
// with tag and writes its SBOM; it returns the archive's registry and its
// digest lines.
func releaseImage(o *options, spec ociimage.Spec, tag string) (string, string, error) {
	src := filepath.Join(o.images, spec.ArchiveName())
	tmp, err := os.MkdirTemp("", "release-image-")
	if err != nil {
		return "", "", err
	}
	defer os.RemoveAll(tmp)
	idx, ref, err := ociimage.ReadArchive(src, tmp)
	if err != nil {
		return "", "", err
	}
	repo, gotTag, ok := strings.Cut(ref, ":"+tag)
	if !ok || gotTag != "" || !strings.HasSuffix(repo, "/"+spec.Name) {
		return "", "", fmt.Errorf("%s names %q, want <registry>/%s:%s (rebuild with make images)", src, ref, spec.Name, tag)
	}
	if o.registry != "" && repo != spec.Repository(o.registry) {
		return "", "", fmt.Errorf("%s names %q, want %s", src, ref, spec.Ref(o.registry, tag))
	}
	if err := copyFile(src, filepath.Join(o.out, "images", spec.Name+"-"+tag+".oci.tar")); err != nil {
		return "", "", err
	}
	d, err := idx.Digest()
	if err != nil {
		return "", "", err
	}
	bins, created, err := imageBinaries(idx, spec)
	if err != nil {
		return "", "", err
	}
	if spec.Name == pluginImage {
		if err := writePlugin(o.out, tag, bins); err != nil {
			return "", "", fmt.Errorf("kubectl plugin: %w", err)
		}
	}
	bom, err := sbom(image{Repository: repo, Tag: tag, Digest: d.String(), Version: o.version, Created: created}, bins)
	if err != nil {
		return "", "", err
	}
	if err := os.WriteFile(filepath.Join(o.out, "sbom", spec.Name+".cdx.json"), bom, 0o644); err != nil {
		return "", "", err
	}
	lines, err := ociimage.DigestLines(idx, ref)
	return strings.TrimSuffix(repo, "/"+spec.Name), lines, err
}

// imageBinaries reads spec's binaries out of every platform's image, and
// the images' creation label.
func imageBinaries(idx v1.ImageIndex, spec ociimage.Spec) ([]binary, string, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, "", err
	}
	var out []binary
	for _, m := range im.Manifests {
		img, err := idx.Image(m.Digest)
		if err != nil {
			return nil, "", err
		}
		files, err := ociimage.Files(img)
		if err != nil {
			return nil, "", err
		}
		platform := m.Platform.OS + "/" + m.Platform.Architecture
		for _, b := range spec.Binaries {
			f, ok := files[strings.TrimPrefix(ociimage.BinDir, "/")+"/"+b]
			if !ok {
				return nil, "", fmt.Errorf("%s image has no %s", platform, b)
			}
			out = append(out, binary{Name: b, Platform: platform, Data: f.Data})
		}
	}
	return out, im.Annotations["org.opencontainers.image.created"], nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	return errors.Join(err, out.Close())
}

// writeChecksums writes dir/SHA256SUMS in sha256sum's format, over every
// regular file under dir but itself, in path order.
func writeChecksums(dir string) error {
	var paths []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err == nil && rel != sumsFile {
			paths = append(paths, filepath.ToSlash(rel))
		}
		return err
	})
	if err != nil {
		return err
	}
	sort.Strings(paths)
	var b strings.Builder
	for _, p := range paths {
		sum, err := fileSHA256(filepath.Join(dir, p))
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%x  %s\n", sum, p)
	}
	return os.WriteFile(filepath.Join(dir, sumsFile), []byte(b.String()), 0o644)
}

func fileSHA256(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return nil, err
	}
	return h.Sum(nil), nil
}
