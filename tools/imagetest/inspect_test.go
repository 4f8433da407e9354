//go:build images

package imagetest

import (
	"bytes"
	"debug/buildinfo"
	"debug/elf"
	"path"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/consul-cni-repair/consul-cni-repair/tools/ociimage"
)

var elfMachine = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// TestImageContents inspects every platform's image of every archive (the
// arm64 ones cannot run here): platform, entrypoint, user, labels, the
// passwd entry of that user, no shell, and each binary's ELF machine,
// static linking and build stamp.
func TestImageContents(t *testing.T) {
	version := wantVersion(t)
	for _, spec := range ociimage.Specs {
		t.Run(spec.Name, func(t *testing.T) {
			a := readArchive(t, spec)
			tag, err := ociimage.Tag(version)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasSuffix(a.ref, "/"+spec.Name+":"+tag) {
				t.Errorf("archive names %q, want .../%s:%s", a.ref, spec.Name, tag)
			}
			im, err := a.index.IndexManifest()
			if err != nil {
				t.Fatal(err)
			}
			var archs []string
			for _, m := range im.Manifests {
				archs = append(archs, m.Platform.OS+"/"+m.Platform.Architecture)
			}
			if !slices.Equal(archs, []string{"linux/amd64", "linux/arm64"}) {
				t.Fatalf("index platforms %v, want linux/amd64 and linux/arm64", archs)
			}
			checkLabels(t, "index annotations", im.Annotations, version)
			for _, arch := range []string{"amd64", "arm64"} {
				t.Run(arch, func(t *testing.T) { checkImage(t, a, arch, version) })
			}
		})
	}
}

func checkLabels(t *testing.T, where string, labels map[string]string, version string) {
	t.Helper()
	for _, k := range []string{"source", "revision", "version", "created"} {
		if labels["org.opencontainers.image."+k] == "" {
			t.Errorf("%s: org.opencontainers.image.%s missing", where, k)
		}
	}
	if got := labels["org.opencontainers.image.version"]; got != version {
		t.Errorf("%s: org.opencontainers.image.version = %q, want %q", where, got, version)
	}
}

func checkImage(t *testing.T, a archive, arch, version string) {
	img := a.platformImage(t, "linux", arch)
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != arch {
		t.Errorf("config platform %s/%s, want linux/%s", cf.OS, cf.Architecture, arch)
	}
	if !slices.Equal(cf.Config.Entrypoint, a.spec.Entrypoint()) {
		t.Errorf("entrypoint %v, want %v", cf.Config.Entrypoint, a.spec.Entrypoint())
	}
	if cf.Config.User != a.spec.UserString() {
		t.Errorf("user %q, want %q", cf.Config.User, a.spec.UserString())
	}
	checkLabels(t, "config labels", cf.Config.Labels, version)
	if got := cf.Config.Labels["org.opencontainers.image.created"]; got != cf.Created.UTC().Format("2006-01-02T15:04:05Z") {
		t.Errorf("created label %q differs from the config's created %s", got, cf.Created)
	}
	files, err := ociimage.Files(img)
	if err != nil {
		t.Fatal(err)
	}
	for name := range files {
		if b := path.Base(name); b == "sh" || b == "bash" || b == "busybox" {
			t.Errorf("image holds a shell: %s", name)
		}
	}
	entry := a.spec.User + ":x:" + strconv.Itoa(a.spec.UID) + ":" + strconv.Itoa(a.spec.GID) + ":"
	if p := string(files["etc/passwd"].Data); !strings.Contains(p, entry) {
		t.Errorf("etc/passwd = %q, want an entry %q", p, entry)
	}
	var want []string
	for _, b := range a.spec.Binaries {
		want = append(want, "usr/local/bin/"+b)
		checkBinary(t, files["usr/local/bin/"+b], b, arch, version)
	}
	for name, f := range files {
		if f.Header.Typeflag == '0' && name != "etc/passwd" && name != "etc/group" && !slices.Contains(want, name) {
			t.Errorf("unexpected file %s in the image", name)
		}
	}
}

func checkBinary(t *testing.T, f ociimage.File, name, arch, version string) {
	t.Helper()
	if f.Header == nil {
		t.Errorf("%s missing", name)
		return
	}
	if f.Header.Mode&0o111 == 0 || f.Header.Uid != 0 {
		t.Errorf("%s: mode %o uid %d, want executable and owned by root", name, f.Header.Mode, f.Header.Uid)
	}
	ef, err := elf.NewFile(bytes.NewReader(f.Data))
	if err != nil {
		t.Fatalf("%s: not ELF: %v", name, err)
	}
	if ef.Machine != elfMachine[arch] {
		t.Errorf("%s: ELF machine %s, want %s", name, ef.Machine, elfMachine[arch])
	}
	for _, p := range ef.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s: has an ELF interpreter, want a static binary", name)
		}
	}
	bi, err := buildinfo.Read(bytes.NewReader(f.Data))
	if err != nil {
		t.Fatalf("%s: build info: %v", name, err)
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	if settings["CGO_ENABLED"] != "0" || settings["GOARCH"] != arch || settings["-trimpath"] != "true" {
		t.Errorf("%s: build settings CGO_ENABLED=%q GOARCH=%q -trimpath=%q, want 0, %s, true",
			name, settings["CGO_ENABLED"], settings["GOARCH"], settings["-trimpath"], arch)
	}
	// -trimpath keeps -ldflags out of the build info; the stamped string
	// is in the binary's data.
	if !bytes.Contains(f.Data, []byte(version)) {
		t.Errorf("%s: version %s not stamped into the binary", name, version)
	}
}
