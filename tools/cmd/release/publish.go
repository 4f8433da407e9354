package main

import (
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/consul-cni-repair/consul-cni-repair/tools/ociimage"
)

// publishOptions are the flags of `release publish`: push the image
// archives `make images` wrote (every platform, each a multi-arch index) to
// a registry, and the chart, its images' repositories set to that registry,
// as an OCI artifact beside them.
type publishOptions struct {
	images, registry, version, chart, helm string
	plainHTTP                              bool
}

func (o *publishOptions) addFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.images, "images", "bin/images", "directory of the image archives (make images)")
	fs.StringVar(&o.registry, "registry", "", "registry and path to push to, host[:port]/path (images <registry>/<name>:<tag>, chart oci://<registry>/charts/<chart>)")
	fs.StringVar(&o.version, "version", "", "the release's version string (image tag and chart version)")
	fs.StringVar(&o.chart, "chart", "charts/consul-cni-repair", "the chart directory")
	fs.StringVar(&o.helm, "helm", "bin/helm", "the helm command (make helm)")
	fs.BoolVar(&o.plainHTTP, "plain-http", false, "speak plain HTTP to the registry (default: only for localhost and loopback addresses)")
}

func (o *publishOptions) validate() error {
	if o.version == "" {
		return fmt.Errorf("--version is required")
	}
	if o.registry == "" || strings.Contains(o.registry, "://") {
		return fmt.Errorf("--registry: %q is not host[:port]/path", o.registry)
	}
	if _, err := name.NewRepository(o.registry + "/x"); err != nil {
		return fmt.Errorf("--registry: %q: %v", o.registry, err)
	}
	return nil
}

// plain tells whether the registry is spoken to over plain HTTP: asked for,
// or a loopback registry, as go-containerregistry and containerd decide.
func (o *publishOptions) plain() bool {
	r, err := name.NewRegistry(strings.SplitN(o.registry, "/", 2)[0])
	return o.plainHTTP || (err == nil && r.Scheme() == "http")
}

func publish(o *publishOptions, out io.Writer) error {
	tag, err := ociimage.Tag(o.version)
	if err != nil {
		return err
	}
	for _, spec := range ociimage.Specs {
		if err := pushImage(o, spec, tag, out); err != nil {
			return fmt.Errorf("image %s: %w", spec.Name, err)
		}
	}
	return pushChart(o, tag, out)
}

// pushImage pushes spec's index with every platform's image and prints its
// reference, digest, the compressed size of each platform's image and how
// long the push took.
func pushImage(o *publishOptions, spec ociimage.Spec, tag string, out io.Writer) error {
	tmp, err := os.MkdirTemp("", "publish-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	idx, _, err := ociimage.ReadArchive(filepath.Join(o.images, spec.ArchiveName()), tmp)
	if err != nil {
		return err
	}
	var opts []name.Option
	if o.plainHTTP {
		opts = append(opts, name.Insecure)
	}
	ref, err := name.NewTag(spec.Ref(o.registry, tag), opts...)
	if err != nil {
		return err
	}
	start := time.Now()
	if err := remote.WriteIndex(ref, idx, remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		return err
	}
	took := time.Since(start)
	digest, err := idx.Digest()
	if err != nil {
		return err
	}
	sizes, err := platformSizes(idx)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "pushed %s@%s in %.2fs (%s)\n", ref, digest, took.Seconds(), sizes)
	return nil
}

// platformSizes describes the compressed size of each platform's image:
// manifest, config and layers.
func platformSizes(idx v1.ImageIndex) (string, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return "", err
	}
	var parts []string
	for _, d := range im.Manifests {
		img, err := idx.Image(d.Digest)
		if err != nil {
			return "", err
		}
		m, err := img.Manifest()
		if err != nil {
			return "", err
		}
		size := d.Size + m.Config.Size
		for _, l := range m.Layers {
			size += l.Size
		}
		parts = append(parts, fmt.Sprintf("%s %d bytes", d.Platform, size))
	}
	return strings.Join(parts, ", "), nil
}

// pushChart packages a copy of the chart whose images default to the
// registry published to, and pushes it with helm to oci://<registry>/charts.
func pushChart(o *publishOptions, tag string, out io.Writer) error {
	tmp, err := os.MkdirTemp("", "publish-chart-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	dir := filepath.Join(tmp, filepath.Base(o.chart))
	if err := copyChart(o.chart, dir); err != nil {
		return err
	}
	if err := retargetImages(dir, o.registry); err != nil {
		return err
	}
	version := strings.TrimPrefix(o.version, "v")
	if err := run(o.helm, "package", dir, "--version", version, "--app-version", tag, "--destination", tmp); err != nil {
		return err
	}
	pkg := filepath.Join(tmp, filepath.Base(o.chart)+"-"+version+".tgz")
	args := []string{"push", pkg, "oci://" + o.registry + "/charts"}
	if o.plain() {
		args = append(args, "--plain-http")
	}
	start := time.Now()
	if err := run(o.helm, args...); err != nil {
		return err
	}
	fmt.Fprintf(out, "pushed chart oci://%s/charts/%s --version %s (appVersion %s) in %.2fs\n",
		o.registry, filepath.Base(o.chart), version, tag, time.Since(start).Seconds())
	return nil
}

// copyChart copies the chart directory, following its symbolic links (the
// files of manifests/base under files/), as helm package stores them.
func copyChart(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		st, err := os.Stat(path) // follows links
		if err != nil {
			return err
		}
		if st.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		return copyFile(path, target)
	})
}

// retargetImages makes the copy's image repositories, and the references
// to its own location in its README, name the registry published to.
func retargetImages(dir, registry string) error {
	for _, f := range []string{"values.yaml", "README.md"} {
		p := filepath.Join(dir, f)
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		s := strings.ReplaceAll(string(b), ociimage.ManifestRegistry+"/", strings.TrimSuffix(registry, "/")+"/")
		if f == "values.yaml" && !strings.Contains(s, registry+"/repair") {
			return fmt.Errorf("%s: no image repository %s/repair to retarget", p, ociimage.ManifestRegistry)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func run(cmd string, args ...string) error {
	c := exec.Command(cmd, args...)
	c.Stdout, c.Stderr = os.Stderr, os.Stderr
	if err := c.Run(); err != nil {
		return fmt.Errorf("%s %s: %w", cmd, strings.Join(args, " "), err)
	}
	return nil
}
