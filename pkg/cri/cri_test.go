package cri_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cri"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/cri/critest"
)

func TestNetNSFromInfoReadsTheRuntimeSpecsNetworkNamespacePath(t *testing.T) {
	for _, tc := range []struct {
		name, info, want string
		noNetNS          bool
	}{
		{name: "containerd", want: "/var/run/netns/cni-1234",
			info: `{"pid":42,"runtimeSpec":{"linux":{"namespaces":[{"type":"pid"},{"type":"network","path":"/var/run/netns/cni-1234"},{"type":"ipc"}]}}}`},
		{name: "CRI-O, with more keys beside the spec", want: "/var/run/netns/5f1e",
			info: `{"sandboxVolume":"","runtimeSpec":{"ociVersion":"1.0.2","linux":{"namespaces":[{"type":"network","path":"/var/run/netns/5f1e"}]}}}`},
		{name: "a network entry without a path", noNetNS: true,
			info: `{"runtimeSpec":{"linux":{"namespaces":[{"type":"network"}]}}}`},
		{name: "no network entry", noNetNS: true,
			info: `{"runtimeSpec":{"linux":{"namespaces":[{"type":"pid"}]}}}`},
		{name: "no runtimeSpec", noNetNS: true, info: `{"pid":1}`},
		{name: "no info key", noNetNS: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			info := map[string]string{}
			if tc.info != "" {
				info["info"] = tc.info
			}
			got, err := cri.NetNSFromInfo(info)
			if tc.noNetNS {
				if !errors.Is(err, cri.ErrNoNetNS) || got != "" {
					t.Fatalf("NetNSFromInfo = %q, %v; want ErrNoNetNS", got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("NetNSFromInfo = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestNetNSFromInfoNamesTheKeyOfABrokenDocument(t *testing.T) {
	_, err := cri.NetNSFromInfo(map[string]string{"info": "{not json"})
	if err == nil || errors.Is(err, cri.ErrNoNetNS) || !strings.Contains(err.Error(), `"info"`) {
		t.Fatalf("err = %v; want a parse error naming \"info\"", err)
	}
}

func TestClientListsReadySandboxesAndTheirNetworkNamespaceOverTheSocket(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := critest.Start(t)
	created := time.Unix(1700000000, 5)
	sb := cri.Sandbox{ID: "sb1", PodUID: "uid-1", PodName: "web", PodNamespace: "shop", Attempt: 2, Created: created,
		Labels: map[string]string{"app": "web"}, Annotations: map[string]string{"consul.hashicorp.com/connect-inject-status": "injected"}}
	srv.Add(sb, "/var/run/netns/cni-web")

	c, err := cri.Dial(ctx, "unix://"+srv.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if v, err := c.Version(ctx); err != nil || v != "critest v0" {
		t.Fatalf("Version = %q, %v", v, err)
	}
	list, err := c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 {
		t.Fatalf("List = %+v; want one sandbox", list)
	}
	got := list[0]
	if got.ID != sb.ID || got.PodUID != sb.PodUID || got.PodName != sb.PodName || got.PodNamespace != sb.PodNamespace ||
		got.Attempt != sb.Attempt || !got.Created.Equal(created) || got.Labels["app"] != "web" ||
		got.Annotations["consul.hashicorp.com/connect-inject-status"] != "injected" {
		t.Fatalf("List = %+v; want %+v", got, sb)
	}
	st, err := c.Status(ctx, "sb1")
	if err != nil || st.NetNS != "/var/run/netns/cni-web" || st.HostNetwork {
		t.Fatalf("Status = %+v, %v", st, err)
	}
	srv.Remove("sb1")
	if _, err := c.Status(ctx, "sb1"); err == nil || !strings.Contains(err.Error(), "sb1") {
		t.Fatalf("Status of a removed sandbox: err = %v; want an error naming it", err)
	}
}

func TestDialRefusesARelativePathAndNamesAnEndpointThatDoesNotAnswer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cri.Dial(ctx, "run/containerd.sock"); err == nil || !strings.Contains(err.Error(), "run/containerd.sock") {
		t.Fatalf("relative path: err = %v", err)
	}
	missing := filepath.Join(t.TempDir(), "none.sock")
	if _, err := cri.Dial(ctx, missing); err == nil || !strings.Contains(err.Error(), missing) {
		t.Fatalf("missing socket: err = %v", err)
	}
}

func TestLazyFailsTheCallsUntilTheRuntimeAnswers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	missing := filepath.Join(t.TempDir(), "cri.sock")
	l := &cri.Lazy{Endpoint: missing}
	if _, err := l.List(ctx); err == nil || !strings.Contains(err.Error(), missing) {
		t.Fatalf("List before the runtime: err = %v; want one naming %s", err, missing)
	}
	if v := l.Version(ctx); v != "" {
		t.Fatalf("Version before the runtime = %q", v)
	}
	srv := critest.Start(t)
	srv.Add(cri.Sandbox{ID: "sb1", PodUID: "uid-1"}, "/var/run/netns/cni-1")
	l = &cri.Lazy{Endpoint: srv.Socket}
	defer l.Close()
	list, err := l.List(ctx)
	if err != nil || len(list) != 1 {
		t.Fatalf("List = %v, %v", list, err)
	}
	if st, err := l.Status(ctx, "sb1"); err != nil || st.NetNS != "/var/run/netns/cni-1" {
		t.Fatalf("Status = %+v, %v", st, err)
	}
}
