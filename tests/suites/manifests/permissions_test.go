package manifests

import (
	"fmt"
	"sort"
	"strings"
)

// perm is one permission: a verb on a resource (with subresource, as
// "pods/eviction") of an API group, cluster-wide (Namespace "") or in one
// namespace.
type perm struct {
	Group, Resource, Verb, Namespace string
}

func (p perm) String() string {
	g := p.Group
	if g == "" {
		g = "core"
	}
	where := "cluster-wide"
	if p.Namespace != "" {
		where = "in " + p.Namespace
	}
	return fmt.Sprintf("%s %s.%s %s", p.Verb, p.Resource, g, where)
}

type permSet map[perm]bool

func perms(group string, resources []string, verbs []string, ns string) permSet {
	s := permSet{}
	for _, r := range resources {
		for _, v := range verbs {
			s[perm{group, r, v, ns}] = true
		}
	}
	return s
}

func (s permSet) add(o permSet) permSet {
	for p := range o {
		s[p] = true
	}
	return s
}

func (s permSet) sorted() []string {
	var out []string
	for p := range s {
		out = append(out, p.String())
	}
	sort.Strings(out)
	return out
}

// diff describes how got differs from want, or "" when they are equal.
func (s permSet) diff(got permSet) string {
	var missing, extra []string
	for p := range s {
		if !got[p] {
			missing = append(missing, p.String())
		}
	}
	for p := range got {
		if !s[p] {
			extra = append(extra, p.String())
		}
	}
	if len(missing) == 0 && len(extra) == 0 {
		return ""
	}
	sort.Strings(missing)
	sort.Strings(extra)
	return fmt.Sprintf("missing [%s], extra [%s]", strings.Join(missing, "; "), strings.Join(extra, "; "))
}

// wantInstaller is everything the installer's (and the plugin's) identity
// may do, in every overlay: read a pod and patch its status annotation.
func wantInstaller() permSet {
	s := perms("", []string{"pods"}, []string{"get", "patch"}, "")
	// Whether it leaves the node when it stops: its namespace, node and
	// DaemonSet, watched by name from its start.
	s.add(perms("", []string{"namespaces", "nodes"}, []string{"get", "list", "watch"}, ""))
	s.add(perms("apps", []string{"daemonsets"}, []string{"get", "list", "watch"}, ""))
	return s
}

// wantVerifier is everything the node verifier's identity may do: patch
// the status of pods and nodes (narrowed by its admission policy to its two
// conditions on its own node) and write Events. It reads nothing.
func wantVerifier() permSet {
	s := perms("", []string{"pods/status", "nodes/status"}, []string{"patch"}, "")
	s.add(perms("", []string{"events"}, []string{"create", "patch"}, ""))
	s.add(perms("events.k8s.io", []string{"events"}, []string{"create", "patch"}, ""))
	return s
}

// wantController is everything the controller's identity may do with an
// overlay, as docs/design/deployment.md states it.
func wantController(overlay string) permSet { return wantControllerIn(overlay, namespace) }

// wantControllerIn is wantController for the manifests installed in
// namespace ns (its leader Lease lives there).
func wantControllerIn(overlay, ns string) permSet {
	s := permSet{}
	s.add(perms("", []string{"pods"}, []string{"get", "list", "watch"}, ""))
	s.add(perms("", []string{"events"}, []string{"create", "patch"}, ""))
	s.add(perms("events.k8s.io", []string{"events"}, []string{"create", "patch"}, ""))
	s.add(perms("", []string{"nodes"}, []string{"get", "list", "watch"}, ""))
	// Node readiness: where the CNI DaemonSets will run pods.
	s.add(perms("apps", []string{"daemonsets"}, []string{"list", "watch"}, ""))
	if overlay != "audit" {
		// Node readiness; audit only reports it.
		s.add(perms("", []string{"nodes"}, []string{"patch"}, ""))
	}
	s.add(perms("coordination.k8s.io", []string{"leases"}, []string{"get", "create", "update"}, ns))
	switch overlay {
	case "base": // evict
		s.add(perms("", []string{"pods/eviction"}, []string{"create"}, ""))
	case "audit": // dry-run: no pod or node mutation at all
	case "delete":
		s.add(perms("", []string{"pods"}, []string{"delete"}, ""))
	case "label":
		s.add(perms("", []string{"pods"}, []string{"patch"}, ""))
	default:
		panic("unknown overlay " + overlay)
	}
	return s
}
