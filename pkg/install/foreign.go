package install

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/conflist"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/credentials"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/nodefile"
)

// Beside consul-k8s's own installer. consul-k8s's install-cni (the
// container of its <release>-cni DaemonSet) watches the CNI net dir and,
// on every change there, appends its own consul-cni entry again (writing
// the list in place) unless the last consul-cni entry equals its own field
// by field. Ours never does: it names our kubeconfig and lacks
// cni_token_path, and consul-k8s's names a kubeconfig of its installation
// (ZZZ-consul-cni-kubeconfig-<pod UID>). Were both to insist on their own,
// they would rewrite the list in turn as long as both run, the one in place
// letting runtimes read a partial list.
//
// So while consul-k8s's installer runs on the node, its entry stays:
//
//   - the entry is left as it is when it is the last plugin of the primary
//     list, names a kubeconfig consul-k8s's way (cniconf.ConsulK8sKubeconfigFileName,
//     possibly with a suffix) in the net dir the installer manages, and that
//     kubeconfig is consul-k8s's (not one an earlier installer of ours
//     wrote) and in place;
//   - the entry is served by this installer's binary (the runtime runs the
//     plugin by its type: installBinary keeps ours at that path, and
//     consul-k8s's installer copies its own only when it starts), and its
//     kubeconfig is consul-k8s's, which authenticates as consul-k8s's CNI
//     service account (allowed to get and patch pods); in the moment
//     between consul-k8s's installer appending the entry and writing that
//     kubeconfig, the plugin uses ours (plugin.ResolveKubeconfig), so no
//     pod passes for want of a kubeconfig;
//   - our entry goes in once consul-k8s's installer has gone: its SIGTERM
//     cleanup removes its entry (a write in place, to which Run answers
//     within restoreDebounce), or its pod is gone without a cleanup (its
//     kubeconfig's pod-bound token names a pod the API no longer has, not
//     even as being deleted), or
//     the kubeconfig the entry names is missing for longer than
//     foreignSettle.
//
// Settings of ours that consul-k8s's entry does not carry
// (exclude_namespaces, backend) take effect when our entry goes in: the
// hand-over is consul-k8s's installer's cleanup.

// foreignSettle is how long an entry of consul-k8s's naming a kubeconfig
// not yet written is left alone: its installer appends the entry first and
// writes the kubeconfig a moment later.
const foreignSettle = 2 * time.Second

// consulK8sEntry is what the installer reads of a consul-cni entry.
type consulK8sEntry struct {
	Type       string `json:"type"`
	CNINetDir  string `json:"cni_net_dir"`
	Kubeconfig string `json:"kubeconfig"`
}

// foreignVerdict is what a pass does with the last consul-cni entry.
type foreignVerdict int

const (
	// replaceEntry: not consul-k8s's live entry; ours goes in.
	replaceEntry foreignVerdict = iota
	// keepEntry: consul-k8s's installer runs; its entry stays.
	keepEntry
	// keepEntryForNow: consul-k8s's entry without its kubeconfig yet;
	// it stays, and the installer looks again soon.
	keepEntryForNow
)

// judgeForeignEntry decides about raw, the last plugin of the primary list
// at listPath.
func (in *Installer) judgeForeignEntry(ctx context.Context, raw []byte, listPath string) foreignVerdict {
	var e consulK8sEntry
	if json.Unmarshal(raw, &e) != nil || e.Type != cniconf.PluginType || !consulK8sKubeconfigName(e.Kubeconfig) {
		return replaceEntry
	}
	if filepath.Clean(e.CNINetDir) != filepath.Clean(in.cfg.HostNetDir) {
		return replaceEntry
	}
	kc := filepath.Join(in.cfg.NetDir, e.Kubeconfig)
	b, err := os.ReadFile(kc)
	if err != nil {
		if os.IsNotExist(err) && nodefile.ModifiedWithin(listPath, foreignSettle) {
			return keepEntryForNow
		}
		return replaceEntry
	}
	if credentials.Ours(b) {
		return replaceEntry // an earlier installer of ours wrote it
	}
	if !in.foreignPodAlive(ctx, b) {
		klog.FromContext(ctx).Info("consul-k8s's installer that wrote the consul-cni entry is gone; chaining ours", "kubeconfig", kc)
		return replaceEntry
	}
	return keepEntry
}

