package cniconf

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// A node the product has left must never fail pods because of it. The
// installer leaves by `uninstall` (and, on SIGTERM, when the API says no
// installer pod will come back to the node: pkg/install/leave), which
// removes the kubeconfig, so the plugin passes pods through
// (ErrNoKubeconfig). Some ways out leave the chain in place with
// credentials that stay refused: the installer was stopped without
// running anything (killed, or its own credentials were already refused
// when it asked the API), or an older installer without this rule. The
// plugin cannot ask the API then, so it judges from what the installer
// leaves in the CNI bin directory, the installer state file:
//
//   - its modification time is the installer's heartbeat: every running
//     installer refreshes it every HeartbeatInterval;
//   - its content says, when an installer stopped and the API said the
//     DaemonSet still targets the node (a rolling update, a restart, an
//     eviction), until when a successor is expected (SuccessorWait).
//
// With its credentials refused (401, 403), the plugin takes the node for
// one the product left, and passes the pod through as on an uninstalled
// node, only when the state file exists (an installer with this rule ran
// here), no installer refreshed it for LeftAfter, and no successor is
// expected. Otherwise ADD fails closed, as for any other API problem. An
// installer that is merely restarting keeps its credentials (the pod
// object, which its token is bound to, still exists), and one that is
// replaced says a successor is expected, so neither opens a window. A pod
// passed through this way keeps transparent-proxy-status "enabled": the
// repair controller and the init-container check still find it.

// StateFileName is the installer state file in the CNI bin directory. It
// starts with a dot, so no chain entry's type ever names it.
const StateFileName = ".consul-cni-repair-state"

// Timing of the rule above.
const (
	// HeartbeatInterval is how often a running installer refreshes the
	// state file's modification time.
	HeartbeatInterval = 10 * time.Second
	// LeftAfter is how long after the last heartbeat refused credentials
	// mean the product left the node: three missed heartbeats.
	LeftAfter = 3 * HeartbeatInterval
	// SuccessorWait is how long a stopped installer that the API said will
	// be replaced keeps refused credentials failing ADD closed.
	SuccessorWait = 10 * time.Minute
)

// InstallerState is the content of the state file.
type InstallerState struct {
	// Pod is the installer's pod, namespace/name, when known.
	Pod string `json:"pod,omitempty"`
	// SuccessorExpectedUntil is set by an installer that stopped while the
	// API said another installer pod will run on the node.
	SuccessorExpectedUntil *time.Time `json:"successorExpectedUntil,omitempty"`
	// Reason says why the last writer stopped, for people and logs.
	Reason string `json:"reason,omitempty"`
}

// ReadInstallerState returns the state file of binDir and its
// modification time (the last heartbeat).
func ReadInstallerState(binDir string) (InstallerState, time.Time, error) {
	path := filepath.Join(binDir, StateFileName)
	var s InstallerState
	st, err := os.Stat(path)
	if err != nil {
		return s, time.Time{}, err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return s, time.Time{}, err
	}
	if len(b) > 0 {
		if err := json.Unmarshal(b, &s); err != nil {
			return s, time.Time{}, fmt.Errorf("%s: %w", path, err)
		}
	}
	return s, st.ModTime(), nil
}

// ProductLeft tells, from the state file of binDir, whether refused
// credentials mean the product has left the node (see above). why says
// what was found either way.
func ProductLeft(binDir string, now time.Time) (left bool, why string) {
	s, beat, err := ReadInstallerState(binDir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, "no installer state file (" + StateFileName + "): no installer that records its heartbeat ran on this node"
	case err != nil:
		return false, "the installer state file cannot be read: " + err.Error()
	case s.SuccessorExpectedUntil != nil && now.Before(*s.SuccessorExpectedUntil):
		return false, fmt.Sprintf("an installer is being replaced (%s); a successor is expected until %s", s.Reason, s.SuccessorExpectedUntil.UTC().Format(time.RFC3339))
	case now.Sub(beat) < LeftAfter:
		return false, "an installer ran on this node " + now.Sub(beat).Round(time.Second).String() + " ago"
	}
	why = "no installer has run on this node since " + beat.UTC().Format(time.RFC3339)
	if s.Reason != "" {
		why += " (the last one stopped: " + s.Reason + ")"
	}
	return true, why
}
