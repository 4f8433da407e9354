package redirect

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Backend is the iptables backend: which kernel interface the rules go
// through. It must be the one the node itself uses (kube-proxy, kubelet),
// or the pod ends up with rules in two worlds.
type Backend string

const (
	// BackendNFT is iptables over nf_tables (iptables-nft).
	BackendNFT Backend = "nft"
	// BackendLegacy is the x_tables interface (iptables-legacy).
	BackendLegacy Backend = "legacy"
	// BackendDefault runs plain iptables-restore, whichever backend the
	// system's alternatives point to. Used only when neither variant is
	// installed.
	BackendDefault Backend = ""
)

// ParseBackend reads a configured backend name: "nft", "legacy", or ""/"auto"
// for detection (returned as BackendDefault with auto=true).
func ParseBackend(s string) (b Backend, auto bool, err error) {
	switch strings.ToLower(s) {
	case "", "auto":
		return BackendDefault, true, nil
	case "nft":
		return BackendNFT, false, nil
	case "legacy":
		return BackendLegacy, false, nil
	}
	return "", false, fmt.Errorf("%q is not an iptables backend (want \"auto\", \"nft\" or \"legacy\")", s)
}

func (b Backend) String() string {
	if b == BackendDefault {
		return "default"
	}
	return string(b)
}

// Tool returns the name of the iptables command of the backend for a
// family, for example ip6tables-nft.
func (b Backend) Tool(fam Family) string {
	base := "iptables"
	if fam == IPv6 {
		base = "ip6tables"
	}
	if b != BackendDefault {
		base += "-" + string(b)
	}
	return base
}

// Command returns the name of the tool for a family and a verb ("save" or
// "restore"), for example ip6tables-nft-restore.
func (b Backend) Command(fam Family, verb string) string {
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

// NetnsExecutor runs the backend's iptables-save and iptables-restore inside
// a network namespace: the command is started from an OS thread switched
// into the namespace, so it inherits it (no nsenter in between).
type NetnsExecutor struct {
	// NetNS is the path of the namespace (CNI_NETNS); empty means the
	// current one.
	NetNS   string
	Backend Backend
	// Wait bounds how long a legacy restore waits for the xtables lock,
	// which is shared with every other iptables user of the host. Zero
	// means 10 seconds.
	Wait time.Duration
}

// Save implements Executor.
func (e *NetnsExecutor) Save(ctx context.Context, fam Family) ([]byte, error) {
	out, err := e.run(ctx, fam, "save", nil, "-t", Table)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Restore implements Executor.
func (e *NetnsExecutor) Restore(ctx context.Context, fam Family, input []byte) error {
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

func (e *NetnsExecutor) run(ctx context.Context, fam Family, verb string, stdin []byte, args ...string) ([]byte, error) {
	name := e.Backend.Command(fam, verb)
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
	if err := InNetns(e.NetNS, cmd.Run); err != nil {
		out := stderr.String()
		if verb == "restore" && out == "" {
			out = stdout.String()
		}
		return nil, &ToolError{Tool: name, NetNS: e.NetNS, Err: err, Output: out}
	}
	return stdout.Bytes(), nil
}

// ErrNetnsGone is returned (wrapped) when the namespace path does not exist
// or is not a namespace any more.
var ErrNetnsGone = errors.New("network namespace does not exist")

// InNetns runs fn on an OS thread switched into the network namespace at
// path (the current namespace when path is empty). The thread is discarded
// afterwards, so no other goroutine ever runs in the namespace.
func InNetns(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the goroutine's exit terminates the thread, so a
		// thread left in the pod namespace is never reused.
		runtime.LockOSThread()
		h, err := netns.GetFromPath(path)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				err = fmt.Errorf("%s: %w", path, ErrNetnsGone)
			}
			errc <- err
			return
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			if errors.Is(err, unix.EINVAL) {
				// The path exists but is not a network namespace (any
				// more): an unmounted bind mount, a leftover file.
				err = fmt.Errorf("%w: setns: %v", ErrNetnsGone, err)
			}
			errc <- fmt.Errorf("enter netns %s: %w", path, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}
