// Package critest serves a CRI runtime service with sandboxes given by the
// test, over a real unix socket, for the verifier's benchmark and unit
// tests. Only Version, ListPodSandbox and PodSandboxStatus are served, with
// the verbose info document containerd writes (key "info", its
// runtimeSpec's network namespace path); the real-node tests use the real
// containerd.
package critest

import (
	"context"
	"encoding/json"
	"net"
	"path/filepath"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cri"
)

// Server is a CRI runtime service over a unix socket.
type Server struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	// Socket is the socket's path.
	Socket string

	mu        sync.Mutex
	sandboxes map[string]entry
}

type entry struct {
	sb    cri.Sandbox
	netns string
}

// Start serves on a socket in a temporary directory until the test ends.
func Start(tb testing.TB) *Server {
	tb.Helper()
	s := &Server{Socket: filepath.Join(tb.TempDir(), "cri.sock"), sandboxes: map[string]entry{}}
	ln, err := net.Listen("unix", s.Socket)
	if err != nil {
		tb.Fatal(err)
	}
	g := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(g, s)
	go func() { _ = g.Serve(ln) }()
	tb.Cleanup(g.Stop)
	return s
}

// Add puts a ready sandbox whose network namespace is at netns.
func (s *Server) Add(sb cri.Sandbox, netns string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sandboxes[sb.ID] = entry{sb: sb, netns: netns}
}

// Remove takes a sandbox away.
func (s *Server) Remove(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.sandboxes, id)
}

func (s *Server) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{Version: "0.1.0", RuntimeName: "critest", RuntimeVersion: "v0", RuntimeApiVersion: "v1"}, nil
}

func (s *Server) ListPodSandbox(context.Context, *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := &runtimeapi.ListPodSandboxResponse{}
	for _, e := range s.sandboxes {
		out.Items = append(out.Items, &runtimeapi.PodSandbox{
			Id: e.sb.ID, State: runtimeapi.PodSandboxState_SANDBOX_READY, CreatedAt: e.sb.Created.UnixNano(),
			Metadata: &runtimeapi.PodSandboxMetadata{Name: e.sb.PodName, Uid: e.sb.PodUID, Namespace: e.sb.PodNamespace, Attempt: e.sb.Attempt},
			Labels:   e.sb.Labels, Annotations: e.sb.Annotations,
		})
	}
	return out, nil
}

func (s *Server) PodSandboxStatus(_ context.Context, req *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	s.mu.Lock()
	e, ok := s.sandboxes[req.PodSandboxId]
	s.mu.Unlock()
	if !ok {
		return nil, status.Errorf(codes.NotFound, "an error occurred when try to find sandbox %q: not found", req.PodSandboxId)
	}
	info, _ := json.Marshal(map[string]any{"pid": 1, "runtimeSpec": map[string]any{"linux": map[string]any{
		"namespaces": []map[string]string{{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "network", "path": e.netns}},
	}}})
	return &runtimeapi.PodSandboxStatusResponse{
		Status: &runtimeapi.PodSandboxStatus{Id: e.sb.ID, State: runtimeapi.PodSandboxState_SANDBOX_READY,
			Linux: &runtimeapi.LinuxPodSandboxStatus{Namespaces: &runtimeapi.Namespace{Options: &runtimeapi.NamespaceOption{}}}},
		Info: map[string]string{"info": string(info)},
	}, nil
}
