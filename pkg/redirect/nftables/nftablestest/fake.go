// Package nftablestest is an in-memory stand-in for the nftables backend's
// kernel side (nftables.Kernel), for unit tests of its callers.
package nftablestest

import (
	"context"
	"fmt"
	"sync"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/nftables"
)

// Fake keeps one table per namespace path.
type Fake struct {
	mu     sync.Mutex
	tables map[string]string
	// Iptables is what FindIptablesRules reports.
	Iptables redirect.Leftovers
	// ApplyErr, when set, makes Apply fail without a change.
	ApplyErr error
}

// Table returns the table in a namespace as nft lists it ("" for none).
func (f *Fake) Table(nsPath string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.tables[nsPath]
}

func (f *Fake) Apply(_ context.Context, nsPath string, t nftables.Table) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ApplyErr != nil {
		return f.ApplyErr
	}
	if f.tables == nil {
		f.tables = map[string]string{}
	}
	f.tables[nsPath] = t.String()
	return nil
}

func (f *Fake) Check(_ context.Context, nsPath string, t nftables.Table) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	got, ok := f.tables[nsPath]
	if !ok {
		return &nftables.Drift{Problems: []string{"table inet " + nftables.TableName + " is missing"}}
	}
	if got != t.String() {
		return &nftables.Drift{Problems: []string{fmt.Sprintf("table is\n%s\nwant\n%s", got, t.String())}}
	}
	return nil
}

func (f *Fake) Remove(_ context.Context, nsPath string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.tables, nsPath)
	return nil
}

func (f *Fake) Present(_ context.Context, nsPath string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.tables[nsPath]
	return ok, nil
}

func (f *Fake) FindIptablesRules(context.Context, string) (redirect.Leftovers, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.Iptables, nil
}

// ApplyUnlessIptables reports Iptables when it has any, else applies.
func (f *Fake) ApplyUnlessIptables(ctx context.Context, nsPath string, t nftables.Table) (redirect.Leftovers, error) {
	if found, _ := f.FindIptablesRules(ctx, nsPath); found.Any() {
		return found, nil
	}
	return redirect.Leftovers{}, f.Apply(ctx, nsPath, t)
}