// consulK8sKubeconfigName reports whether name is a kubeconfig name
// consul-k8s's installer writes: ZZZ-consul-cni-kubeconfig, or since
// consul-k8s 1.8 ZZZ-consul-cni-kubeconfig-<installation id>.
func consulK8sKubeconfigName(name string) bool {
	if name == "" || strings.ContainsRune(name, '/') {
		return false
	}
	return name == cniconf.ConsulK8sKubeconfigFileName || strings.HasPrefix(name, cniconf.ConsulK8sKubeconfigFileName+"-")
}

// PodGone reports whether a pod no longer exists: not found, or another
// pod (UID) of that name. A pod being deleted still exists.
type PodGone func(ctx context.Context, namespace, name, uid string) (bool, error)

// foreignPodAlive tells whether the pod consul-k8s's kubeconfig
// authenticates for still exists. Its token (embedded, or with
// autorotate-token a file in the net dir) is a pod-bound service-account
// token; when it is not, or the API does not answer, the installer is
// taken to run. A pod being deleted counts as existing: its installer's
// cleanup is on its way, and an entry of ours put in before it would be
// written back by that installer until it stops.
func (in *Installer) foreignPodAlive(ctx context.Context, kubeconfig []byte) bool {
	cfg, err := clientcmd.Load(kubeconfig)
	if err != nil || in.cfg.PodGone == nil {
		return true
	}
	for _, a := range cfg.AuthInfos {
		if a == nil {
			continue
		}
		tok := []byte(a.Token)
		if a.TokenFile != "" {
			b, err := os.ReadFile(in.containerPath(a.TokenFile))
			if err != nil {
				continue
			}
			tok = b
		}
		p, ok := credentials.PodOf(tok)
		if !ok {
			continue
		}
		if in.foreign.seenRecently(p.UID, time.Now()) {
			return true
		}
		gone, err := in.cfg.PodGone(ctx, p.Namespace, p.Name, p.UID)
		if err == nil && !gone {
			in.foreign.seen(p.UID, time.Now())
		}
		return err != nil || !gone
	}
	return true
}

// containerPath maps a path in the host's CNI net dir to the installer's
// view of it; other paths stay as they are.
func (in *Installer) containerPath(hostPath string) string {
	rel, err := filepath.Rel(in.cfg.HostNetDir, hostPath)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return hostPath
	}
	return filepath.Join(in.cfg.NetDir, rel)
}

// keepsForeignEntry reports whether the pass leaves the primary list p as
// it is because its consul-cni entry, the last plugin, is consul-k8s's
// installer's and that installer runs; st.Recheck is set while the entry's
// kubeconfig is still to come.
func (in *Installer) keepsForeignEntry(ctx context.Context, p conflist.Candidate, st *PassResult) bool {
	s := conflist.FindEntry(p.Network)
	if s.Count != 1 || !s.Last {
		return false
	}
	switch in.judgeForeignEntry(ctx, s.Entry, p.Path) {
	case keepEntry:
		return true
	case keepEntryForNow:
		st.Recheck = true
		return true
	}
	return false
}

// foreignPodTTL is how long a pod of consul-k8s's installer seen to exist
// is not asked about again: passes follow every change in the net dir, and
// one that restores the chain must not wait for the API. A pod gone without
// its cleanup is noticed that much later at most.
const foreignPodTTL = 10 * time.Second

// foreignPods remembers when each of consul-k8s's installer pods (by UID)
// was last seen to exist. Passes run one at a time (Run), so it needs no
// lock.
type foreignPods struct {
	at map[string]time.Time
}

func (f *foreignPods) seen(uid string, now time.Time) {
	if f.at == nil {
		f.at = map[string]time.Time{}
	}
	for u, t := range f.at {
		if now.Sub(t) >= foreignPodTTL {
			delete(f.at, u)
		}
	}
	f.at[uid] = now
}

func (f *foreignPods) seenRecently(uid string, now time.Time) bool {
	t, ok := f.at[uid]
	return ok && now.Sub(t) < foreignPodTTL
}
