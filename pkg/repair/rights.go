package repair

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
)

// A controller without the rights its configuration needs does not fail:
// its informers never sync, or every eviction, deletion or node patch is
// refused one by one, and the only trace is in its log and Events. It must
// be loud instead: every replica asks the API server, with a
// SelfSubjectAccessReview per right, whether its own identity holds each
// right its configuration needs, at start and every rightsCheckPeriod.
// While one is denied, /readyz fails naming it and
// consul_cni_repair_missing_rights{verb,resource} is 1 (the alert
// ConsulCNIRepairMissingRights). The review asks the authorizer (RBAC,
// webhooks); admission policies that refuse a particular write are not
// rights and are not seen here.

// rightsCheckPeriod is how often the rights are reviewed again.
const rightsCheckPeriod = time.Minute

// right is a verb on a resource, cluster-wide unless namespaced (the
// DaemonSets are read in the CNI namespace only).
type right struct {
	verb, group, resource, subresource string
	// namespace: "" for cluster-wide.
	namespace string
}

// String is the right as the metric's resource label and the messages
// name it: "create pods/eviction".
func (r right) String() string { return r.verb + " " + r.resourceLabel() }

func (r right) resourceLabel() string {
	if r.subresource == "" {
		return r.resource
	}
	return r.resource + "/" + r.subresource
}

// requiredRights lists the rights cfg needs: list and watch of pods and
// nodes for the informers (and of DaemonSets for node readiness), the configured action's write unless in dry
// run, and patch of nodes for node readiness unless in dry run.
func requiredRights(cfg Config) []right {
	out := []right{{verb: "list", resource: "pods"}, {verb: "watch", resource: "pods"}, {verb: "list", resource: "nodes"}, {verb: "watch", resource: "nodes"}}
	if cfg.NodeReadiness {
		out = append(out, right{verb: "list", group: "apps", resource: "daemonsets", namespace: cfg.CNINamespace},
			right{verb: "watch", group: "apps", resource: "daemonsets", namespace: cfg.CNINamespace})
	}
	if cfg.DryRun {
		return out
	}
	switch cfg.Action {
	case judge.ActionEvict:
		out = append(out, right{verb: "create", resource: "pods", subresource: "eviction"})
	case judge.ActionDelete:
		out = append(out, right{verb: "delete", resource: "pods"})
	case judge.ActionLabel:
		out = append(out, right{verb: "patch", resource: "pods"})
	}
	if cfg.NodeReadiness {
		out = append(out, right{verb: "patch", resource: "nodes"})
	}
	return out
}

// rightsChecker reviews the rights and holds the last verdict.
type rightsChecker struct {
	client kubernetes.Interface
	rights []right
	gauge  *prometheus.GaugeVec

	mu      sync.Mutex
	checked bool
	missing []string
}

func newRightsChecker(client kubernetes.Interface, rights []right, gauge *prometheus.GaugeVec) *rightsChecker {
	for _, r := range rights {
		gauge.WithLabelValues(r.verb, r.resourceLabel())
	}
	return &rightsChecker{client: client, rights: rights, gauge: gauge}
}

// run reviews the rights now and every period until ctx is done.
func (c *rightsChecker) run(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		c.check(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// check reviews every right. A right whose review fails (API error) keeps
// its last verdict: the review cannot tell, and the informers' sync shows
// an API that cannot be reached.
func (c *rightsChecker) check(ctx context.Context) {
	logger := klog.FromContext(ctx)
	c.mu.Lock()
	prev := slices.Clone(c.missing)
	c.mu.Unlock()
	var missing []string
	var errs []error
	for _, r := range c.rights {
		allowed, reason, err := c.review(ctx, r)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", r, err))
			if slices.Contains(prev, r.String()) {
				missing = append(missing, r.String())
			}
			continue
		}
		v := 0.0
		if !allowed {
			v = 1
			missing = append(missing, r.String())
			logger.V(2).Info("Right denied", "right", r.String(), "reason", reason)
		}
		c.gauge.WithLabelValues(r.verb, r.resourceLabel()).Set(v)
	}
	if len(errs) > 0 {
		logger.Error(errors.Join(errs...), "Cannot review this controller's rights (SelfSubjectAccessReview); keeping the last verdict")
	}
	switch {
	case len(missing) > 0 && !slices.Equal(missing, prev):
		logger.Error(nil, "This controller lacks rights its configuration needs; it is not ready until they are granted (check its ClusterRole and ClusterRoleBinding)",
			"missing", strings.Join(missing, ", "))
	case len(missing) == 0 && len(prev) > 0:
		logger.Info("Every right this controller needs is granted again")
	}
	c.mu.Lock()
	c.checked, c.missing = true, missing
	c.mu.Unlock()
}

// review asks whether this controller's identity may do r.
func (c *rightsChecker) review(ctx context.Context, r right) (allowed bool, reason string, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res, err := c.client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
		Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
			Verb: r.verb, Group: r.group, Resource: r.resource, Subresource: r.subresource, Namespace: r.namespace,
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		return false, "", err
	}
	return res.Status.Allowed && !res.Status.Denied, res.Status.Reason, nil
}

// ready is nil once the rights were reviewed and none is missing.
func (c *rightsChecker) ready() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.checked {
		return errors.New("rights not reviewed yet")
	}
	if len(c.missing) > 0 {
		return fmt.Errorf("missing rights: %s (see the ClusterRole and ClusterRoleBinding of this controller's service account)", strings.Join(c.missing, ", "))
	}
	return nil
}
