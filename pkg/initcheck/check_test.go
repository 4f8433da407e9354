package initcheck

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"errors"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

const redirectJSON = `{"ConsulDNSIP":"127.0.0.1","ConsulDNSPort":8600,"ProxyUserID":"5995","ProxyInboundPort":20000,"ProxyOutboundPort":15001,"ExcludeInboundPorts":["20200","21000"],"ExcludeOutboundPorts":null,"ExcludeOutboundCIDRs":null,"ExcludeUIDs":["5996"],"NetNS":"","IptablesProvider":null}`

// kubeletFormat renders a map exactly as kubelet writes a downward-API
// file (k8s.io/kubernetes/pkg/fieldpath.FormatMap): sorted keys, %q values,
// lines joined by newlines, none after the last.
func kubeletFormat(m map[string]string) []byte {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%v=%q\n", k, m[k])
	}
	return []byte(strings.TrimSuffix(b.String(), "\n"))
}

func TestParseDownwardAPI(t *testing.T) {
	anns := map[string]string{
		annotations.KeyTransparentProxyStatus: "complete",
		annotations.KeyRedirectTrafficConfig:  redirectJSON,
		annotations.KeyDualStack:              "false",
		"example.com/multi-line":              "a\nb\tc\\d\"e'",
		"example.com/unicode":                 "naïve — ✓ \u0007",
		"example.com/empty":                   "",
		"example.com/equals":                  "a=b=c",
		"kubernetes.io/config.seen":           "2026-11-30T01:02:03.456789Z",
	}
	got, err := ParseDownwardAPI(kubeletFormat(anns))
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(anns) {
		t.Fatalf("got %q\nwant %q", got, anns)
	}
	// The JSON annotation survives escaping and parses.
	if _, err := annotations.ParseRedirectTrafficConfig([]byte(got[annotations.KeyRedirectTrafficConfig]), false); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name, in string
		want     map[string]string
		wantErr  string
	}{
		{name: "empty file", in: "", want: map[string]string{}},
		{name: "trailing newline and CRLF tolerated", in: "a=\"1\"\r\nb=\"2\"\n", want: map[string]string{"a": "1", "b": "2"}},
		{name: "escaped quote in value", in: `k="{\"a\":1}"`, want: map[string]string{"k": `{"a":1}`}},
		{name: "no equals", in: "a=\"1\"\nbroken", wantErr: "line 2"},
		{name: "unquoted value", in: `a=complete`, wantErr: "not a quoted string"},
		{name: "unterminated quote", in: `a="x`, wantErr: "not a quoted string"},
		{name: "empty key", in: `="x"`, wantErr: "line 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseDownwardAPI([]byte(tc.in))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("got %q want %q", got, tc.want)
			}
		})
	}
}

func FuzzParseDownwardAPI(f *testing.F) {
	f.Add("k", "v")
	f.Add(annotations.KeyRedirectTrafficConfig, redirectJSON)
	f.Add("a.b/c", "x\ny\"z\x00")
	f.Fuzz(func(t *testing.T, k, v string) {
		if k == "" || strings.ContainsAny(k, "=\n\r") || strings.TrimSpace(k) == "" {
			return
		}
		m := map[string]string{k: v, "z/last": "end"}
		got, err := ParseDownwardAPI(kubeletFormat(m))
		if err != nil {
			t.Fatalf("kubelet's own format rejected: %v", err)
		}
		if got[k] != v {
			t.Fatalf("value %q came back as %q", v, got[k])
		}
	})
}

// podinfo is a downward-API volume written the way kubelet's atomic writer
// does: files live in a timestamped directory, ..data is a symlink to it,
// and each file is a symlink through ..data. An update writes a new
// directory and renames a new ..data symlink over the old one.
type podinfo struct {
	dir string
	n   int
}

