package install

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
// holding the token of the pod that stays. The rule each instance applies:
//
//   - the file holds our own token (or an older copy of it): write ours;
//   - it holds something that is not a pod-bound token, or an expired one:
//     write ours;
//   - it holds the token of another pod: ask the API whether that pod still
//     runs (not found, another UID or being deleted means no) and write ours
//     if it does not; while it does, both tokens work and the one expiring
//     later stays, and the instance looks again soon (PassResult.Recheck), so it
//     takes over within seconds of the other pod's deletion starting;
//   - without an answer from the API, the token expiring later stays.
//
// The decision is the same on both sides, so the two instances never write
// the file back and forth.

// PodAlive reports whether the pod a token is bound to still runs: false
// when it does not exist, has another UID, or is being deleted.
type PodAlive func(ctx context.Context, namespace, name, uid string) (bool, error)

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

// podClaims decodes (without verifying: the API server does that) the
// claims of a pod-bound service-account token.
func podClaims(tok []byte) (tokenClaims, bool) {
	parts := strings.Split(string(bytes.TrimSpace(tok)), ".")
	if len(parts) != 3 {
		return tokenClaims{}, false
	}
	payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return tokenClaims{}, false
	}
	var c tokenClaims
	if err := json.Unmarshal(payload, &c); err != nil || c.K8s == nil || c.K8s.Pod == nil || c.K8s.Pod.UID == "" {
		return tokenClaims{}, false
	}
	return c, true
}

// tokenDecision says whether to replace the token on disk with ours, and
// whether to look again soon because another live installer's token is
// there.
func tokenDecision(ctx context.Context, disk, own []byte, alive PodAlive, now time.Time) (write, recheck bool) {
	if bytes.Equal(disk, own) {
		return false, false
	}
	dc, okDisk := podClaims(disk)
	oc, okOwn := podClaims(own)
	switch {
	case !okDisk || !okOwn:
		return true, false
	case dc.K8s.Pod.UID == oc.K8s.Pod.UID:
		return true, false // our own token, rotated by kubelet
	case dc.Exp != 0 && time.Unix(dc.Exp, 0).Before(now):
		return true, false
	}
	if alive != nil {
		ok, err := alive(ctx, dc.K8s.Namespace, dc.K8s.Pod.Name, dc.K8s.Pod.UID)
		if err == nil && !ok {
			return true, false
		}
	}
	return oc.Exp > dc.Exp, true
}
