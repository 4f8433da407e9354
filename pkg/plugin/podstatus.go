package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
)

// refused reports whether the API refused the plugin's credentials (401,
// 403).
func refused(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && (ae.Code == http.StatusUnauthorized || ae.Code == http.StatusForbidden)
}

// retriable reports whether an API error may go away on its own.
func retriable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return false
	}
	var ce *credentialsError
	if errors.As(err, &ce) {
		return false
	}
	var ae *APIError
	if errors.As(err, &ae) {
		switch ae.Code {
		case http.StatusRequestTimeout, http.StatusTooManyRequests, http.StatusInternalServerError,
			http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
			return true
		}
		return ae.Reason == "ServerTimeout" || ae.Reason == "Timeout"
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
func statusPatch(uid, status string) []byte {
	return annotationPatch(uid, map[string]string{annotations.KeyTransparentProxyStatus: status})
}

// completePatch sets the status to complete and, in the same patch,
// cni-applied-at to the time the rules were applied: the repair controller
// compares it with the pod's current sandbox, so the pair can never be seen
// half written.
func completePatch(uid string, applied time.Time) []byte {
	return annotationPatch(uid, map[string]string{
		annotations.KeyTransparentProxyStatus: annotations.TProxyStatusComplete,
		annotations.KeyCNIAppliedAt:           annotations.FormatTime(applied),
	})
}

func annotationPatch(uid string, values map[string]string) []byte {
	meta := map[string]any{"annotations": values}
	if uid != "" {
		meta["uid"] = uid
	}
	b, _ := json.Marshal(map[string]any{"metadata": meta})
	return b
}

const apiAttempts = 5

func getPod(ctx context.Context, c PodClient, ns, name string, base time.Duration) (*Pod, int, error) {
	var pod *Pod
	n, err := retry(ctx, apiAttempts, base, func(ctx context.Context) error {
		p, err := c.GetPod(ctx, ns, name)
		pod = p
		return err
	})
	return pod, n, err
}

// patchStatus sends body (statusPatch, completePatch) with retries.
func patchStatus(ctx context.Context, c PodClient, pod *Pod, body []byte, base time.Duration) (int, error) {
	return retry(ctx, apiAttempts, base, func(ctx context.Context) error {
		return c.PatchPod(ctx, pod.Namespace, pod.Name, body)
	})
}