func newPodinfo(t *testing.T, anns map[string]string) *podinfo {
	p := &podinfo{dir: t.TempDir()}
	p.update(t, anns)
	if err := os.Symlink("..data/annotations", filepath.Join(p.dir, "annotations")); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *podinfo) file() string { return filepath.Join(p.dir, "annotations") }

func (p *podinfo) update(t *testing.T, anns map[string]string) {
	t.Helper()
	p.n++
	ts := fmt.Sprintf("..2026_11_30_01_00_%02d.%d", p.n, time.Now().UnixNano())
	if err := os.Mkdir(filepath.Join(p.dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p.dir, ts, "annotations"), kubeletFormat(anns), 0o644); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(p.dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		t.Fatal(err)
	}
	old, _ := os.Readlink(filepath.Join(p.dir, "..data"))
	if err := os.Rename(tmp, filepath.Join(p.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if old != "" {
		os.RemoveAll(filepath.Join(p.dir, old))
	}
}

func injected(status string) map[string]string {
	return map[string]string{
		annotations.KeyInjectStatus:           annotations.InjectStatusInjected,
		annotations.KeyTransparentProxyStatus: status,
		annotations.KeyRedirectTrafficConfig:  redirectJSON,
		annotations.KeyDualStack:              "false",
	}
}

func baseConfig(t *testing.T) Config {
	return Config{
		Timeout:        30 * time.Second,
		Interval:       50 * time.Millisecond,
		ExitCode:       annotations.InitCheckExitCode,
		TerminationLog: filepath.Join(t.TempDir(), "termination-log"),
		UID:            1000,
	}
}

func termMsg(t *testing.T, cfg Config) string {
	b, err := os.ReadFile(cfg.TerminationLog)
	if err != nil {
		return ""
	}
	return string(b)
}

func TestRunFile(t *testing.T) {
	t.Run("already complete", func(t *testing.T) {
		p := newPodinfo(t, injected("complete"))
		cfg := baseConfig(t)
		cfg.AnnotationsFile = p.file()
		if r := Run(context.Background(), cfg); r.Code != 0 {
			t.Fatalf("result %+v", r)
		}
		if m := termMsg(t, cfg); m != "" {
			t.Errorf("termination message on success: %q", m)
		}
	})
	t.Run("completed accepted", func(t *testing.T) {
		p := newPodinfo(t, injected("completed"))
		cfg := baseConfig(t)
		cfg.AnnotationsFile = p.file()
		if r := Run(context.Background(), cfg); r.Code != 0 {
			t.Fatalf("result %+v", r)
		}
	})
	t.Run("becomes complete through kubelet's symlink swap", func(t *testing.T) {
		p := newPodinfo(t, injected("enabled"))
		cfg := baseConfig(t)
		cfg.AnnotationsFile = p.file()
		cfg.Interval = time.Hour // only the file watch can wake the check
		done := make(chan Result, 1)
		go func() { done <- Run(context.Background(), cfg) }()
		time.Sleep(100 * time.Millisecond)
		p.update(t, injected("waiting"))
		time.Sleep(100 * time.Millisecond)
		p.update(t, injected("complete"))
		select {
		case r := <-done:
			if r.Code != 0 {
				t.Fatalf("result %+v", r)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("the check did not notice the update")
		}
	})
	t.Run("stays enabled: fails with the exit code and a message", func(t *testing.T) {
		p := newPodinfo(t, injected("enabled"))
		cfg := baseConfig(t)
		cfg.AnnotationsFile = p.file()
		cfg.Timeout = 300 * time.Millisecond
		cfg.ExitCode = 99
		r := Run(context.Background(), cfg)
		if r.Code != 99 {
			t.Fatalf("code %d, want 99 (%s)", r.Code, r.Message)
		}
		m := termMsg(t, cfg)
		for _, want := range []string{annotations.KeyTransparentProxyStatus, `"enabled"`, "without the consul-cni plugin"} {
			if !strings.Contains(m, want) {
				t.Errorf("termination message %q lacks %q", m, want)
			}
		}
	})
	t.Run("not a transparent-proxy pod", func(t *testing.T) {
		p := newPodinfo(t, map[string]string{annotations.KeyInjectStatus: "injected"})
		cfg := baseConfig(t)
		cfg.AnnotationsFile = p.file()
		r := Run(context.Background(), cfg)
		if r.Code != ExitConfig || !strings.Contains(termMsg(t, cfg), "not a transparent-proxy pod") {
			t.Fatalf("result %+v", r)
		}
	})
	t.Run("missing file is a configuration error, not a bypass", func(t *testing.T) {
		cfg := baseConfig(t)
		cfg.AnnotationsFile = filepath.Join(t.TempDir(), "nope")
		cfg.Timeout = 200 * time.Millisecond
		r := Run(context.Background(), cfg)
		if r.Code != ExitConfig || !strings.Contains(r.Message, "no such file") {
			t.Fatalf("result %+v", r)
		}
	})
	t.Run("no source", func(t *testing.T) {
		r := Run(context.Background(), baseConfig(t))
		if r.Code != ExitConfig || !strings.Contains(r.Message, "no source") {
			t.Fatalf("result %+v", r)
		}
	})
}

func pod(status string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-0", Namespace: "ns", Annotations: injected(status)}}
}

func TestRunAPI(t *testing.T) {
	t.Run("complete later", func(t *testing.T) {
		c := fake.NewClientset(pod("enabled"))
		cfg := baseConfig(t)
		cfg.Client, cfg.PodNamespace, cfg.PodName = c, "ns", "web-0"
		go func() {
			time.Sleep(200 * time.Millisecond)
			_, _ = c.CoreV1().Pods("ns").Update(context.Background(), pod("complete"), metav1.UpdateOptions{})
		}()
		if r := Run(context.Background(), cfg); r.Code != 0 {
			t.Fatalf("result %+v", r)
		}
	})
	t.Run("API forbidden, file complete", func(t *testing.T) {
		c := fake.NewClientset()
		var mu sync.Mutex
		gets := 0
		c.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
			mu.Lock()
			gets++
			mu.Unlock()
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "web-0", errors.New("no"))
		})
		p := newPodinfo(t, injected("enabled"))
		cfg := baseConfig(t)
		cfg.Client, cfg.PodNamespace, cfg.PodName = c, "ns", "web-0"
		cfg.AnnotationsFile = p.file()
		go func() { time.Sleep(300 * time.Millisecond); p.update(t, injected("complete")) }()
		if r := Run(context.Background(), cfg); r.Code != 0 {
			t.Fatalf("result %+v", r)
		}
		mu.Lock()
		defer mu.Unlock()
		if gets != 1 {
			t.Errorf("%d GETs after Forbidden, want 1 (the source is disabled)", gets)
		}
	})
	t.Run("API forbidden and no file", func(t *testing.T) {
		c := fake.NewClientset()
		c.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "web-0", errors.New("no"))
		})
		cfg := baseConfig(t)
		cfg.Client, cfg.PodNamespace, cfg.PodName = c, "ns", "web-0"
		r := Run(context.Background(), cfg)
		if r.Code != ExitConfig || !strings.Contains(r.Message, "forbidden") {
			t.Fatalf("result %+v", r)
		}
	})
}

