package iptables

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
)

// Runner runs a tool (by name) in the node's own network namespace and
// returns its standard output.
type Runner func(ctx context.Context, name string, args ...string) ([]byte, error)

// VariantDetector finds the iptables variant the node uses. Its zero value
// runs the real tools.
type VariantDetector struct {
	// Run runs a save tool; nil means ExecRunner.
	Run Runner
	// Look finds an installed tool; nil means LookTool.
	Look func(name string) (string, error)
}

// kubeHints are the chains kubelet creates in the mangle table of the
// variant the node uses; kube-proxy's iptables wrapper looks for them first.
var kubeHints = []string{":KUBE-IPTABLES-HINT", ":KUBE-KUBELET-CANARY"}

// Detect chooses the variant the node uses, the way kube-proxy's
// iptables wrapper and Istio do, from the tables of the node's own network
// namespace (the plugin is started in it):
//  1. kubelet's hint chains in the mangle table of nft, else of legacy;
//  2. otherwise the variant holding more rules (IPv4 and IPv6 together),
//     nft when equal;
//  3. a variant whose tools are not installed is never chosen; when neither
//     variant is installed, plain iptables-restore (VariantDefault).
//
// The reason says which step decided, for the log.
func (d VariantDetector) Detect(ctx context.Context) (Variant, string) {
	run, look := d.Run, d.Look
	if run == nil {
		run = ExecRunner
	}
	if look == nil {
		look = LookTool
	}
	have := func(b Variant) bool {
		_, err := look(b.Command(redirect.IPv4, "restore"))
		return err == nil
	}
	nftOK, legacyOK := have(VariantNFT), have(VariantLegacy)
	switch {
	case !nftOK && !legacyOK:
		return VariantDefault, "neither iptables-nft nor iptables-legacy is installed"
	case !legacyOK:
		return VariantNFT, "iptables-legacy is not installed"
	case !nftOK:
		return VariantLegacy, "iptables-nft is not installed"
	}
	save := func(b Variant, args ...string) string {
		var all []byte
		for _, f := range redirect.Families {
			out, _ := run(ctx, b.Command(f, "save"), args...)
			all = append(all, out...)
		}
		return string(all)
	}
	hinted := func(out string) bool {
		for _, line := range strings.Split(out, "\n") {
			for _, h := range kubeHints {
				if strings.HasPrefix(line, h+" ") || line == h {
					return true
				}
			}
		}
		return false
	}
	// nft save with -t never creates a table; legacy save without -t lists
	// only existing tables and so loads no kernel module.
	if hinted(save(VariantNFT, "-t", "mangle")) {
		return VariantNFT, "kubelet's hint chains are in the nft mangle table"
	}
	legacy := save(VariantLegacy)
	if hinted(legacy) {
		return VariantLegacy, "kubelet's hint chains are in the legacy mangle table"
	}
	nLegacy, nNFT := countRules(legacy), countRules(save(VariantNFT))
	if nLegacy > nNFT {
		return VariantLegacy, fmt.Sprintf("legacy holds more rules (%d) than nft (%d)", nLegacy, nNFT)
	}
	return VariantNFT, fmt.Sprintf("nft holds as many or more rules (%d) than legacy (%d)", nNFT, nLegacy)
}

func countRules(out string) int {
	n := 0
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "-") {
			n++
		}
	}
	return n
}

// ExecRunner runs tools found by LookTool in the current namespace, each
// bounded by the context.
func ExecRunner(ctx context.Context, name string, args ...string) ([]byte, error) {
	path, err := LookTool(name)
	if err != nil {
		return nil, err
	}
	var stdout bytes.Buffer
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Stdout = &stdout
	err = cmd.Run()
	return stdout.Bytes(), err
}

// Cached returns the node's variant, remembering a detection in
// dir/iptables-variant for ttl so that detection (which reads the node's
// whole ruleset) does not run on every ADD. An unusable dir only disables
// the cache.
func (d VariantDetector) Cached(ctx context.Context, dir string, ttl time.Duration) (Variant, string) {
	file := ""
	if dir != "" {
		file = filepath.Join(dir, "iptables-variant")
		if st, err := os.Stat(file); err == nil && time.Since(st.ModTime()) < ttl {
			if b, err := os.ReadFile(file); err == nil {
				name := strings.TrimSpace(string(b))
				if be, auto, err := ParseVariant(name); err == nil && !auto {
					return be, "detected earlier (cached in " + file + ")"
				}
			}
		}
	}
	b, why := d.Detect(ctx)
	if file != "" && b != VariantDefault {
		if err := os.MkdirAll(dir, 0o755); err == nil {
			tmp := fmt.Sprintf("%s.%d", file, os.Getpid())
			if os.WriteFile(tmp, []byte(string(b)+"\n"), 0o644) == nil {
				if os.Rename(tmp, file) != nil {
					os.Remove(tmp)
				}
			}
		}
	}
	return b, why
}
