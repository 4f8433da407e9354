package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/install"
)

// Two installers on one node (a rolling update's surge pod next to the old
// one) serve metrics on the same port.
func TestServeMetricsSharesThePort(t *testing.T) {
	ctx := context.Background()
	_, addr, stop, err := serveMetrics(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	_, addr2, stop2, err := serveMetrics(ctx, addr.String())
	if err != nil {
		t.Fatalf("second installer on %s: %v", addr, err)
	}
	defer stop2()
	if addr2.String() != addr.String() {
		t.Fatalf("bound %s, want %s", addr2, addr)
	}
	resp, err := http.Get("http://" + addr.String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, want := range []string{install.MetricsPrefix + "build_info{", install.MetricsPrefix + "chained ", "process_resident_memory_bytes"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/metrics lacks %q:\n%s", want, b)
		}
	}
}
