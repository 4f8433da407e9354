// Command images writes the project's OCI image archives: for every image
// in ociimage.Specs, a multi-arch index of FROM-scratch images built from the
// cross-compiled binaries in <bin-dir>/<os>_<arch>/, as <out>/<name>.oci.tar,
// plus <out>/digests.txt listing each reference with its index and
// per-platform digests.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/tools/ociimage"
)

type options struct {
	binDir, out, registry, version, revision, source, platforms string
	epoch                                                       int64
}

func (o *options) addFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.binDir, "bin-dir", "bin", "directory holding <os>_<arch>/ binary directories")
	fs.StringVar(&o.out, "out", "bin/images", "output directory for the archives and digests.txt")
	fs.StringVar(&o.registry, "registry", ociimage.ManifestRegistry, "registry and path the images are named under")
	fs.StringVar(&o.version, "version", "", "version string (image tag and org.opencontainers.image.version)")
	fs.StringVar(&o.revision, "revision", "", "source revision (org.opencontainers.image.revision)")
	fs.StringVar(&o.source, "source", "https://github.com/consul-cni-repair/consul-cni-repair", "source repository URL")
	fs.StringVar(&o.platforms, "platforms", "linux/amd64,linux/arm64", "comma-separated os/arch list")
	fs.Int64Var(&o.epoch, "created", 0, "creation time, seconds since the epoch (the commit time, for reproducible images)")
}

func (o *options) validate() error {
	for name, v := range map[string]string{"--version": o.version, "--revision": o.revision, "--registry": o.registry} {
		if v == "" {
			return fmt.Errorf("%s is required", name)
		}
	}
	if o.epoch <= 0 {
		return fmt.Errorf("--created: %d is not a positive Unix time", o.epoch)
	}
	_, err := o.platformList()
	return err
}

func (o *options) platformList() ([]ociimage.Platform, error) {
	var out []ociimage.Platform
	for _, p := range strings.Split(o.platforms, ",") {
		osName, arch, ok := strings.Cut(strings.TrimSpace(p), "/")
		if !ok || osName == "" || arch == "" {
			return nil, fmt.Errorf("--platforms: %q is not os/arch", p)
		}
		out = append(out, ociimage.Platform{OS: osName, Arch: arch, BinDir: filepath.Join(o.binDir, osName+"_"+arch)})
	}
	return out, nil
}

func main() {
	o := &options{}
	fs := flag.NewFlagSet("images", flag.ExitOnError)
	o.addFlags(fs)
	_ = fs.Parse(os.Args[1:])
	if err := o.validate(); err != nil {
		fmt.Fprintf(os.Stderr, "images: %v\n", err)
		os.Exit(2)
	}
	if err := run(o); err != nil {
		fmt.Fprintf(os.Stderr, "images: %v\n", err)
		os.Exit(1)
	}
}

func run(o *options) error {
	tag, err := ociimage.Tag(o.version)
	if err != nil {
		return err
	}
	platforms, _ := o.platformList()
	created := time.Unix(o.epoch, 0).UTC()
	labels := ociimage.Labels{Source: o.source, Revision: o.revision, Version: o.version, Created: created.Format(time.RFC3339)}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	var list strings.Builder
	for _, spec := range ociimage.Specs {
		idx, err := ociimage.Build(spec, platforms, labels, created)
		if err != nil {
			return err
		}
		ref := spec.Ref(o.registry, tag)
		if err := ociimage.WriteArchive(filepath.Join(o.out, spec.ArchiveName()), idx, ref, created); err != nil {
			return fmt.Errorf("writing %s: %w", spec.ArchiveName(), err)
		}
		lines, err := ociimage.DigestLines(idx, ref)
		if err != nil {
			return err
		}
		list.WriteString(lines)
		fmt.Printf("%s\t%s\n", ref, filepath.Join(o.out, spec.ArchiveName()))
	}
	return os.WriteFile(filepath.Join(o.out, "digests.txt"), []byte(list.String()), 0o644)
}
