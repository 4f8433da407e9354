// Package cri reads a node's pod sandboxes from its container runtime over
// the CRI socket (containerd and CRI-O alike): which sandboxes are ready,
// which pod each belongs to, the pod's labels and annotations as the
// runtime received them at RunPodSandbox, and the path of the sandbox's
// network namespace as the runtime itself reports it.
//
// The netns path comes from the sandbox's verbose status: both runtimes put
// a JSON document under the info key "info" whose "runtimeSpec" is the OCI
// spec of the sandbox, and the network namespace entry of its
// linux.namespaces names the path the runtime bound the namespace at
// (containerd: <state>/netns/cni-<uuid> or /var/run/netns/cni-<uuid>;
// CRI-O: /var/run/netns/<uuid>, also with drop_infra_ctr). Nothing is guessed
// from /proc or from a directory listing: a sandbox whose status names no
// network namespace path is reported with an empty NetNS and an error.
//
// The client polls (List) instead of subscribing to GetContainerEvents:
// containerd serves that stream from a single queue, so a second subscriber
// would take events away from a kubelet running with evented PLEG.
package cri

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Sandbox is one ready pod sandbox as the runtime lists it.
type Sandbox struct {
	// ID is the runtime's sandbox ID.
	ID string
	// PodUID, PodName and PodNamespace come from the sandbox metadata
	// (kubelet's RunPodSandbox); Attempt counts the pod's sandboxes.
	PodUID, PodName, PodNamespace string
	Attempt                       uint32
	// Created is when the runtime created the sandbox.
	Created time.Time
	// Labels and Annotations are the pod's, as kubelet passed them at
	// RunPodSandbox (annotations: the pod's at that moment).
	Labels, Annotations map[string]string
}

// Status is what a sandbox's verbose status adds to Sandbox.
type Status struct {
	// HostNetwork is true for a sandbox in the node's network namespace
	// (no CNI call was made for it).
	HostNetwork bool
	// NetNS is the path of the sandbox's network namespace as the
	// runtime reports it (empty with HostNetwork).
	NetNS string
}

// Runtime is the part of the CRI runtime service the verifier uses.
type Runtime interface {
	// List returns the ready sandboxes.
	List(ctx context.Context) ([]Sandbox, error)
	// Status returns a sandbox's network namespace.
	Status(ctx context.Context, id string) (Status, error)
}

// Client is a Runtime over a CRI socket.
type Client struct {
	conn *grpc.ClientConn
	rt   runtimeapi.RuntimeServiceClient
	// Endpoint is the socket, as given to Dial.
	Endpoint string
}

// maxMsgSize matches kubelet's limit for CRI responses (16 MiB).
const maxMsgSize = 16 * 1024 * 1024

// Dial connects to a CRI endpoint (a unix socket path, with or without the
// unix:// prefix) and checks that it serves the v1 runtime service.
func Dial(ctx context.Context, endpoint string) (*Client, error) {
	path := strings.TrimPrefix(endpoint, "unix://")
	if path == "" || !strings.HasPrefix(path, "/") {
		return nil, fmt.Errorf("CRI endpoint %q: want an absolute unix socket path", endpoint)
	}
	conn, err := grpc.NewClient("unix://"+path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMsgSize)))
	if err != nil {
		return nil, fmt.Errorf("CRI endpoint %s: %w", path, err)
	}
	c := &Client{conn: conn, rt: runtimeapi.NewRuntimeServiceClient(conn), Endpoint: path}
	vctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := c.rt.Version(vctx, &runtimeapi.VersionRequest{}); err != nil {
		conn.Close()
		return nil, fmt.Errorf("CRI endpoint %s: runtime.v1 Version: %w", path, err)
	}
	return c, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Version returns the runtime's name and version.
func (c *Client) Version(ctx context.Context) (string, error) {
	v, err := c.rt.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		return "", err
	}
	return v.RuntimeName + " " + v.RuntimeVersion, nil
}

