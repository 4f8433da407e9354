package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apitypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
)

// ResolveKubeconfig returns the kubeconfig file to use, as consul-k8s's
// plugin does: dir/name when it is a regular file, otherwise the most
// recently modified regular file dir/name-* (installers that version the
// file write a new one and remove the old). An absolute name is used as it
// is.
func ResolveKubeconfig(dir, name string) (string, error) {
	if name == "" {
		return "", errors.New("no kubeconfig is configured (key \"kubeconfig\" of the consul-cni entry in the conflist)")
	}
	path := name
	if !filepath.IsAbs(name) {
		path = filepath.Join(dir, name)
	}
	if st, err := os.Stat(path); err == nil && st.Mode().IsRegular() {
		return path, nil
	}
	matches, _ := filepath.Glob(globEscape(path) + "-*")
	best, bestTime := "", time.Time{}
	for _, m := range matches {
		st, err := os.Stat(m)
		if err != nil || !st.Mode().IsRegular() {
			continue
		}
		if best == "" || st.ModTime().After(bestTime) || (st.ModTime().Equal(bestTime) && m > best) {
			best, bestTime = m, st.ModTime()
		}
	}
	if best == "" {
		return "", fmt.Errorf("no kubeconfig found: neither %s nor %s-* exists (the consul-cni installer writes it)", path, path)
	}
	return best, nil
}

func globEscape(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`)
	return r.Replace(s)
}

// NewKubeClient builds the client from the configured kubeconfig. A
// tokenFile in the kubeconfig is read by client-go, so a token that is
// rotated on disk keeps working. Every request is bounded by api_timeout.
func NewKubeClient(conf *Config) (kubernetes.Interface, string, error) {
	path, err := ResolveKubeconfig(conf.netDir(), conf.Kubeconfig)
	if err != nil {
		return nil, "", err
	}
	rc, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, path, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	rc.Timeout = conf.apiTimeout
	rc.UserAgent = "consul-cni"
	dialer := &net.Dialer{Timeout: min(conf.apiTimeout, 10*time.Second), KeepAlive: 30 * time.Second}
	rc.Dial = dialer.DialContext
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, path, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	return c, path, nil
}

// retriable reports whether an API error may go away on its own.
func retriable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return false
	}
	var se apierrors.APIStatus
	if errors.As(err, &se) {
		return apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err) ||
			apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err) || apierrors.IsUnexpectedServerError(err)
	}
	// Transport errors: connection refused, reset, DNS, TLS handshake
	// timeout, ...
	return true
}

// retry runs fn up to attempts times while it fails with a retriable error,
// backing off from base, never past the context's deadline.
func retry(ctx context.Context, attempts int, base time.Duration, fn func(context.Context) error) (int, error) {
	var err error
	delay := base
	for i := 1; ; i++ {
		err = fn(ctx)
		if err == nil || !retriable(err) || i >= attempts || ctx.Err() != nil {
			return i, err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return i, err
		case <-t.C:
		}
		delay *= 2
	}
}

// statusPatch is a JSON merge patch of the transparent-proxy-status
// annotation. With the pod's UID in it, the patch cannot land on a new pod
// that took the old one's name.
func statusPatch(uid apitypes.UID, status string) []byte {
	meta := map[string]any{"annotations": map[string]string{annotations.KeyTransparentProxyStatus: status}}
	if uid != "" {
		meta["uid"] = uid
	}
	b, _ := json.Marshal(map[string]any{"metadata": meta})
	return b
}

const apiAttempts = 5

func getPod(ctx context.Context, c kubernetes.Interface, ns, name string, base time.Duration) (*corev1.Pod, int, error) {
	var pod *corev1.Pod
	n, err := retry(ctx, apiAttempts, base, func(ctx context.Context) error {
		p, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		pod = p
		return err
	})
	return pod, n, err
}

func patchStatus(ctx context.Context, c kubernetes.Interface, pod *corev1.Pod, status string, base time.Duration) (int, error) {
	body := statusPatch(pod.UID, status)
	return retry(ctx, apiAttempts, base, func(ctx context.Context) error {
		_, err := c.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, apitypes.MergePatchType, body, metav1.PatchOptions{FieldManager: "consul-cni"})
		return err
	})
}
