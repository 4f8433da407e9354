package redirect

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Runner runs a tool (by name) in the node's own network namespace and
// returns its standard output.
type Runner func(ctx context.Context, name string, args ...string) ([]byte, error)

// Detector finds the node's backend. Its zero value runs the real tools.
type Detector struct {
	// Run runs a save tool; nil means ExecRunner.
	Run Runner
	// Look finds an installed tool; nil means LookTool.
	Look func(name string) (string, error)
}

// kubeHints are the chains kubelet creates in the mangle table of the
// backend the node uses; kube-proxy's iptables wrapper looks for them first.
var kubeHints = []string{":KUBE-IPTABLES-HINT", ":KUBE-KUBELET-CANARY"}

// Detect chooses the backend the node uses, the way kube-proxy's
// iptables wrapper and Istio do, from the tables of the node's own network
// namespace (the plugin is started in it):
//  1. kubelet's hint chains in the mangle table of nft, else of legacy;
//  2. otherwise the backend holding more rules (IPv4 and IPv6 together),
//     nft when equal;
//  3. a backend whose tools are not installed is never chosen; when neither
//     variant is installed, plain iptables-restore (BackendDefault).
//
// The reason says which step decided, for the log.
func (d Detector) Detect(ctx context.Context) (Backend, string) {
	run, look := d.Run, d.Look
	if run == nil {
		run = ExecRunner
	}
	if look == nil {
		look = LookTool
	}
	have := func(b Backend) bool {
		_, err := look(b.Command(IPv4, "restore"))
		return err == nil
	}
	nftOK, legacyOK := have(BackendNFT), have(BackendLegacy)
	switch {
	case !nftOK && !legacyOK:
		return BackendDefault, "neither iptables-nft nor iptables-legacy is installed"
	case !legacyOK:
		return BackendNFT, "iptables-legacy is not installed"
	case !nftOK:
		return BackendLegacy, "iptables-nft is not installed"
	}
	save := func(b Backend, args ...string) string {
		var all []byte
		for _, f := range Families {
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
	if hinted(save(BackendNFT, "-t", "mangle")) {
		return BackendNFT, "kubelet's hint chains are in the nft mangle table"
	}
	legacy := save(BackendLegacy)
	if hinted(legacy) {
		return BackendLegacy, "kubelet's hint chains are in the legacy mangle table"
	}
	nLegacy, nNFT := countRules(legacy), countRules(save(BackendNFT))
	if nLegacy > nNFT {
		return BackendLegacy, fmt.Sprintf("legacy holds more rules (%d) than nft (%d)", nLegacy, nNFT)
	}
	return BackendNFT, fmt.Sprintf("nft holds as many or more rules (%d) than legacy (%d)", nNFT, nLegacy)
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

// Cached returns the node's backend, remembering a detection in
// dir/iptables-backend for ttl so that detection (which reads the node's
// whole ruleset) does not run on every ADD. An unusable dir only disables
// the cache.
func (d Detector) Cached(ctx context.Context, dir string, ttl time.Duration) (Backend, string) {
	file := ""
	if dir != "" {
		file = filepath.Join(dir, "iptables-backend")
		if st, err := os.Stat(file); err == nil && time.Since(st.ModTime()) < ttl {
			if b, err := os.ReadFile(file); err == nil {
				name := strings.TrimSpace(string(b))
				if be, auto, err := ParseBackend(name); err == nil && !auto {
					return be, "detected earlier (cached in " + file + ")"
				}
			}
		}
	}
	b, why := d.Detect(ctx)
	if file != "" && b != BackendDefault {
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
