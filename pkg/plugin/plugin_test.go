package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	apitypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/iptables"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/iptables/iptablestest"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/nftables/nftablestest"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/version"
)

const upstreamDefault = `{"ConsulDNSIP":"127.0.0.1","ConsulDNSPort":8600,"ProxyUserID":"5995","ProxyInboundPort":20000,` +
	`"ProxyOutboundPort":15001,"ExcludeInboundPorts":["20200","21000"],"ExcludeOutboundPorts":null,` +
	`"ExcludeOutboundCIDRs":null,"ExcludeUIDs":["5996"],"NetNS":"","IptablesProvider":null}`

// conflistEntry is the plugin's entry as consul-k8s's installer writes it,
// with the prevResult a runtime adds.
func conflistEntry(version, extra string) string {
	prev := `{"cniVersion":"` + version + `","interfaces":[{"name":"eth0","sandbox":"/var/run/netns/x"}],` +
		`"ips":[{"address":"10.0.0.2/24","gateway":"10.0.0.1","interface":0}],"dns":{}}`
	switch {
	case version == "0.1.0" || version == "0.2.0":
		prev = `{"cniVersion":"` + version + `","ip4":{"ip":"10.0.0.2/24","gateway":"10.0.0.1"},"dns":{}}`
	case !strings.HasPrefix(version, "1."):
		prev = `{"cniVersion":"` + version + `","interfaces":[{"name":"eth0","sandbox":"/var/run/netns/x"}],` +
			`"ips":[{"version":"4","address":"10.0.0.2/24","gateway":"10.0.0.1","interface":0}],"dns":{}}`
	}
	return `{"cniVersion":"` + version + `","name":"k8s-pod-network","type":"consul-cni",` +
		`"cni_bin_dir":"/opt/cni/bin","cni_net_dir":"/etc/cni/net.d","kubeconfig":"` + cniconf.ConsulK8sKubeconfigFileName + `",` +
		`"log_level":"debug","multus":false` + extra + `,"prevResult":` + prev + `}`
}

// clientsetPods is the PodClient of the unit tests: client-go's fake
// clientset, with its errors turned into the APIError the REST client
// returns.
type clientsetPods struct{ c kubernetes.Interface }

func (c clientsetPods) GetPod(ctx context.Context, ns, name string) (*Pod, error) {
	p, err := c.c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, toAPIError(err)
	}
	return &Pod{Namespace: p.Namespace, Name: p.Name, UID: string(p.UID), Labels: p.Labels, Annotations: p.Annotations}, nil
}

func (c clientsetPods) PatchPod(ctx context.Context, ns, name string, patch []byte) error {
	_, err := c.c.CoreV1().Pods(ns).Patch(ctx, name, apitypes.MergePatchType, patch, metav1.PatchOptions{FieldManager: "consul-cni"})
	return toAPIError(err)
}

func toAPIError(err error) error {
	var s apierrors.APIStatus
	if errors.As(err, &s) {
		st := s.Status()
		return &APIError{Code: int(st.Code), Reason: string(st.Reason), Message: st.Message}
	}
	return err
}

type env struct {
	t       *testing.T
	p       *Plugin
	client  *fake.Clientset
	fake    *iptablestest.Fake
	nft     *nftablestest.Fake
	stdout  *bytes.Buffer
	stderr  *bytes.Buffer
	clients int
}

func newEnv(t *testing.T, objs ...runtime.Object) *env {
	e := &env{t: t, client: fake.NewClientset(objs...), fake: &iptablestest.Fake{}, nft: &nftablestest.Fake{}, stdout: &bytes.Buffer{}, stderr: &bytes.Buffer{}}
	e.p = &Plugin{
		NewClient: func(*Config) (PodClient, string, error) {
			e.clients++
			return clientsetPods{e.client}, "/etc/cni/net.d/" + cniconf.ConsulK8sKubeconfigFileName, nil
		},
		NewExecutor: func(_ context.Context, _ *Config, netns string, _ *slog.Logger) (iptables.Executor, error) {
			return e.fake, nil
		},
		Nftables: e.nft,
		Stdout:   e.stdout, Stderr: e.stderr,
		RetryBase: time.Millisecond,
	}
	return e
}

func injectedPod(name string, ann map[string]string) *corev1.Pod {
	a := map[string]string{
		annotations.KeyInjectStatus:           annotations.InjectStatusInjected,
		annotations.KeyTransparentProxyStatus: annotations.TProxyStatusEnabled,
		annotations.KeyRedirectTrafficConfig:  upstreamDefault,
	}
	for k, v := range ann {
		if v == "-" {
			delete(a, k)
		} else {
			a[k] = v
		}
	}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: apitypes.UID("uid-" + name), Annotations: a,
		Labels: map[string]string{annotations.KeyInjectStatus: annotations.InjectStatusInjected}}}
}

func args(stdin, cniArgs string) *skel.CmdArgs {
	return &skel.CmdArgs{ContainerID: "c0ffee", Netns: "/var/run/netns/test", IfName: "eth0", Args: cniArgs, StdinData: []byte(stdin)}
}

