package install

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"

	"k8s.io/klog/v2"

	"golang.org/x/mod/semver"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/credentials"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/nodefile"
)

// During an upgrade (a DaemonSet rolling update, helm upgrade) installers
// of two versions run on a node at once; during a rollout restart, or a
// helm upgrade that changes only the configuration (the backend, excluded
// namespaces), two installers of the same version with different entries
// do. Each would make the binary and the entry its own, so they would
// overwrite each other until one stops. The owner file (OwnerFileName,
// beside the kubeconfig) settles it: it names the version of the installer
// that wrote last and, when known, the pod that installer runs in. Before
// it writes anything an installer reads it:
//
//   - no owner file, an unreadable one, an older version, or this
//     installer's own pod: the installer writes what it installs and
//     records itself as the owner;
//   - a newer version whose pod still runs (or whose pod is unknown, or the
//     API does not answer): the installer writes nothing and looks again
//     soon (PassResult.Recheck), reporting Ready while the chain is complete;
//   - the same version in another pod that still runs (or the API does not
//     answer): the same; the installer in place keeps the installation
//     until its pod is deleted, then the other takes over within Recheck,
//     writing its entry once. Without pods on either side (no API access)
//     the same version does not yield;
//   - a newer version, or the same one, whose pod is gone or being deleted
//     (a rollback, the old pod of a rolling update): the installer takes
//     over.
//
// Versions compare as semantic versions; `git describe` builds
// (v0.1.0-3-gabc) come after their tag, and anything that is not a
// release (dev, v0.0.0-dev...) loses to every release.

// Owner is the content of the owner file.
type Owner struct {
	Version string `json:"version"`
	// Namespace, Pod and UID identify the installer's pod, from its
	// pod-bound token; empty when not known.
	Namespace string `json:"namespace,omitempty"`
	Pod       string `json:"pod,omitempty"`
	UID       string `json:"uid,omitempty"`
}

var describeRE = regexp.MustCompile(`^(v[0-9]+\.[0-9]+\.[0-9]+)-([0-9]+)-g[0-9a-f]+(-dirty)?$`)

// releaseRank maps a version string to something comparable: its semantic
// version (a describe suffix removed), the number of commits past it, and
// whether it is a release at all.
func releaseRank(v string) (base string, commits int, release bool) {
	if m := describeRE.FindStringSubmatch(v); m != nil {
		n, _ := strconv.Atoi(m[2])
		return m[1], n, true
	}
	if !semver.IsValid(v) {
		return "", 0, false
	}
	if pre := semver.Prerelease(v); pre != "" && len(pre) >= 4 && pre[:4] == "-dev" {
		return "", 0, false
	}
	return v, 0, true
}

// CompareVersions returns -1, 0 or +1 as installer version a is older
// than, as new as, or newer than b.
func CompareVersions(a, b string) int {
	ba, na, ra := releaseRank(a)
	bb, nb, rb := releaseRank(b)
	switch {
	case !ra && !rb:
		return 0
	case !ra:
		return -1
	case !rb:
		return 1
	}
	if c := semver.Compare(ba, bb); c != 0 {
		return c
	}
	switch {
	case na < nb:
		return -1
	case na > nb:
		return 1
	}
	return 0
}

// readOwner returns the owner file's record; ok is false when there is
// none or it cannot be decoded (it is then rewritten).
func readOwner(netDir string) (o Owner, ok bool) {
	b, err := os.ReadFile(filepath.Join(netDir, cniconf.OwnerFileName))
	if err != nil {
		return Owner{}, false
	}
	if err := json.Unmarshal(b, &o); err != nil || o.Version == "" {
		return Owner{}, false
	}
	return o, true
}

// self is the owner record of this installer.
func (in *Installer) self() Owner {
	o := Owner{Version: in.cfg.Version}
	if in.cfg.Client == nil {
		return o
	}
	if tok, err := in.cfg.Client.ReadToken(); err == nil {
		if p, ok := credentials.PodOf(tok); ok {
			o.Namespace, o.Pod, o.UID = p.Namespace, p.Name, p.UID
		}
	}
	return o
}

// ownerToYieldTo returns the owner record when another installer owns the
// node's installation and may still run: this installer then writes
// nothing.
func (in *Installer) ownerToYieldTo(ctx context.Context) (Owner, bool) {
	o, ok := readOwner(in.cfg.NetDir)
	if !ok {
		return Owner{}, false
	}
	switch CompareVersions(o.Version, in.cfg.Version) {
	case -1:
		return Owner{}, false
	case 0:
		self := in.self()
		if o.UID == "" || self.UID == "" || o.UID == self.UID || in.cfg.PodAlive == nil {
			return Owner{}, false
		}
	}
	if o.UID == "" || in.cfg.PodAlive == nil {
		return o, true
	}
	alive, err := in.cfg.PodAlive(ctx, o.Namespace, o.Pod, o.UID)
	if err == nil && !alive {
		return Owner{}, false
	}
	return o, true
}

// claimOwner records this installer as the owner unless the file says so
// already; changed tells whether it wrote.
func (in *Installer) claimOwner() (changed bool, err error) {
	self := in.self()
	if cur, ok := readOwner(in.cfg.NetDir); ok && cur == self {
		return false, nil
	}
	b, err := json.Marshal(self)
	if err != nil {
		return false, err
	}
	if err := nodefile.WriteAtomic(filepath.Join(in.cfg.NetDir, cniconf.OwnerFileName), append(b, '\n'), 0o644); err != nil {
		return false, fmt.Errorf("writing the owner file %s: %w", cniconf.OwnerFileName, err)
	}
	return true, nil
}

// yieldToOwner makes the pass write nothing while another installer owns
// the installation (looking again soon), and otherwise records this
// installer as the owner before anything else is written, so that the
// other installer sees it as early as possible.
func (in *Installer) yieldToOwner(ctx context.Context, st PassResult) (PassResult, bool) {
	if o, yield := in.ownerToYieldTo(ctx); yield {
		klog.FromContext(ctx).V(2).Info("Another installer owns the node's installation; writing nothing", "owner", o.Version, "ownerPod", o.Pod, "version", in.cfg.Version)
		st.YieldedTo, st.Recheck = o.Version, true
		return st, true
	}
	changed, err := in.claimOwner()
	if err != nil {
		klog.FromContext(ctx).Error(err, "Cannot record this installer as the owner of the installation")
	}
	if changed {
		st.Wrote = append(st.Wrote, "owner")
	}
	return st, false
}
