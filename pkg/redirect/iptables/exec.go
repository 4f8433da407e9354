package iptables

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
)

// Variant is the variant of the iptables tools: which kernel interface the
// rules go through. It must be the one the node itself uses (kube-proxy, kubelet),
// or the pod ends up with rules in two worlds.
type Variant string

const (
	// VariantNFT is iptables over nf_tables (iptables-nft).
	VariantNFT Variant = "nft"
	// VariantLegacy is the x_tables interface (iptables-legacy).
	VariantLegacy Variant = "legacy"
	// VariantDefault runs plain iptables-restore, whichever variant the
	// system's alternatives point to. Used only when neither variant is
	// installed.
	VariantDefault Variant = ""
)

// ParseVariant reads a configured variant: "nft", "legacy", or ""/"auto"
// for detection (returned as VariantDefault with auto=true).
func ParseVariant(s string) (b Variant, auto bool, err error) {
	switch strings.ToLower(s) {
	case "", "auto":
		return VariantDefault, true, nil
	case "nft":
		return VariantNFT, false, nil
	case "legacy":
		return VariantLegacy, false, nil
	}
	return "", false, fmt.Errorf("%q is not an iptables variant (want \"auto\", \"nft\" or \"legacy\")", s)
}

func (b Variant) String() string {
	if b == VariantDefault {
		return "default"
	}
	return string(b)
}

// Tool returns the name of the iptables command of the variant for a
// family, for example ip6tables-nft.
func (b Variant) Tool(fam redirect.Family) string {
	base := "iptables"
	if fam == redirect.IPv6 {
		base = "ip6tables"
	}
	if b != VariantDefault {
		base += "-" + string(b)
	}
	return base
}

// Command returns the name of the tool for a family and a verb ("save" or
// "restore"), for example ip6tables-nft-restore.
func (b Variant) Command(fam redirect.Family, verb string) string {
	return b.Tool(fam) + "-" + verb
}

// sbinDirs are searched when a tool is not on PATH: container runtimes
// often run plugins with a PATH that lacks the sbin directories.
var sbinDirs = []string{"/usr/sbin", "/sbin", "/usr/local/sbin", "/usr/bin", "/bin"}

// LookTool finds a tool on PATH or in the usual sbin directories.
func LookTool(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, d := range sbinDirs {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found on PATH or in %s", name, strings.Join(sbinDirs, ", "))
}

// NetnsExecutor runs the variant's iptables-save and iptables-restore inside
// a network namespace: the command is started from an OS thread switched
// into the namespace, so it inherits it (no nsenter in between).
type NetnsExecutor struct {
	// NetNS is the path of the namespace (CNI_NETNS); empty means the
	// current one.
	NetNS   string
	Variant Variant
	// Wait bounds how long a legacy restore waits for the xtables lock,
	// which is shared with every other iptables user of the host. Zero
	// means 10 seconds.
	Wait time.Duration
}

// Save implements Executor.
func (e *NetnsExecutor) Save(ctx context.Context, fam redirect.Family) ([]byte, error) {
	out, err := e.run(ctx, fam, "save", nil, "-t", redirect.Table)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Restore implements Executor.
func (e *NetnsExecutor) Restore(ctx context.Context, fam redirect.Family, input []byte) error {
	wait := e.Wait
	if wait <= 0 {
		wait = 10 * time.Second
	}
	secs := int((wait + time.Second - 1) / time.Second)
	_, err := e.run(ctx, fam, "restore", input, "--noflush", "--wait="+strconv.Itoa(secs))
	return err
}

// ToolError is a failed iptables tool run, with what it printed.
type ToolError struct {
	Tool   string
	NetNS  string
	Err    error
	Output string
}

func (e *ToolError) Error() string {
	where := ""
	if e.NetNS != "" {
		where = " in netns " + e.NetNS
	}
	out := strings.TrimSpace(e.Output)
	if out != "" {
		out = ": " + strings.ReplaceAll(out, "\n", " / ")
	}
	return fmt.Sprintf("%s%s failed: %v%s", e.Tool, where, e.Err, out)
}

func (e *ToolError) Unwrap() error { return e.Err }

func (e *NetnsExecutor) run(ctx context.Context, fam redirect.Family, verb string, stdin []byte, args ...string) ([]byte, error) {
	name := e.Variant.Command(fam, verb)
	path, err := LookTool(name)
	if err != nil {
		return nil, &ToolError{Tool: name, NetNS: e.NetNS, Err: err}
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, path, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// Children are forked from the calling thread, so a command started on a
	// thread inside the namespace runs inside it.
	if err := redirect.InNetns(e.NetNS, cmd.Run); err != nil {
		out := stderr.String()
		if verb == "restore" && out == "" {
			out = stdout.String()
		}
		return nil, &ToolError{Tool: name, NetNS: e.NetNS, Err: err, Output: out}
	}
	return stdout.Bytes(), nil
}