func podArgs(name string) string {
	return "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=" + name + ";K8S_POD_INFRA_CONTAINER_ID=c0ffee"
}

func (e *env) status(name string) string {
	e.t.Helper()
	p, err := e.client.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return p.Annotations[annotations.KeyTransparentProxyStatus]
}

// verbs lists the API actions on pods, as "get", "patch:<status>".
func (e *env) verbs() []string {
	var out []string
	for _, a := range e.client.Actions() {
		switch a := a.(type) {
		case k8stesting.PatchAction:
			var p struct {
				Metadata struct {
					UID         string            `json:"uid"`
					Annotations map[string]string `json:"annotations"`
				} `json:"metadata"`
			}
			if err := json.Unmarshal(a.GetPatch(), &p); err != nil {
				e.t.Fatal(err)
			}
			if p.Metadata.UID == "" {
				e.t.Errorf("patch without uid precondition: %s", a.GetPatch())
			}
			status := p.Metadata.Annotations[annotations.KeyTransparentProxyStatus]
			if _, ok := p.Metadata.Annotations[annotations.KeyCNIAppliedAt]; ok != (status == annotations.TProxyStatusComplete) {
				e.t.Errorf("%s must be written with, and only with, status %s: %s", annotations.KeyCNIAppliedAt, annotations.TProxyStatusComplete, a.GetPatch())
			}
			out = append(out, string(a.GetPatchType())+":"+status)
		default:
			out = append(out, a.GetVerb())
		}
	}
	return out
}

func expectedTable(t *testing.T, js string, dual bool) [2]string {
	t.Helper()
	cfg, err := annotations.ParseRedirectTrafficConfig([]byte(js), dual)
	if err != nil {
		t.Fatal(err)
	}
	f := &iptablestest.Fake{}
	if err := iptables.Apply(context.Background(), f, iptables.Build(cfg)); err != nil {
		t.Fatal(err)
	}
	return [2]string{f.Table(redirect.IPv4), f.Table(redirect.IPv6)}
}

func (e *env) tables() [2]string {
	return [2]string{e.fake.Table(redirect.IPv4), e.fake.Table(redirect.IPv6)}
}

var emptyTables = [2]string{(&iptablestest.Fake{}).Table(redirect.IPv4), (&iptablestest.Fake{}).Table(redirect.IPv6)}

func TestAddKubernetesPath(t *testing.T) {
	e := newEnv(t, injectedPod("web", nil))
	before := time.Now().Truncate(time.Second)
	if err := e.p.Add(args(conflistEntry("1.0.0", ""), podArgs("web"))); err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	if got := strings.Join(e.verbs(), ","); got != "get,application/merge-patch+json:waiting,application/merge-patch+json:complete" {
		t.Fatalf("API calls %s", got)
	}
	if s := e.status("web"); s != annotations.TProxyStatusComplete {
		t.Fatalf("status %q", s)
	}
	// The time the rules were applied, written with complete.
	pod, err := e.client.CoreV1().Pods("default").Get(context.Background(), "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	applied, err := annotations.ParseTime(annotations.KeyCNIAppliedAt, pod.Annotations[annotations.KeyCNIAppliedAt])
	if err != nil || applied.Before(before) || applied.After(after) || applied.Location() != time.UTC {
		t.Fatalf("%s = %q (%v), want a UTC time in [%s, %s]", annotations.KeyCNIAppliedAt, pod.Annotations[annotations.KeyCNIAppliedAt], err, before, after)
	}
	if e.tables() != expectedTable(t, upstreamDefault, false) {
		t.Fatalf("rules\n%s", e.tables())
	}
	// Stdout is only the prevResult, handed on unchanged.
	var res map[string]any
	if err := json.Unmarshal(e.stdout.Bytes(), &res); err != nil {
		t.Fatalf("stdout is not the result: %v\n%s", err, e.stdout)
	}
	if res["cniVersion"] != "1.0.0" || !strings.Contains(e.stdout.String(), `"10.0.0.2/24"`) {
		t.Fatalf("result %s", e.stdout)
	}
	if !strings.Contains(e.stderr.String(), "traffic redirection applied") {
		t.Fatalf("log %s", e.stderr)
	}
}

func TestAddPassesPrevResultThroughForEveryVersion(t *testing.T) {
	for _, v := range SupportedVersions {
		t.Run(v, func(t *testing.T) {
			e := newEnv(t, injectedPod("web", nil))
			stdin := conflistEntry(v, "")
			if err := e.p.Add(args(stdin, podArgs("web"))); err != nil {
				t.Fatal(err)
			}
			var in struct {
				Prev map[string]any `json:"prevResult"`
			}
			var out map[string]any
			if err := json.Unmarshal([]byte(stdin), &in); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(e.stdout.Bytes(), &out); err != nil {
				t.Fatal(err)
			}
			delete(out, "dns")
			delete(in.Prev, "dns")
			a, _ := json.Marshal(in.Prev)
			b, _ := json.Marshal(out)
			if string(a) != string(b) {
				t.Fatalf("result changed\n in: %s\nout: %s", a, b)
			}
		})
	}
}

func TestAddSkipsPodsThatAreNotOurs(t *testing.T) {
	plain := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "plain"}}
	noTproxy := injectedPod("no-tproxy", map[string]string{annotations.KeyTransparentProxyStatus: "-"})
	notInjected := injectedPod("not-injected", map[string]string{annotations.KeyInjectStatus: "-"})
	notInjected.Labels = nil
	for _, pod := range []*corev1.Pod{plain, noTproxy, notInjected} {
		t.Run(pod.Name, func(t *testing.T) {
			e := newEnv(t, pod)
			if err := e.p.Add(args(conflistEntry("1.1.0", ""), podArgs(pod.Name))); err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(e.verbs(), ","); got != "get" {
				t.Fatalf("API calls %s", got)
			}
			if len(e.fake.Calls) != 0 {
				t.Fatalf("iptables touched: %v", e.fake.Calls)
			}
			if !strings.Contains(e.stdout.String(), "10.0.0.2/24") {
				t.Fatalf("result not passed through: %s", e.stdout)
			}
		})
	}
}