func TestProbePolicy(t *testing.T) {
	tc, err := trafficConfig(injected("complete"))
	if err != nil {
		t.Fatal(err)
	}
	withExcl, err := annotations.ParseRedirectTrafficConfig([]byte(`{"ProxyUserID":"5995","ProxyInboundPort":20000,
		"ExcludeOutboundPorts":["15002","8000:8100"],"ExcludeOutboundCIDRs":["169.254.0.0/16"],"ExcludeUIDs":["5996","1234"]}`), false)
	if err != nil {
		t.Fatal(err)
	}
	defaults, _ := trafficConfig(map[string]string{annotations.KeyTransparentProxyStatus: "complete"})
	for _, c := range []struct {
		name    string
		tc      annotations.TrafficConfig
		uid     int
		target  string
		wantErr string
	}{
		{name: "ok", tc: tc, uid: 1000, target: "169.254.7.127:15002"},
		{name: "root is redirected", tc: tc, uid: 0, target: "169.254.7.127:15002"},
		{name: "proxy UID", tc: tc, uid: 5995, target: "169.254.7.127:15002", wantErr: "ProxyUserID"},
		{name: "excluded UID", tc: withExcl, uid: 1234, target: "198.18.0.1:80", wantErr: "ExcludeUIDs"},
		{name: "defaults exclude the init UID", tc: defaults, uid: 5996, target: "198.18.0.1:80", wantErr: "ExcludeUIDs"},
		{name: "excluded port", tc: withExcl, uid: 1000, target: "198.18.0.1:15002", wantErr: "ExcludeOutboundPorts"},
		{name: "port in an excluded range", tc: withExcl, uid: 1000, target: "198.18.0.1:8050", wantErr: "ExcludeOutboundPorts"},
		{name: "port after an excluded range", tc: withExcl, uid: 1000, target: "198.18.0.1:8101"},
		{name: "excluded CIDR", tc: withExcl, uid: 1000, target: "169.254.7.127:80", wantErr: "ExcludeOutboundCIDRs"},
		{name: "loopback", tc: tc, uid: 1000, target: "127.0.0.5:80", wantErr: "loopback"},
		{name: "IPv6 on single stack", tc: tc, uid: 1000, target: "[fd00::1]:80", wantErr: "not dual-stack"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := probeAllowed(c.tc, c.uid)
			if err == nil {
				err = targetAllowed(c.tc, netip.MustParseAddrPort(c.target))
			}
			if c.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("err = %v, want %q", err, c.wantErr)
			}
		})
	}
	if defaults.ProxyOutboundPort != 15001 || defaults.ProxyUserID != 5995 {
		t.Errorf("defaults %+v", defaults)
	}
}

