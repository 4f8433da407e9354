// Package credentialstest makes tokens shaped like the pod-bound
// service-account tokens the installer hands to the plugin, for tests of
// pkg/install/credentials and pkg/install.
package credentialstest

import (
	"encoding/base64"
	"fmt"
	"time"
)

// PodToken builds a token shaped like a pod-bound service-account token of
// the namespace consul-cni-repair (the signature is not checked by the
// installer).
func PodToken(pod, uid string, exp time.Time) string {
	enc := base64.RawURLEncoding.EncodeToString
	payload := fmt.Sprintf(`{"aud":["https://kubernetes.default.svc"],"exp":%d,"iat":%d,"iss":"https://kubernetes.default.svc",
"kubernetes.io":{"namespace":"consul-cni-repair","pod":{"name":%q,"uid":%q},"serviceaccount":{"name":"consul-cni","uid":"sa"}},
"sub":"system:serviceaccount:consul-cni-repair:consul-cni"}`, exp.Unix(), exp.Add(-time.Hour).Unix(), pod, uid)
	return enc([]byte(`{"alg":"RS256","kid":"k"}`)) + "." + enc([]byte(payload)) + "." + enc([]byte("sig"))
}