func TestAddDualStackAnnotation(t *testing.T) {
	dualCfg := `{"ConsulDNSIP":"::1","ConsulDNSPort":8600,"ProxyUserID":"5995","ProxyInboundPort":20000}`
	for _, tc := range []struct {
		name string
		ann  map[string]string
		want [2]string
		err  string
	}{
		{"missing means single stack", map[string]string{annotations.KeyDualStack: "-"}, expectedTable(t, upstreamDefault, false), ""},
		{"false", map[string]string{annotations.KeyDualStack: "false"}, expectedTable(t, upstreamDefault, false), ""},
		{"true", map[string]string{annotations.KeyDualStack: "true", annotations.KeyRedirectTrafficConfig: dualCfg}, expectedTable(t, dualCfg, true), ""},
		{"bad value", map[string]string{annotations.KeyDualStack: "yes"}, emptyTables, `"yes" is not a boolean`},
		{"v4 DNS in dual stack", map[string]string{annotations.KeyDualStack: "true"}, emptyTables, "for dual stack ipv6 consulDNSIP required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, injectedPod("web", tc.ann))
			err := e.p.Add(args(conflistEntry("1.0.0", ""), podArgs("web")))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				if e.status("web") == annotations.TProxyStatusComplete {
					t.Fatal("complete after failure")
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if e.tables() != tc.want {
				t.Fatalf("tables\n%s", e.tables())
			}
		})
	}
}

func TestAddFailsClosedOnBadAnnotation(t *testing.T) {
	for _, tc := range []struct {
		name string
		ann  map[string]string
		want []string
	}{
		{"missing config", map[string]string{annotations.KeyRedirectTrafficConfig: "-"}, []string{"pod default/web", "no " + annotations.KeyRedirectTrafficConfig + " annotation"}},
		{"bad json", map[string]string{annotations.KeyRedirectTrafficConfig: "{foo}"}, []string{"pod default/web", "invalid JSON"}},
		{"injection", map[string]string{annotations.KeyRedirectTrafficConfig: `{"ProxyUserID":"5995","ProxyInboundPort":20000,"ExcludeOutboundPorts":["80\n-A OUTPUT -j ACCEPT"]}`},
			[]string{"field ExcludeOutboundPorts[0]", `"80\n-A OUTPUT -j ACCEPT"`}},
		{"missing uid", map[string]string{annotations.KeyRedirectTrafficConfig: `{"ProxyInboundPort":20000}`}, []string{"ProxyUserID is required to set up traffic redirection"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, injectedPod("web", tc.ann))
			err := e.p.Add(args(conflistEntry("1.0.0", ""), podArgs("web")))
			if err == nil {
				t.Fatal("ADD succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if e.tables() != emptyTables {
				t.Fatal("rules applied")
			}
			if s := e.status("web"); s != annotations.TProxyStatusWaiting {
				t.Fatalf("status %q, want waiting", s)
			}
			if e.stdout.Len() != 0 {
				t.Fatalf("stdout written on failure: %s", e.stdout)
			}
		})
	}
}

func TestAddRetriesTransientAPIErrors(t *testing.T) {
	e := newEnv(t, injectedPod("web", nil))
	gets, patches := 0, 0
	e.client.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		gets++
		if gets <= 2 {
			return true, nil, apierrors.NewServiceUnavailable("apiserver restarting")
		}
		return false, nil, nil
	})
	e.client.PrependReactor("patch", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		patches++
		if patches == 1 {
			return true, nil, apierrors.NewTooManyRequests("slow down", 0)
		}
		return false, nil, nil
	})
	if err := e.p.Add(args(conflistEntry("1.0.0", ""), podArgs("web"))); err != nil {
		t.Fatal(err)
	}
	if gets != 3 || patches != 3 || e.status("web") != annotations.TProxyStatusComplete {
		t.Fatalf("gets %d patches %d status %s", gets, patches, e.status("web"))
	}
}

