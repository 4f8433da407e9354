package verify

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/iptables"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/nftables"
)

// Verdict is what a look into a sandbox's namespace found.
type Verdict int

const (
	// Unknown: the namespace could not be read (gone, a tool failed): no
	// evidence either way.
	Unknown Verdict = iota
	// Redirected: one backend's rules are exactly as the configuration
	// asks (the comparison of the plugin's CHECK).
	Redirected
	// Unredirected: the namespace was read and holds no complete set of
	// our rules.
	Unredirected
)

func (v Verdict) String() string {
	switch v {
	case Redirected:
		return "redirected"
	case Unredirected:
		return "unredirected"
	}
	return "unknown"
}

// Result is a Verdict with what it rests on.
type Result struct {
	Verdict Verdict
	// Reason is one of annotations.ReasonRules* (empty for Unknown).
	Reason string
	// Backend names what was found: "nftables", "iptables-nft",
	// "iptables-legacy", or "" when nothing of ours was there.
	Backend string
	// Detail is the drift or the error, for the condition's message.
	Detail string
}

// Inspector looks into a network namespace for the rules of a traffic
// configuration.
type Inspector interface {
	Inspect(ctx context.Context, netns string, cfg annotations.TrafficConfig) Result
}

// Kernel is the real Inspector: the plugin's own comparisons
// (nftables.Check for the table inet consul_tproxy, redirect.Check on the
// iptables-save output of the variant that holds our chains), whichever
// backend and variant the sandbox's ADD used. A namespace holding one
// complete set is Redirected, even with leftovers of the other backend
// beside it (the plugin's CHECK reports those as drift; the traffic is
// redirected all the same).
type Kernel struct {
	// Root is where the host's file system is mounted ("" or "/" when the
	// verifier runs in the host's mount namespace). The iptables tools are
	// the host's, run chrooted into Root: the same tools the plugin runs.
	Root string
}

// Inspect implements Inspector.
func (k Kernel) Inspect(ctx context.Context, netns string, cfg annotations.TrafficConfig) Result {
	var drifts []string
	// The lookups below find nothing in a namespace that does not exist:
	// make sure it does first, so that "nothing" is evidence.
	if err := redirect.InNetns(netns, func() error { return nil }); err != nil {
		return Result{Detail: err.Error()}
	}
	present, err := nftables.Present(ctx, netns)
	if err != nil {
		return Result{Detail: err.Error()}
	}
	if present {
		err := nftables.Check(ctx, netns, nftables.Build(cfg))
		var d *nftables.Drift
		switch {
		case err == nil:
			return Result{Verdict: Redirected, Reason: annotations.ReasonRulesInPlace, Backend: "nftables"}
		case errors.As(err, &d):
			drifts = append(drifts, "nftables: "+err.Error())
		default:
			return Result{Detail: err.Error()}
		}
	}
	found, err := nftables.FindIptablesRules(ctx, netns)
	if err != nil {
		return Result{Detail: err.Error()}
	}
	for _, v := range []struct {
		on bool
		b  iptables.Variant
	}{{found.IptablesNFT, iptables.VariantNFT}, {found.IptablesLegacy, iptables.VariantLegacy}} {
		if !v.on {
			continue
		}
		name := "iptables-" + string(v.b)
		ours, err := checkIptables(ctx, &toolExecutor{root: k.Root, netns: netns, variant: v.b}, iptables.Build(cfg))
		switch {
		case err != nil:
			return Result{Detail: name + ": " + err.Error()}
		case ours == nil:
			return Result{Verdict: Redirected, Reason: annotations.ReasonRulesInPlace, Backend: name}
		case len(ours) > 0:
			drifts = append(drifts, name+": "+strings.Join(ours, "; "))
		}
		// ours empty, not nil: a nat table without any chain of ours
		// (legacy tables exist once anything used them).
	}
	if len(drifts) > 0 {
		return Result{Verdict: Unredirected, Reason: annotations.ReasonRulesDrifted, Detail: strings.Join(drifts, "; ")}
	}
	return Result{Verdict: Unredirected, Reason: annotations.ReasonRulesMissing,
		Detail: "no Consul redirect rules in the namespace (no table inet " + nftables.TableName + ", no chain " + redirect.ChainOutput + ")"}
}

// checkIptables compares each family's nat table with its rule set
// (iptables.RuleSet.Check, the plugin's CHECK). It returns nil when every
// family holds exactly the rules, an empty slice when no family holds
// anything of ours, and the drifts otherwise.
func checkIptables(ctx context.Context, ex iptables.Executor, sets []iptables.RuleSet) ([]string, error) {
	var drifts []string
	anyOurs := false
	for _, rs := range sets {
		out, err := ex.Save(ctx, rs.Family)
		if err != nil {
			return nil, err
		}
		cur, err := iptables.ParseSave(out)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", rs.Family, err)
		}
		anyOurs = anyOurs || cur.Ours()
		if d := rs.Check(cur); d != nil {
			drifts = append(drifts, d.Error())
		}
	}
	switch {
	case !anyOurs:
		return []string{}, nil
	case len(drifts) == 0:
		return nil, nil
	}
	return drifts, nil
}

// toolExecutor runs the host's iptables-save of one variant inside a
// namespace, chrooted into the host's root when the verifier runs in a
// container. It only reads.
type toolExecutor struct {
	root, netns string
	variant     iptables.Variant
}

func (e *toolExecutor) Save(ctx context.Context, fam redirect.Family) ([]byte, error) {
	name := e.variant.Command(fam, "save")
	path, err := lookToolIn(e.root, name)
	if err != nil {
		return nil, &iptables.ToolError{Tool: name, NetNS: e.netns, Err: err}
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, path, "-t", redirect.Table)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if chrooted(e.root) {
		cmd.Path = path
		cmd.Args[0] = path
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: e.root}
		cmd.Dir = "/"
	}
	if err := redirect.InNetns(e.netns, cmd.Run); err != nil {
		return nil, &iptables.ToolError{Tool: name, NetNS: e.netns, Err: err, Output: stderr.String()}
	}
	return stdout.Bytes(), nil
}

func (e *toolExecutor) Restore(context.Context, redirect.Family, []byte) error {
	return errors.New("the verifier never writes rules")
}

func chrooted(root string) bool { return root != "" && root != "/" }

// lookToolIn finds a tool in the usual directories below root; the path
// returned is the one to run inside root (chroot), or on the host when
// root is empty.
func lookToolIn(root, name string) (string, error) {
	if !chrooted(root) {
		return iptables.LookTool(name)
	}
	for _, d := range []string{"/usr/sbin", "/sbin", "/usr/local/sbin", "/usr/bin", "/bin"} {
		p := filepath.Join(d, name)
		if st, err := os.Stat(filepath.Join(root, p)); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found in the host's sbin and bin directories (host root %s)", name, root)
}
