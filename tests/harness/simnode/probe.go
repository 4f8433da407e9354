package simnode

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/proc"
)

// probeState holds the results of one container instance's probes.
type probeState struct {
	ready    atomic.Bool
	liveFail atomic.Bool
}

// startProbes runs the readiness and liveness probes of a container
// instance until ctx ends (the instance exits).
func (w *podWorker) startProbes(ctx context.Context, pod *corev1.Pod, c *container, env []string, rb *rebaser) {
	ps := c.ps
	cred := credential(pod, &c.spec)
	ns := w.n.net.path // hostNetwork: the node's namespace
	if w.sb != nil {
		ns = w.sb.netnsPath
	}
	podIP := "127.0.0.1"
	if w.sb != nil && len(w.sb.ips) > 0 {
		podIP = w.sb.ips[0].String()
	}
	run := func(p *corev1.Probe, report func(bool)) {
		period := time.Duration(max(p.PeriodSeconds, 1)) * time.Second
		timeout := time.Duration(max(p.TimeoutSeconds, 1)) * time.Second
		failThreshold, okThreshold := max(p.FailureThreshold, 1), max(p.SuccessThreshold, 1)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(p.InitialDelaySeconds) * time.Second):
		}
		var oks, fails int32
		for {
			err := w.probeOnce(ctx, p, timeout, env, rb, cred, ns, podIP, &c.spec)
			if ctx.Err() != nil {
				return
			}
			if err == nil {
				oks, fails = oks+1, 0
				if oks >= okThreshold {
					report(true)
				}
			} else {
				oks, fails = 0, fails+1
				if fails >= failThreshold {
					report(false)
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(period):
			}
		}
	}
	if p := c.spec.ReadinessProbe; p != nil {
		go run(p, func(ok bool) {
			if ps.ready.Swap(ok) != ok {
				if !ok {
					w.event(pod, corev1.EventTypeWarning, "Unhealthy", "Readiness probe failed for container %s", c.spec.Name)
				}
				w.poke()
			}
		})
	}
	if p := c.spec.LivenessProbe; p != nil {
		go run(p, func(ok bool) {
			if !ok && !ps.liveFail.Swap(true) {
				w.event(pod, corev1.EventTypeWarning, "Unhealthy", "Liveness probe failed for container %s", c.spec.Name)
				w.poke()
			}
		})
	}
}

// probeOnce runs a probe: exec (the command run like the container's,
// inside the pod's namespace as its user), tcpSocket or httpGet (from the
// node, to the pod IP).
func (w *podWorker) probeOnce(ctx context.Context, p *corev1.Probe, timeout time.Duration, env []string, rb *rebaser, cred *syscall.Credential, ns, podIP string, spec *corev1.Container) error {
	ports := spec.Ports
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	switch {
	case p.Exec != nil && len(p.Exec.Command) > 0:
		argv := append([]string(nil), p.Exec.Command...)
		// The command of the container's own image is the program the
		// node runs for that image (its tag's, when it has one).
		if exe, ok := w.n.program(spec.Image); ok && baseName(argv[0]) == imageBase(spec.Image) {
			argv[0] = exe
		} else if exe, ok := w.n.cfg.Programs[baseName(argv[0])]; ok {
			argv[0] = exe
		}
		for i := 1; i < len(argv); i++ {
			argv[i] = rb.value(argv[i])
		}
		exe := argv[0]
		if !strings.Contains(exe, "/") {
			lp, err := exec.LookPath(exe)
			if err != nil {
				return err
			}
			exe = lp
		}
		cmd := exec.Command(exe, argv[1:]...)
		cmd.Env = env
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		pr, err := proc.Start(cmd, ns)
		if err != nil {
			return err
		}
		select {
		case <-pr.Done():
		case <-ctx.Done():
			pr.Stop(0)
			return fmt.Errorf("probe timed out after %v", timeout)
		}
		if code, _ := pr.ExitCode(); code != 0 {
			return fmt.Errorf("exit %d", code)
		}
		return nil
	case p.TCPSocket != nil:
		addr := net.JoinHostPort(hostOr(p.TCPSocket.Host, podIP), portString(p.TCPSocket.Port, ports))
		conn, err := w.n.net.dial(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		return conn.Close()
	case p.HTTPGet != nil:
		scheme := strings.ToLower(string(p.HTTPGet.Scheme))
		if scheme == "" {
			scheme = "http"
		}
		url := fmt.Sprintf("%s://%s%s", scheme, net.JoinHostPort(hostOr(p.HTTPGet.Host, podIP), portString(p.HTTPGet.Port, ports)), p.HTTPGet.Path)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := w.n.HTTPClient().Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode < 200 || resp.StatusCode >= 400 {
			return fmt.Errorf("HTTP probe failed with statuscode: %d", resp.StatusCode)
		}
		return nil
	}
	return fmt.Errorf("probe handler not supported")
}

func hostOr(h, def string) string {
	if h != "" {
		return h
	}
	return def
}

// portString resolves a probe port, by name among the container's ports.
func portString(p intstr.IntOrString, ports []corev1.ContainerPort) string {
	if p.Type == intstr.Int {
		return strconv.Itoa(int(p.IntVal))
	}
	for _, cp := range ports {
		if cp.Name == p.StrVal {
			return strconv.Itoa(int(cp.ContainerPort))
		}
	}
	return p.StrVal
}

func baseName(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[i+1:]
	}
	return p
}

// HTTPClient is an HTTP client whose connections start in the node's
// network namespace, as kubelet's HTTP probes do and as a scraper reaches a
// hostNetwork pod's port on the node.
func (n *Node) HTTPClient() *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: n.net.dial, DisableKeepAlives: true}}
}