// List implements Runtime.
func (c *Client) List(ctx context.Context) ([]Sandbox, error) {
	resp, err := c.rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		State: &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY},
	}})
	if err != nil {
		return nil, fmt.Errorf("ListPodSandbox: %w", err)
	}
	out := make([]Sandbox, 0, len(resp.Items))
	for _, s := range resp.Items {
		if s.State != runtimeapi.PodSandboxState_SANDBOX_READY || s.Metadata == nil {
			continue
		}
		out = append(out, Sandbox{
			ID: s.Id, PodUID: s.Metadata.Uid, PodName: s.Metadata.Name, PodNamespace: s.Metadata.Namespace,
			Attempt: s.Metadata.Attempt, Created: time.Unix(0, s.CreatedAt),
			Labels: s.Labels, Annotations: s.Annotations,
		})
	}
	return out, nil
}

// ErrNoNetNS means the runtime's status of a sandbox names no network
// namespace path.
var ErrNoNetNS = errors.New("the runtime's sandbox status names no network namespace path")

// Status implements Runtime.
func (c *Client) Status(ctx context.Context, id string) (Status, error) {
	resp, err := c.rt.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id, Verbose: true})
	if err != nil {
		return Status{}, fmt.Errorf("PodSandboxStatus %s: %w", id, err)
	}
	if resp.Status != nil && resp.Status.GetLinux().GetNamespaces().GetOptions().GetNetwork() == runtimeapi.NamespaceMode_NODE {
		return Status{HostNetwork: true}, nil
	}
	path, err := NetNSFromInfo(resp.Info)
	if err != nil {
		return Status{}, fmt.Errorf("sandbox %s: %w", id, err)
	}
	return Status{NetNS: path}, nil
}

// sandboxInfo is the part of the verbose info document both runtimes
// share.
type sandboxInfo struct {
	RuntimeSpec *struct {
		Linux *struct {
			Namespaces []struct {
				Type string `json:"type"`
				Path string `json:"path"`
			} `json:"namespaces"`
		} `json:"linux"`
	} `json:"runtimeSpec"`
}

// NetNSFromInfo finds the network namespace path in a verbose sandbox
// status's info map (the "info" key's runtimeSpec).
func NetNSFromInfo(info map[string]string) (string, error) {
	raw, ok := info["info"]
	if !ok {
		return "", fmt.Errorf("%w (no \"info\" in the verbose status)", ErrNoNetNS)
	}
	var si sandboxInfo
	if err := json.Unmarshal([]byte(raw), &si); err != nil {
		return "", fmt.Errorf("verbose status \"info\": %w", err)
	}
	if si.RuntimeSpec == nil || si.RuntimeSpec.Linux == nil {
		return "", fmt.Errorf("%w (no runtimeSpec.linux in \"info\")", ErrNoNetNS)
	}
	for _, ns := range si.RuntimeSpec.Linux.Namespaces {
		if ns.Type == "network" {
			if ns.Path == "" {
				return "", fmt.Errorf("%w (the network namespace entry has no path)", ErrNoNetNS)
			}
			return ns.Path, nil
		}
	}
	return "", fmt.Errorf("%w (no network entry in runtimeSpec.linux.namespaces)", ErrNoNetNS)
}

// Lazy is a Runtime that connects on first use, and again on each use until
// a connection succeeds: a runtime that is not up yet fails the calls, not
// the caller's start. Once connected, gRPC reconnects by itself when the
// runtime restarts.
type Lazy struct {
	// Endpoint is the CRI socket, as given to Dial.
	Endpoint string

	mu sync.Mutex
	c  *Client
}

func (l *Lazy) client(ctx context.Context) (*Client, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.c == nil {
		c, err := Dial(ctx, l.Endpoint)
		if err != nil {
			return nil, err
		}
		l.c = c
	}
	return l.c, nil
}

// List implements Runtime.
func (l *Lazy) List(ctx context.Context) ([]Sandbox, error) {
	c, err := l.client(ctx)
	if err != nil {
		return nil, err
	}
	return c.List(ctx)
}

// Status implements Runtime.
func (l *Lazy) Status(ctx context.Context, id string) (Status, error) {
	c, err := l.client(ctx)
	if err != nil {
		return Status{}, err
	}
	return c.Status(ctx, id)
}

// Version returns the runtime's name and version ("" before a connection).
func (l *Lazy) Version(ctx context.Context) string {
	c, err := l.client(ctx)
	if err != nil {
		return ""
	}
	v, _ := c.Version(ctx)
	return v
}

// Close closes the connection, if any.
func (l *Lazy) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.c == nil {
		return nil
	}
	return l.c.Close()
}
