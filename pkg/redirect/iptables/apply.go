package iptables

import (
	"context"
	"errors"
	"fmt"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
)

// Executor runs iptables-save and iptables-restore for the nat table of one
// network namespace. Restore applies its input atomically: either all of it
// or, on error, none of it.
type Executor interface {
	// Save returns `iptables-save -t nat` (ip6tables-save for IPv6).
	Save(ctx context.Context, fam redirect.Family) ([]byte, error)
	// Restore runs `iptables-restore --noflush` with the input.
	Restore(ctx context.Context, fam redirect.Family, input []byte) error
}

// Apply installs the rule sets so that each family's nat table ends up with
// exactly our rules, and leaves nothing of ours behind when it fails.
//
// A first ADD costs one restore per family: the input creates our chains
// with -N, so it fails without effect when they already exist. Only then is
// the table read and replaced in one restore, which makes a repeated ADD
// converge to the same table instead of duplicating the jump rules. When an
// existing state is found, families not in sets (an IPv6 pass left by an
// earlier dual-stack ADD) are cleaned up too.
func Apply(ctx context.Context, ex Executor, sets []RuleSet) error {
	var done []redirect.Family
	fail := func(err error) error {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), redirect.CleanupTimeout)
		defer cancel()
		if cerr := Remove(cctx, ex, append(done, FamiliesOf(sets)...)); cerr != nil {
			return fmt.Errorf("%w (and removing the partial rules failed too, some may be left: %v)", err, cerr)
		}
		return fmt.Errorf("%w (no rule of ours was left in place)", err)
	}
	for _, rs := range sets {
		err := ex.Restore(ctx, rs.Family, rs.RestoreNew())
		if err == nil {
			done = append(done, rs.Family)
			continue
		}
		cur, serr := readTable(ctx, ex, rs.Family)
		if serr != nil {
			return fail(fmt.Errorf("%w (reading the table to find out why failed: %v)", err, serr))
		}
		if !cur.Ours() {
			// Nothing of ours was there: the restore failed on its own.
			return fail(err)
		}
		if err := ex.Restore(ctx, rs.Family, rs.RestoreReplace(cur)); err != nil {
			return fail(err)
		}
		done = append(done, rs.Family)
		if rs.Family == redirect.IPv4 {
			removeOthers(ctx, ex, sets)
		}
	}
	return nil
}

// removeOthers cleans the families not in sets (an IPv6 pass left by an
// earlier dual-stack ADD). It is best effort: a node without IPv6 cannot even
// list that table, and rules left in it would redirect traffic to the proxy,
// never let it bypass.
func removeOthers(ctx context.Context, ex Executor, sets []RuleSet) {
	var others []redirect.Family
	for _, f := range redirect.Families {
		in := false
		for _, s := range sets {
			in = in || s.Family == f
		}
		if !in {
			others = append(others, f)
		}
	}
	_ = Remove(ctx, ex, others)
}

// Check compares each family's nat table with its rule set. It returns a
// *Drift (wrapped in CheckError) describing every difference, or nil.
func Check(ctx context.Context, ex Executor, sets []RuleSet) error {
	var drifts []*Drift
	for _, rs := range sets {
		cur, err := readTable(ctx, ex, rs.Family)
		if err != nil {
			return err
		}
		if d := rs.Check(cur); d != nil {
			drifts = append(drifts, d)
		}
	}
	if len(drifts) == 0 {
		return nil
	}
	return &CheckError{Drifts: drifts}
}

// CheckError is the drift of one or both families.
type CheckError struct{ Drifts []*Drift }

func (e *CheckError) Error() string {
	errs := make([]error, len(e.Drifts))
	for i, d := range e.Drifts {
		errs[i] = d
	}
	return errors.Join(errs...).Error()
}

// Remove deletes everything of ours from the nat tables of the given
// families (Families for both). Tables without our chains are left
// untouched, so Remove is idempotent.
func Remove(ctx context.Context, ex Executor, fams []redirect.Family) error {
	seen := map[redirect.Family]bool{}
	var errs []error
	for _, f := range fams {
		if seen[f] {
			continue
		}
		seen[f] = true
		cur, err := readTable(ctx, ex, f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if in := Cleanup(cur); in != nil {
			if err := ex.Restore(ctx, f, in); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

func readTable(ctx context.Context, ex Executor, fam redirect.Family) (*Current, error) {
	out, err := ex.Save(ctx, fam)
	if err != nil {
		return nil, err
	}
	cur, err := ParseSave(out)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", fam, err)
	}
	return cur, nil
}
