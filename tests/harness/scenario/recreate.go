package scenario

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
)

// runRecreated is the sandbox-recreated run. consul-cni is chained before
// the pods exist, so they are meshed and their status says complete. Then,
// as after a node reboot whose primary CNI rewrote its conflist before the
// installer came back: the installer is gone, consul-cni is out of the
// chain, and one pod's sandbox is made again without it. That pod bypasses
// the proxy with its status still complete. The installer returns, the node
// is ready again, the controller replaces the pod (sandbox_recreated) and
// the replacement is meshed.
func (r *runner) runRecreated(ctx context.Context) (*Result, error) {
	if err := r.meshedBeforeTrouble(ctx); err != nil {
		return nil, err
	}
	victim, err := r.loseOneSandbox(ctx)
	if err != nil {
		return nil, err
	}
	r.setPhase("the installer comes back")
	if err := r.applyCNIManifests(ctx, true); err != nil {
		return nil, err
	}
	if err := r.waitChained(ctx); err != nil {
		return nil, err
	}
	res, err := r.observe(ctx, true)
	if err != nil {
		return nil, err
	}
	if res.RecreatedActions, err = r.actionsFor(judge.ReasonSandboxRecreated); err != nil {
		return nil, err
	}
	for i := range res.PodResults {
		if res.PodResults[i].UID == string(victim) {
			res.Recreated = &res.PodResults[i]
		}
	}
	return res, nil
}

// loseOneSandbox takes the installer and consul-cni away, recreates the
// sandbox of the first pod (by name) and waits until its prober reports a
// bypass.
func (r *runner) loseOneSandbox(ctx context.Context) (types.UID, error) {
	live := r.tick(ctx)
	if len(live) == 0 {
		return "", fmt.Errorf("no live pod")
	}
	sort.Slice(live, func(i, j int) bool { return live[i].Name < live[j].Name })
	victim := live[0]
	r.setPhase("the installer is gone and consul-cni out of the chain")
	if err := r.deleteWorkload(r.dsNamespace, r.dsName, true); err != nil {
		return "", err
	}
	if err := r.unchain(); err != nil {
		return "", err
	}
	// The controller's gate closes with the installer gone: it must not
	// act before the bypass is seen.
	if err := poll.Until(ctx, 2*time.Minute, waitInterval, func() (bool, error) {
		n, err := r.cs.CoreV1().Nodes().Get(ctx, r.node.Name(), metav1.GetOptions{})
		return err == nil && n.Labels[annotations.LabelCNIReady] != annotations.LabelCNIReadyValue, nil
	}); err != nil {
		return "", fmt.Errorf("node %s kept %s with its installer gone: %w", r.node.Name(), annotations.LabelCNIReady, err)
	}
	r.logf("chain now: %s", r.chainString())
	r.setPhase("pod " + victim.Name + " loses its sandbox")
	if err := r.node.RecreateSandbox(ctx, victim.UID); err != nil {
		return "", err
	}
	if err := poll.Until(ctx, r.cfg.Timeout, waitInterval, func() (bool, error) {
		r.tick(ctx)
		return victim.Bypass > 0 && victim.Last == resultBypass, nil
	}); err != nil {
		return "", fmt.Errorf("pod %s never bypassed in its new sandbox: %w", victim.Name, err)
	}
	r.logf("pod %s bypasses in its new sandbox", victim.Name)
	return victim.UID, nil
}

// unchain removes consul-cni from the node's primary conflist, as a primary
// CNI rewriting its own configuration at start-up does.
func (r *runner) unchain() error {
	file := r.node.PrimaryConflist()
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	var conf map[string]any
	if err := json.Unmarshal(b, &conf); err != nil {
		return err
	}
	plugins, _ := conf["plugins"].([]any)
	var kept []any
	for _, p := range plugins {
		if m, ok := p.(map[string]any); ok && m["type"] == "consul-cni" {
			continue
		}
		kept = append(kept, p)
	}
	conf["plugins"] = kept
	out, _ := json.MarshalIndent(conf, "", "  ")
	return writeFileAtomic(file, out)
}