func TestAddAPIErrorsFailClosed(t *testing.T) {
	for _, tc := range []struct {
		name      string
		verb      string
		err       error
		attempts  int
		want      string
		wantRules bool
	}{
		{"get unavailable", "get", apierrors.NewServiceUnavailable("down"), apiAttempts, "after 5 attempt(s)", false},
		{"get forbidden is not retried", "get", apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "web", errors.New("RBAC")), 1, "forbidden", false},
		{"pod gone", "get", apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, "web"), 1, "not found", false},
		{"network", "patch", fmt.Errorf("dial tcp 10.0.0.1:443: connect: connection refused"), apiAttempts, "connection refused", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, injectedPod("web", nil))
			n := 0
			e.client.PrependReactor(tc.verb, "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
				n++
				return true, nil, tc.err
			})
			err := e.p.Add(args(conflistEntry("1.0.0", ""), podArgs("web")))
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "pod default/web") {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
			if n != tc.attempts {
				t.Fatalf("%d attempts, want %d", n, tc.attempts)
			}
			if e.tables() != emptyTables {
				t.Fatal("rules left")
			}
		})
	}
}

func TestAddCompletePatchFailureRemovesRules(t *testing.T) {
	e := newEnv(t, injectedPod("web", nil))
	patches := 0
	e.client.PrependReactor("patch", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		patches++
		if patches > 1 {
			return true, nil, apierrors.NewInternalError(errors.New("etcd timeout"))
		}
		return false, nil, nil
	})
	err := e.p.Add(args(conflistEntry("1.0.0", ""), podArgs("web")))
	if err == nil || !strings.Contains(err.Error(), "rules applied but setting") || !strings.Contains(err.Error(), "etcd timeout") {
		t.Fatalf("error %v", err)
	}
	if e.tables() != emptyTables {
		t.Fatalf("rules left:\n%s", e.tables())
	}
	if e.status("web") == annotations.TProxyStatusComplete {
		t.Fatal("complete")
	}
}

func TestAddApplyFailureDoesNotComplete(t *testing.T) {
	e := newEnv(t, injectedPod("web", nil))
	e.fake.FailRestore = func(redirect.Family, []byte) error { return errors.New("iptables-restore: line 3 failed") }
	err := e.p.Add(args(conflistEntry("1.0.0", ""), podArgs("web")))
	if err == nil || !strings.Contains(err.Error(), "applying the traffic redirection rules in /var/run/netns/test failed") || !strings.Contains(err.Error(), "line 3 failed") {
		t.Fatalf("error %v", err)
	}
	if s := e.status("web"); s != annotations.TProxyStatusWaiting {
		t.Fatalf("status %q", s)
	}
}

func TestAddReplacedPod(t *testing.T) {
	e := newEnv(t, injectedPod("web", nil))
	err := e.p.Add(args(conflistEntry("1.0.0", ""), podArgs("web")+";K8S_POD_UID=old-uid"))
	if err == nil || !strings.Contains(err.Error(), "different pod") {
		t.Fatalf("error %v", err)
	}
	if len(e.fake.Calls) != 0 {
		t.Fatal("rules applied")
	}
}

// A static pod's sandbox carries the static pod's UID while the API holds
// its mirror pod under another UID: that is the same pod, not a replaced
// one, and such a pod (never injected) starts normally.
func TestAddStaticPodThroughItsMirror(t *testing.T) {
	mirror := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "etcd-n1", UID: "mirror-uid",
		Annotations: map[string]string{annotations.KeyConfigMirror: "static-uid"}}}
	e := newEnv(t, mirror)
	if err := e.p.Add(args(conflistEntry("1.0.0", ""), podArgs("etcd-n1")+";K8S_POD_UID=static-uid")); err != nil {
		t.Fatalf("ADD of a static pod: %v", err)
	}
	if len(e.fake.Calls) != 0 {
		t.Fatal("rules applied to a pod that is not injected")
	}
	// Another UID than the one the mirror names is still a different pod.
	err := e.p.Add(args(conflistEntry("1.0.0", ""), podArgs("etcd-n1")+";K8S_POD_UID=other-uid"))
	if err == nil || !strings.Contains(err.Error(), "different pod") {
		t.Fatalf("error %v", err)
	}
}

