// Command release assembles a release under an output directory from the
// image archives `make images` wrote:
//
//	release assemble --images bin/images --out dist --version v0.1.0 --manifests manifests
//	release checksums --dir dist
//	release publish --images bin/images --registry host:port/path --version v0.1.0
//
// assemble writes images/<name>-<tag>.oci.tar and images/digests.txt,
// manifests/consul-cni-repair-<overlay>.yaml (every overlay rendered with
// the images set to this version's tag) and sbom/<name>.cdx.json (a
// CycloneDX BOM from the Go build information of the binaries in each
// image) and plugin/: the kubectl plugin's archive per platform and its krew
// manifest (krew.go). checksums then writes SHA256SUMS over every file under the
// directory (`sha256sum -c SHA256SUMS` verifies it), after anything else
// (the packaged chart) was added. publish pushes the image archives (every
// platform under one index per image) and the chart, with its images
// defaulting to that registry, as an OCI artifact (publish.go).
package main

import (
	"flag"
	"fmt"
	"os"
)

type options struct {
	images, out, manifests, registry, version string
}

func (o *options) addFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.images, "images", "bin/images", "directory of the image archives (make images)")
	fs.StringVar(&o.out, "out", "dist", "release directory (must not exist yet)")
	fs.StringVar(&o.manifests, "manifests", "manifests", "the kustomize tree")
	fs.StringVar(&o.registry, "registry", "", "registry the images are named under (default: the one the archives name)")
	fs.StringVar(&o.version, "version", "", "the release's version string")
}

func (o *options) validate() error {
	if o.version == "" {
		return fmt.Errorf("--version is required")
	}
	if _, err := os.Stat(o.out); err == nil {
		return fmt.Errorf("--out: %s exists; remove it first", o.out)
	}
	return nil
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: release assemble|checksums|publish [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "assemble":
		o := &options{}
		fs := flag.NewFlagSet("release assemble", flag.ExitOnError)
		o.addFlags(fs)
		_ = fs.Parse(os.Args[2:])
		if err := o.validate(); err != nil {
			fmt.Fprintf(os.Stderr, "release: %v\n", err)
			os.Exit(2)
		}
		err = assemble(o)
	case "checksums":
		fs := flag.NewFlagSet("release checksums", flag.ExitOnError)
		dir := fs.String("dir", "dist", "release directory")
		_ = fs.Parse(os.Args[2:])
		err = writeChecksums(*dir)
	case "publish":
		o := &publishOptions{}
		fs := flag.NewFlagSet("release publish", flag.ExitOnError)
		o.addFlags(fs)
		_ = fs.Parse(os.Args[2:])
		if err := o.validate(); err != nil {
			fmt.Fprintf(os.Stderr, "release: %v\n", err)
			os.Exit(2)
		}
		err = publish(o, os.Stdout)
	default:
		fmt.Fprintf(os.Stderr, "release: unknown subcommand %q (want assemble, checksums or publish)\n", os.Args[1])
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "release: %v\n", err)
		os.Exit(1)
	}
}
