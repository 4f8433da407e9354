// Command testimage writes one FROM-scratch OCI archive for this machine's
// platform, the way `make images` writes the project's images
// (tools/ociimage): the named binaries of --bin-dir in /usr/local/bin, the
// first as the entrypoint, named --ref in the archive so that
// `ctr images import` tags it. The real test nodes (tests/harness/realnode)
// use it for their pause image and the test programs' images.
//
//	testimage --bin-dir DIR --binaries pause --ref ccr.test/pause:v1 --out pause.oci.tar
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/tools/ociimage"
)

type options struct {
	binDir, binaries, ref, out string
	uid, gid                   int
}

func (o *options) addFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.binDir, "bin-dir", "", "directory holding the binaries (built for this machine's platform)")
	fs.StringVar(&o.binaries, "binaries", "", "comma-separated binary names; the first is the entrypoint")
	fs.StringVar(&o.ref, "ref", "", "image reference written into the archive (name:tag)")
	fs.StringVar(&o.out, "out", "", "path of the OCI archive to write")
	fs.IntVar(&o.uid, "uid", 0, "UID the image runs as")
	fs.IntVar(&o.gid, "gid", 0, "GID the image runs as")
}

func (o *options) validate() error {
	for name, v := range map[string]string{"--bin-dir": o.binDir, "--binaries": o.binaries, "--ref": o.ref, "--out": o.out} {
		if v == "" {
			return fmt.Errorf("%s is required", name)
		}
	}
	if !strings.Contains(o.ref, ":") {
		return fmt.Errorf("--ref: %q has no tag", o.ref)
	}
	if o.uid < 0 || o.gid < 0 {
		return fmt.Errorf("--uid %d / --gid %d: must not be negative", o.uid, o.gid)
	}
	return nil
}

func main() {
	o := &options{}
	fs := flag.NewFlagSet("testimage", flag.ExitOnError)
	o.addFlags(fs)
	_ = fs.Parse(os.Args[1:])
	if err := o.validate(); err != nil {
		fmt.Fprintf(os.Stderr, "testimage: %v\n", err)
		os.Exit(2)
	}
	if err := run(o); err != nil {
		fmt.Fprintf(os.Stderr, "testimage: %v\n", err)
		os.Exit(1)
	}
}

func run(o *options) error {
	bins := strings.Split(o.binaries, ",")
	user := "root"
	if o.uid != 0 {
		user = "app"
	}
	spec := ociimage.Spec{Name: filepath.Base(bins[0]), Binaries: bins, UID: o.uid, GID: o.gid, User: user}
	// A fixed creation time: the same binaries give the same image.
	created := time.Unix(1, 0).UTC()
	labels := ociimage.Labels{Source: "test", Revision: "test", Version: "test", Created: created.Format(time.RFC3339)}
	idx, err := ociimage.Build(spec, []ociimage.Platform{{OS: "linux", Arch: runtime.GOARCH, BinDir: o.binDir}}, labels, created)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(o.out), 0o755); err != nil {
		return err
	}
	return ociimage.WriteArchive(o.out, idx, o.ref, created)
}