func TestAddNomadPath(t *testing.T) {
	e := newEnv(t)
	cfg := `{"ConsulDNSIP":"","ConsulDNSPort":0,"ProxyUserID":"101","ProxyInboundPort":25000,"ProxyOutboundPort":15001,"ExcludeInboundPorts":["9000"],"ExcludeOutboundPorts":null,"ExcludeOutboundCIDRs":["10.1.0.0/16"],"ExcludeUIDs":null,"NetNS":"/var/run/docker/netns/x"}`
	if err := e.p.Add(args(conflistEntry("1.0.0", ""), "IgnoreUnknown=1;CONSUL_IPTABLES_CONFIG="+cfg)); err != nil {
		t.Fatal(err)
	}
	if e.clients != 0 || len(e.client.Actions()) != 0 {
		t.Fatal("Kubernetes API used on the Nomad path")
	}
	if e.tables() != expectedTable(t, cfg, false) {
		t.Fatalf("rules\n%s", e.tables())
	}
	// An invalid Nomad config fails.
	e2 := newEnv(t)
	err := e2.p.Add(args(conflistEntry("1.0.0", ""), "CONSUL_IPTABLES_CONFIG={\"ProxyUserID\":\"x\",\"ProxyInboundPort\":1}"))
	if err == nil || !strings.Contains(err.Error(), "CONSUL_IPTABLES_CONFIG") || !strings.Contains(err.Error(), "ProxyUserID") {
		t.Fatalf("error %v", err)
	}
}

func TestAddWithoutPodOrNomad(t *testing.T) {
	e := newEnv(t)
	err := e.p.Add(args(conflistEntry("1.0.0", ""), "IgnoreUnknown=1"))
	if err == nil || !strings.Contains(err.Error(), "not running for a pod") {
		t.Fatalf("error %v", err)
	}
}

func TestAddPrevResult(t *testing.T) {
	// Multus without prevResult: an empty result of the config's version.
	e := newEnv(t, injectedPod("web", nil))
	stdin := `{"cniVersion":"0.3.1","name":"n","type":"consul-cni","kubeconfig":"k","multus":true}`
	if err := e.p.Add(args(stdin, podArgs("web"))); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(e.stdout.String()); !strings.Contains(got, `"cniVersion": "0.3.1"`) || strings.Contains(got, "ips") {
		t.Fatalf("result %s", got)
	}
	if e.status("web") != annotations.TProxyStatusComplete {
		t.Fatal("not applied in multus mode")
	}
	// A prevResult without IPs is refused, as upstream does.
	e = newEnv(t, injectedPod("web", nil))
	stdin = `{"cniVersion":"1.0.0","name":"n","type":"consul-cni","prevResult":{"cniVersion":"1.0.0","interfaces":[]}}`
	if err := e.p.Add(args(stdin, podArgs("web"))); err == nil || !strings.Contains(err.Error(), "no container IPs") {
		t.Fatalf("error %v", err)
	}
}

func TestCheck(t *testing.T) {
	e := newEnv(t, injectedPod("web", nil))
	stdin := conflistEntry("1.0.0", "")
	if err := e.p.Add(args(stdin, podArgs("web"))); err != nil {
		t.Fatal(err)
	}
	n := len(e.client.Actions())
	if err := e.p.Check(args(stdin, podArgs("web"))); err != nil {
		t.Fatal(err)
	}
	if got := e.verbs()[n:]; strings.Join(got, ",") != "get" {
		t.Fatalf("CHECK made API calls %v", got)
	}
	if err := e.fake.Exec(redirect.IPv4, "*nat\n-D CONSUL_PROXY_OUTPUT -m owner --uid-owner 5996 -j RETURN\nCOMMIT\n"); err != nil {
		t.Fatal(err)
	}
	err := e.p.Check(args(stdin, podArgs("web")))
	if err == nil || !strings.Contains(err.Error(), "rule missing: -A CONSUL_PROXY_OUTPUT -m owner --uid-owner 5996 -j RETURN") {
		t.Fatalf("error %v", err)
	}
	// A pod that is not ours always passes.
	e2 := newEnv(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "plain"}})
	if err := e2.p.Check(args(stdin, podArgs("plain"))); err != nil {
		t.Fatal(err)
	}
}

func TestDel(t *testing.T) {
	ns := filepath.Join(t.TempDir(), "netns")
	if err := os.WriteFile(ns, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, injectedPod("web", nil))
	a := args(conflistEntry("1.0.0", ""), podArgs("web"))
	a.Netns = ns
	if err := e.p.Add(a); err != nil {
		t.Fatal(err)
	}
	n := len(e.client.Actions())
	for i := 0; i < 2; i++ {
		if err := e.p.Del(a); err != nil {
			t.Fatalf("DEL #%d: %v", i+1, err)
		}
	}
	if e.tables() != emptyTables {
		t.Fatalf("rules left\n%s", e.tables())
	}
	if len(e.client.Actions()) != n {
		t.Fatal("DEL used the API")
	}
	// Missing or empty netns, broken config: nothing to do, no error.
	for _, tc := range []struct{ netns, stdin string }{
		{"", conflistEntry("1.0.0", "")},
		{filepath.Join(t.TempDir(), "gone"), conflistEntry("1.0.0", "")},
		{"", `{not json`},
	} {
		b := args(tc.stdin, podArgs("web"))
		b.Netns = tc.netns
		if err := e.p.Del(b); err != nil {
			t.Fatalf("DEL netns=%q: %v", tc.netns, err)
		}
	}
}

