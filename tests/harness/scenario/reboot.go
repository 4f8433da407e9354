package scenario

import (
	"context"
	"fmt"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/metrics"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
)

// runReboot is the node-reboot run. consul-cni is chained by the installer
// DaemonSet before the pods exist, so they are meshed with their status
// complete. Then the node reboots: kubelet and the runtime stop, every
// sandbox is lost, and the primary CNI rewrites its conflist without
// consul-cni while the node is down (as a primary CNI's own DaemonSet does
// at start-up). When the node is back every pod gets a new sandbox with the
// conflist of that moment, the installer pod among them: whichever sandbox
// is made before the installer has chained consul-cni again bypasses the
// proxy with its status still complete. The run reports how many pods
// bypassed, how many bypass at the end, and the controller's
// sandbox_recreated repairs.
func (r *runner) runReboot(ctx context.Context) (*Result, error) {
	if err := r.meshedBeforeTrouble(ctx); err != nil {
		return nil, err
	}
	r.setPhase("the node reboots; its conflist is rewritten without consul-cni")
	if err := r.node.Reboot(ctx, func() error {
		r.killConsulK8s()
		r.killVerifier()
		if err := r.unchain(); err != nil {
			return err
		}
		r.logf("chain while the node is down: %s", r.chainString())
		return nil
	}); err != nil {
		return nil, fmt.Errorf("reboot of node %s: %w", r.node.Name(), err)
	}
	r.setPhase("the node is back")
	if r.verifier != nil {
		if err := r.startVerifier(ctx); err != nil {
			return nil, err
		}
	}
	if r.consulK8s != nil {
		if err := r.runConsulK8s(ctx); err != nil {
			return nil, err
		}
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
	if res.VerifiedActions, err = r.actionsFor(judge.ReasonVerifiedUnredirected); err != nil {
		return nil, err
	}
	broken, err := r.metricSum(metrics.BrokenPods)
	if err != nil {
		return nil, err
	}
	open, err := r.metricSum(metrics.BreakerOpenNodes)
	if err != nil {
		return nil, err
	}
	res.Controller = &ControllerView{BrokenPods: int(broken), BreakerOpenNodes: int(open)}
	return res, nil
}

// ControllerView is what the repair controller reported at the end of a
// run (its metrics): the injected pods it judges outside the mesh, and the
// nodes on which its circuit breaker stops repairs.
type ControllerView struct {
	BrokenPods       int `json:"broken_pods"`
	BreakerOpenNodes int `json:"breaker_open_nodes"`
}

// meshedBeforeTrouble chains consul-cni by the installer DaemonSet, deploys
// the pods, waits until every one is meshed and then for longer than the
// controller's sandbox slack, so that a sandbox made from then on is later
// than the pods' cni-applied-at by more than the slack.
func (r *runner) meshedBeforeTrouble(ctx context.Context) error {
	r.setPhase("chaining consul-cni on the node")
	if err := r.applyCNIManifests(ctx, true); err != nil {
		return err
	}
	if err := r.waitChained(ctx); err != nil {
		return err
	}
	r.setPhase(fmt.Sprintf("deploying %d injected pods", r.cfg.Pods))
	if err := r.deploy(ctx); err != nil {
		return err
	}
	if err := r.waitRunning(ctx); err != nil {
		return err
	}
	r.setPhase("waiting for every pod to be meshed")
	if err := poll.Until(ctx, r.cfg.Timeout, waitInterval, func() (bool, error) {
		ok, _ := r.allMeshed(r.tick(ctx))
		return ok, nil
	}); err != nil {
		return fmt.Errorf("the pods were not all meshed with consul-cni chained: %w", err)
	}
	return r.wait(ctx, r.cfg.SandboxSlack+2*time.Second)
}
