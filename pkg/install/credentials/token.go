package credentials

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"strings"
	"time"
)

// During a rolling update two installers run on the node at once (the new
// pod starts before the old one stops), each with its own pod-bound
// service-account token, and there is one token file for the plugin. A
// bound token stops working once its pod is deleted, so the file must end up
// holding the token of the pod that stays. The rule each instance applies
// (Decide):
//
//   - the file holds our own token (or an older copy of it): write ours;
//   - it holds something that is not a pod-bound token, or an expired one:
//     write ours;
//   - it holds the token of another pod: ask the API whether that pod still
//     runs (not found, another UID or being deleted means no) and write ours
//     if it does not; while it does, both tokens work and the one expiring
//     later stays, and the instance looks again soon, so it takes over
//     within seconds of the other pod's deletion starting;
//   - without an answer from the API, the token expiring later stays.
//
// The decision is the same on both sides, so the two instances never write
// the file back and forth.

// PodAlive reports whether the pod a token is bound to still runs: false
// when it does not exist, has another UID, or is being deleted.
type PodAlive func(ctx context.Context, namespace, name, uid string) (bool, error)

// Pod is the pod a pod-bound service-account token is bound to, and when
// the token expires (zero when it does not say).
type Pod struct {
	Namespace, Name, UID string
	Expires              time.Time
}

type tokenClaims struct {
	Exp int64 `json:"exp"`
	K8s *struct {
		Namespace string `json:"namespace"`
		Pod       *struct {
			Name string `json:"name"`
			UID  string `json:"uid"`
		} `json:"pod"`
	} `json:"kubernetes.io"`
}

// PodOf decodes (without verifying: the API server does that) the claims
// of a pod-bound service-account token; ok is false when tok is not one.
func PodOf(tok []byte) (p Pod, ok bool) {
	parts := strings.Split(string(bytes.TrimSpace(tok)), ".")
	if len(parts) != 3 {
		return Pod{}, false
	}
	payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return Pod{}, false
	}
	var c tokenClaims
	if err := json.Unmarshal(payload, &c); err != nil || c.K8s == nil || c.K8s.Pod == nil || c.K8s.Pod.UID == "" {
		return Pod{}, false
	}
	p = Pod{Namespace: c.K8s.Namespace, Name: c.K8s.Pod.Name, UID: c.K8s.Pod.UID}
	if c.Exp != 0 {
		p.Expires = time.Unix(c.Exp, 0)
	}
	return p, true
}

// Decide says whether to replace the token on disk with ours (own), and
// whether to look again soon because another live installer's token is
// there.
func Decide(ctx context.Context, disk, own []byte, alive PodAlive, now time.Time) (write, recheck bool) {
	if bytes.Equal(disk, own) {
		return false, false
	}
	d, okDisk := PodOf(disk)
	o, okOwn := PodOf(own)
	switch {
	case !okDisk || !okOwn:
		return true, false
	case d.UID == o.UID:
		return true, false // our own token, rotated by kubelet
	case !d.Expires.IsZero() && d.Expires.Before(now):
		return true, false
	}
	if alive != nil {
		ok, err := alive(ctx, d.Namespace, d.Name, d.UID)
		if err == nil && !ok {
			return true, false
		}
	}
	return o.Expires.After(d.Expires), true
}