// STATUS fails only for what the node's operator must fix on the node (the
// iptables tools); credentials that cannot be used are logged, not
// reported, since a failing STATUS makes the runtime report the node's
// network not ready. ADD for an injected pod still fails closed.
func TestStatusAndGC(t *testing.T) {
	e := newEnv(t, injectedPod("web", nil))
	e.p.NewClient = NewKubeClient
	toolsOK := e.p.missingTools(&Config{autoVariant: true}, redirect.IPv4) == nil
	status := func(stdin string) {
		t.Helper()
		err := e.p.Status(args(stdin, ""))
		var te *types.Error
		switch {
		case toolsOK && err != nil:
			t.Fatalf("status: %v", err)
		case !toolsOK && (!errors.As(err, &te) || !strings.Contains(te.Msg, "iptables tools")):
			t.Fatalf("status on a machine without iptables tools: %v", err)
		}
	}
	dir := t.TempDir()
	stdin := `{"cniVersion":"1.1.0","name":"n","type":"consul-cni","cni_net_dir":"` + dir + `","kubeconfig":"kc"}`
	// No kubeconfig at all (uninstalled): ready.
	status(stdin)
	// The kubeconfig names a token file that is missing: unreadable
	// credentials, still ready; ADD for an injected pod fails closed.
	writeKubeconfig(t, filepath.Join(dir, "kc"))
	e.stderr.Reset()
	status(stdin)
	if toolsOK && !strings.Contains(e.stderr.String(), "not usable") {
		t.Errorf("unusable credentials not logged: %s", e.stderr)
	}
	add := `{"cniVersion":"1.1.0","name":"n","type":"consul-cni","cni_net_dir":"` + dir + `","kubeconfig":"kc","prevResult":` +
		`{"cniVersion":"1.1.0","interfaces":[{"name":"eth0"}],"ips":[{"address":"10.0.0.2/24","interface":0}]}}`
	if err := e.p.Add(args(add, podArgs("web"))); err == nil || !strings.Contains(err.Error(), "tokenFile") {
		t.Fatalf("ADD with unreadable credentials: %v", err)
	}
	if e.tables() != emptyTables || e.stdout.Len() != 0 {
		t.Fatalf("ADD failed but left rules or printed a result: %s", e.stdout)
	}
	// A kubeconfig that is not one: same.
	if err := os.WriteFile(filepath.Join(dir, "kc"), []byte("{not yaml"), 0o600); err != nil {
		t.Fatal(err)
	}
	status(stdin)
	if err := e.p.Add(args(add, podArgs("web"))); err == nil {
		t.Fatal("ADD with a broken kubeconfig succeeded")
	}
	writeKubeconfig(t, filepath.Join(dir, "kc"))
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte("t0k3n"), 0o600); err != nil {
		t.Fatal(err)
	}
	status(stdin)
	if err := e.p.GC(args(stdin, "")); err != nil {
		t.Fatal(err)
	}
	if err := e.p.Status(args(`{"cniVersion":"1.1.0","name":"n","type":"consul-cni","iptables_timeout":"x"}`, "")); err == nil {
		t.Fatal("status with an invalid configuration passed")
	}
}

// STATUS fails only when ADD would fail for every pod: without the IPv4
// iptables tools. A node without the IPv6 tools starts every single-stack
// pod, so it stays ready (the dual-stack pods' ADD fails, and says why).
func TestStatusWithoutIPv6Tools(t *testing.T) {
	for _, tc := range []struct {
		name    string
		missing string // the family prefix whose tools are missing
		fails   bool
	}{
		{"all tools", "", false},
		{"no ip6tables", "ip6tables", false},
		{"no iptables", "iptables", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.p.LookTool = func(name string) (string, error) {
				if tc.missing != "" && strings.HasPrefix(name, tc.missing+"-") {
					return "", errors.New("not found")
				}
				return "/usr/sbin/" + name, nil
			}
			err := e.p.Status(args(`{"cniVersion":"1.1.0","name":"n","type":"consul-cni"}`, ""))
			var te *types.Error
			if tc.fails != (err != nil) || tc.fails && (!errors.As(err, &te) || te.Code != types.ErrPluginNotAvailable) {
				t.Fatalf("STATUS: %v, want failure %v", err, tc.fails)
			}
			if tc.missing == "ip6tables" && !strings.Contains(e.stderr.String(), "dual-stack") {
				t.Errorf("missing IPv6 tools not logged: %s", e.stderr)
			}
		})
	}
}