func TestRunProbeRefusedUID(t *testing.T) {
	p := newPodinfo(t, injected("complete"))
	cfg := baseConfig(t)
	cfg.AnnotationsFile = p.file()
	cfg.Probe = true
	cfg.UID = annotations.ProxyUID
	r := Run(context.Background(), cfg)
	if r.Code != ExitConfig || !strings.Contains(termMsg(t, cfg), "refusing") {
		t.Fatalf("result %+v", r)
	}
}

// Without redirect rules (no privileges in this tier) the probe must fail
// as "not redirected" both when nothing answers and when something other
// than the outbound listener answers.
func TestProbeNotRedirected(t *testing.T) {
	// A real server at the target: the connection succeeds but never
	// reaches the outbound listener.
	srv, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	go func() {
		for {
			c, err := srv.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	var ports [3]uint16
	for i := range ports {
		p, err := testnet.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		ports[i] = uint16(p)
	}
	target := netip.MustParseAddrPort(srv.Addr().String())
	err = Probe(context.Background(), ports[0], target, 500*time.Millisecond)
	var nr *NotRedirectedError
	if !errors.As(err, &nr) {
		t.Fatalf("answered by a server: err = %v, want NotRedirectedError", err)
	}
	// Nothing listens at the target.
	closed := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), ports[1])
	if err := Probe(context.Background(), ports[2], closed, 500*time.Millisecond); !errors.As(err, &nr) {
		t.Fatalf("refused: err = %v, want NotRedirectedError", err)
	}
	// The outbound port is taken (proxy already running): not a verdict.
	busy, _ := net.Listen("tcp4", "127.0.0.1:0")
	defer busy.Close()
	err = Probe(context.Background(), uint16(busy.Addr().(*net.TCPAddr).Port), target, 500*time.Millisecond)
	if err == nil || errors.As(err, &nr) || !strings.Contains(err.Error(), "cannot listen") {
		t.Fatalf("busy port: err = %v", err)
	}
}