func writeKubeconfig(t *testing.T, path string) {
	t.Helper()
	kc := `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: https://127.0.0.1:1
contexts:
- name: c
  context: {cluster: c, user: u}
current-context: c
users:
- name: u
  user:
    tokenFile: token
`
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestLogFileAndLevel(t *testing.T) {
	log := filepath.Join(t.TempDir(), "cni.log")
	e := newEnv(t, injectedPod("web", nil))
	if err := e.p.Add(args(conflistEntry("1.0.0", `,"log_file":"`+log+`"`), podArgs("web"))); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(log)
	if err != nil || !strings.Contains(string(b), "traffic redirection applied") || !strings.Contains(string(b), "pod=default/web") {
		t.Fatalf("log file %q %v", b, err)
	}
	if e.stderr.Len() != 0 {
		t.Fatalf("stderr used with log_file: %s", e.stderr)
	}
	e = newEnv(t, injectedPod("web", nil))
	if err := e.p.Add(args(conflistEntry("1.0.0", `,"log_level":"error"`), podArgs("web"))); err != nil {
		t.Fatal(err)
	}
	if e.stderr.Len() != 0 {
		t.Fatalf("info logged at level error: %s", e.stderr)
	}
}

// Every call logs the plugin's version at debug level, and only there.
func TestEveryCallLogsVersionAtDebug(t *testing.T) {
	old := version.Version
	t.Cleanup(func() { version.Version = old })
	version.Version = "v7.7.7-test"
	calls := map[string]func(p *Plugin, a *skel.CmdArgs) error{
		"ADD": (*Plugin).Add, "CHECK": (*Plugin).Check, "DEL": (*Plugin).Del, "STATUS": (*Plugin).Status, "GC": (*Plugin).GC,
	}
	for _, level := range []string{"debug", "info"} {
		for cmd, call := range calls {
			e := newEnv(t, injectedPod("web", nil))
			_ = call(e.p, args(conflistEntry("1.1.0", `,"log_level":"`+level+`"`), podArgs("web")))
			logged := strings.Contains(e.stderr.String(), "cmd="+cmd) && strings.Contains(e.stderr.String(), "version=v7.7.7-test")
			if logged != (level == "debug") {
				t.Errorf("%s at log_level %s: version logged %v; stderr:\n%s", cmd, level, logged, e.stderr)
			}
		}
	}
}

// Pods of excluded namespaces pass through before any API call, whatever
// the state of the credentials.
func TestAddExcludedNamespaces(t *testing.T) {
	sys := injectedPod("coredns", nil)
	sys.Namespace = "kube-system"
	for _, tc := range []struct {
		name, extra, ns string
		wantAPI         bool
	}{
		{"default excludes kube-system", "", "kube-system", false},
		{"default keeps others", "", "default", true},
		{"own list", `,"exclude_namespaces":["default"]`, "default", false},
		{"own list replaces the default", `,"exclude_namespaces":["team-a"]`, "kube-system", true},
		{"empty list excludes nothing", `,"exclude_namespaces":[]`, "kube-system", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, sys, injectedPod("web", nil))
			name := "web"
			if tc.ns == "kube-system" {
				name = "coredns"
			}
			a := "IgnoreUnknown=1;K8S_POD_NAMESPACE=" + tc.ns + ";K8S_POD_NAME=" + name
			if err := e.p.Add(args(conflistEntry("1.0.0", tc.extra), a)); err != nil {
				t.Fatal(err)
			}
			if api := e.clients > 0 || len(e.client.Actions()) > 0; api != tc.wantAPI {
				t.Fatalf("API used: %v, want %v (%v)", api, tc.wantAPI, e.verbs())
			}
			if redirected := e.tables() != emptyTables; redirected != tc.wantAPI {
				t.Fatalf("redirected: %v", redirected)
			}
			if !strings.Contains(e.stdout.String(), "10.0.0.2/24") {
				t.Fatalf("result not passed through: %s", e.stdout)
			}
		})
	}
	e := newEnv(t)
	err := e.p.Add(args(conflistEntry("1.0.0", `,"exclude_namespaces":["Kube System"]`), podArgs("web")))
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Key != "exclude_namespaces" || ce.Value != "Kube System" {
		t.Fatalf("invalid namespace: %v", err)
	}
}

// Kubeconfig gone altogether: the plugin is uninstalled from the node and
// passes pods through. Present but refused (401/403): ADD fails closed,
// without retrying, and says why.
func TestAddCredentialsGoneVersusRefused(t *testing.T) {
	dir := t.TempDir()
	stdin := conflistEntry("1.0.0", "")
	stdin = strings.Replace(stdin, `"cni_net_dir":"/etc/cni/net.d"`, `"cni_net_dir":"`+dir+`"`, 1)
	e := newEnv(t, injectedPod("web", nil))
	e.p.NewClient = NewKubeClient
	if err := e.p.Add(args(stdin, podArgs("web"))); err != nil {
		t.Fatalf("ADD with no kubeconfig at all: %v", err)
	}
	if e.tables() != emptyTables || !strings.Contains(e.stdout.String(), "10.0.0.2/24") || !strings.Contains(e.stderr.String(), "uninstalled") {
		t.Fatalf("not passed through: stdout %s log %s", e.stdout, e.stderr)
	}
	// Only absence passes pods through: a kubeconfig that is there but
	// cannot be used (a directory, a symbolic link loop) fails ADD closed.
	for name, make := range map[string]func(string) error{
		"directory": func(p string) error { return os.Mkdir(p, 0o755) },
		"link loop": func(p string) error { return os.Symlink(filepath.Base(p), p) },
	} {
		kc := filepath.Join(dir, cniconf.ConsulK8sKubeconfigFileName)
		if err := make(kc); err != nil {
			t.Fatal(err)
		}
		e := newEnv(t, injectedPod("web", nil))
		e.p.NewClient = NewKubeClient
		err := e.p.Add(args(stdin, podArgs("web")))
		if err == nil || errors.Is(err, ErrNoKubeconfig) || !strings.Contains(err.Error(), "cannot be used") {
			t.Fatalf("kubeconfig is a %s: ADD %v, want it failed closed", name, err)
		}
		if e.tables() != emptyTables || e.stdout.Len() != 0 {
			t.Fatalf("kubeconfig is a %s: ADD failed but left rules or a result", name)
		}
		if err := os.Remove(kc); err != nil {
			t.Fatal(err)
		}
	}
	bin := t.TempDir() // no installer state file: refused credentials fail closed
	for _, code := range []int{401, 403} {
		e := newEnv(t, injectedPod("web", nil))
		n := 0
		e.client.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
			n++
			if code == 401 {
				return true, nil, apierrors.NewUnauthorized("token expired")
			}
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "web", errors.New("RBAC"))
		})
		err := e.p.Add(args(withBinDir(conflistEntry("1.0.0", ""), bin), podArgs("web")))
		if err == nil || !strings.Contains(err.Error(), "credentials were refused") || !strings.Contains(err.Error(), "no installer state file") || n != 1 {
			t.Fatalf("%d: err %v after %d attempts", code, err, n)
		}
		if e.tables() != emptyTables || e.stdout.Len() != 0 {
			t.Fatalf("%d: ADD failed but left rules or a result", code)
		}
	}
}

func withBinDir(stdin, dir string) string {
	return strings.Replace(stdin, `"cni_bin_dir":"/opt/cni/bin"`, `"cni_bin_dir":"`+dir+`"`, 1)
}

// Credentials that stay refused pass pods through only on a node the
// product left (cniconf.ProductLeft): no installer heartbeat for LeftAfter
// and no successor expected. A running installer, one being replaced, and
// any error other than a refusal keep ADD failing closed.
func TestAddRefusedCredentialsOnANodeTheProductLeft(t *testing.T) {
	now := time.Now()
	future, past := now.Add(time.Minute), now.Add(-time.Minute)
	for _, tc := range []struct {
		name      string
		state     *cniconf.InstallerState // nil: no state file
		beat      time.Duration           // age of the last heartbeat
		code      int
		passes    bool
		wantInErr string
	}{
		{"no state file", nil, 0, 401, false, "no installer state file"},
		{"installer running", &cniconf.InstallerState{}, time.Second, 401, false, "ago"},
		{"installer silent for LeftAfter", &cniconf.InstallerState{Reason: "own credentials refused"}, cniconf.LeftAfter + time.Second, 401, true, ""},
		{"installer silent, RBAC gone", &cniconf.InstallerState{}, cniconf.LeftAfter + time.Second, 403, true, ""},
		{"installer being replaced", &cniconf.InstallerState{SuccessorExpectedUntil: &future, Reason: "rolling update"}, time.Hour, 401, false, "successor is expected"},
		{"successor never came", &cniconf.InstallerState{SuccessorExpectedUntil: &past}, time.Hour, 401, true, ""},
		{"API unavailable, not refused", &cniconf.InstallerState{}, time.Hour, 503, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bin := t.TempDir()
			if tc.state != nil {
				b, _ := json.Marshal(tc.state)
				path := filepath.Join(bin, cniconf.StateFileName)
				if err := os.WriteFile(path, b, 0o644); err != nil {
					t.Fatal(err)
				}
				beat := now.Add(-tc.beat)
				if err := os.Chtimes(path, beat, beat); err != nil {
					t.Fatal(err)
				}
			}
			e := newEnv(t, injectedPod("web", nil))
			e.client.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
				switch tc.code {
				case 401:
					return true, nil, apierrors.NewUnauthorized("pod-bound token of a deleted pod")
				case 403:
					return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "web", errors.New("RBAC"))
				}
				return true, nil, apierrors.NewServiceUnavailable("down")
			})
			err := e.p.Add(args(withBinDir(conflistEntry("1.0.0", ""), bin), podArgs("web")))
			if tc.passes {
				if err != nil || e.tables() != emptyTables || !strings.Contains(e.stdout.String(), "10.0.0.2/24") ||
					!strings.Contains(e.stderr.String(), "the product has left this node") {
					t.Fatalf("want passed through: err %v stdout %s log %s", err, e.stdout, e.stderr)
				}
				return
			}
			if err == nil || e.tables() != emptyTables || e.stdout.Len() != 0 || !strings.Contains(err.Error(), tc.wantInErr) {
				t.Fatalf("want failed closed (mentioning %q): err %v, stdout %s", tc.wantInErr, err, e.stdout)
			}
		})
	}
}
