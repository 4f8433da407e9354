package simnode

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// volumes is the host side of a pod's volumes.
type volumes struct {
	podDir string
	// dirs maps a volume name to its directory (or file, for a hostPath
	// file) on the node.
	dirs map[string]string
	// hostPaths maps the path of each hostPath volume to Root+path.
	hostPaths map[string]string
	tokens    []*projectedToken
	// kubeconfig is the file every container gets as KUBECONFIG.
	kubeconfig string
	kubeToken  *projectedToken

	contentRV   string
	contentTime time.Time
}

// projectedToken is a service-account token file kept fresh like kubelet
// does: renewed once 80% of its lifetime has passed.
type projectedToken struct {
	file      string
	mode      os.FileMode
	audience  string
	expSecs   int64
	refreshAt time.Time
}

func (w *podWorker) podDir() string {
	return filepath.Join(podsDir(w.n.cfg.Root), string(w.uid))
}

// setupVolumes materializes every volume of the pod and the pod's
// kubeconfig. It fails (and is retried by the caller) when an object a
// volume needs is missing, as kubelet's FailedMount.
func (w *podWorker) setupVolumes(ctx context.Context, pod *corev1.Pod) (*volumes, error) {
	v := &volumes{podDir: w.podDir(), dirs: map[string]string{}, hostPaths: map[string]string{}}
	if err := os.MkdirAll(filepath.Join(v.podDir, "volumes"), 0o755); err != nil {
		return nil, err
	}
	for _, vol := range pod.Spec.Volumes {
		switch {
		case vol.HostPath != nil:
			p := filepath.Join(w.n.cfg.Root, filepath.Clean("/"+vol.HostPath.Path))
			if err := prepareHostPath(p, vol.HostPath.Type); err != nil {
				return nil, fmt.Errorf("volume %q: hostPath %s: %w", vol.Name, vol.HostPath.Path, err)
			}
			v.dirs[vol.Name] = p
			v.hostPaths[filepath.Clean(vol.HostPath.Path)] = p
		case vol.EmptyDir != nil:
			d := filepath.Join(v.podDir, "volumes", vol.Name)
			if err := os.MkdirAll(d, 0o777); err != nil {
				return nil, err
			}
			if err := os.Chmod(d, 0o777); err != nil {
				return nil, err
			}
			v.dirs[vol.Name] = d
		case vol.ConfigMap != nil, vol.Secret != nil, vol.DownwardAPI != nil, vol.Projected != nil:
			d := filepath.Join(v.podDir, "volumes", vol.Name)
			if err := os.MkdirAll(d, 0o755); err != nil {
				return nil, err
			}
			v.dirs[vol.Name] = d
		default:
			return nil, fmt.Errorf("volume %q: type not supported by simulated nodes", vol.Name)
		}
	}
	// Service-account tokens of projected volumes.
	for _, vol := range pod.Spec.Volumes {
		if vol.Projected == nil {
			continue
		}
		for _, src := range vol.Projected.Sources {
			if t := src.ServiceAccountToken; t != nil {
				exp := int64(3600)
				if t.ExpirationSeconds != nil {
					exp = *t.ExpirationSeconds
				}
				v.tokens = append(v.tokens, &projectedToken{
					file: filepath.Join(v.dirs[vol.Name], filepath.Clean("/"+t.Path)), audience: t.Audience,
					expSecs: exp, mode: fileMode(vol.Projected.DefaultMode, nil),
				})
			}
		}
	}
	kdir := filepath.Join(v.podDir, "kubeconfig")
	if err := os.MkdirAll(kdir, 0o755); err != nil {
		return nil, err
	}
	v.kubeToken = &projectedToken{file: filepath.Join(kdir, "token"), expSecs: 3600, mode: 0o644}
	v.tokens = append(v.tokens, v.kubeToken)
	v.kubeconfig = filepath.Join(kdir, "kubeconfig")
	if err := w.writeKubeconfig(v.kubeconfig, v.kubeToken.file); err != nil {
		return nil, err
	}
	if err := w.refreshVolumes(ctx, pod, v, true); err != nil {
		return nil, err
	}
	return v, nil
}

func prepareHostPath(p string, t *corev1.HostPathType) error {
	typ := corev1.HostPathUnset
	if t != nil {
		typ = *t
	}
	st, err := os.Stat(p)
	switch typ {
	case corev1.HostPathUnset, corev1.HostPathDirectoryOrCreate:
		if os.IsNotExist(err) {
			return os.MkdirAll(p, 0o755)
		}
		return err
	case corev1.HostPathDirectory:
		if err != nil {
			return err
		}
		if !st.IsDir() {
			return fmt.Errorf("not a directory")
		}
	case corev1.HostPathFileOrCreate:
		if os.IsNotExist(err) {
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			return os.WriteFile(p, nil, 0o644)
		}
		return err
	case corev1.HostPathFile:
		if err != nil {
			return err
		}
		if st.IsDir() {
			return fmt.Errorf("is a directory")
		}
	default:
		return err
	}
	return nil
}

// writeKubeconfig writes a kubeconfig for the pod's service account that
// reads its token from tokenFile (refreshed by refreshVolumes).
func (w *podWorker) writeKubeconfig(file, tokenFile string) error {
	rc := w.n.cfg.RestConfig
	ca := rc.TLSClientConfig.CAData
	if len(ca) == 0 && rc.TLSClientConfig.CAFile != "" {
		b, err := os.ReadFile(rc.TLSClientConfig.CAFile)
		if err != nil {
			return err
		}
		ca = b
	}
	// The apiserver's certificate names the address it was dialed at
	// originally, which must still be what TLS verifies.
	serverName := rc.TLSClientConfig.ServerName
	if serverName == "" {
		if u, err := url.Parse(rc.Host); err == nil {
			serverName = u.Hostname()
		}
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["local"] = &clientcmdapi.Cluster{Server: w.n.api.URL(), CertificateAuthorityData: ca, TLSServerName: serverName}
	kc.AuthInfos["pod"] = &clientcmdapi.AuthInfo{TokenFile: tokenFile}
	kc.Contexts["local"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: "pod"}
	kc.CurrentContext = "local"
	b, err := clientcmd.Write(*kc)
	if err != nil {
		return err
	}
	return writeAtomic(file, b, 0o644)
}

// refreshVolumes renews tokens that are due and, when the pod changed or a
// minute passed (force on setup), rewrites configMap, secret and downward
// API files whose content changed.
func (w *podWorker) refreshVolumes(ctx context.Context, pod *corev1.Pod, v *volumes, force bool) error {
	now := time.Now()
	for _, t := range v.tokens {
		if !force && now.Before(t.refreshAt) {
			continue
		}
		if err := w.requestToken(ctx, pod, t); err != nil {
			return err
		}
	}
	if !force && pod.ResourceVersion == v.contentRV && now.Sub(v.contentTime) < time.Minute {
		return nil
	}
	for _, vol := range pod.Spec.Volumes {
		dir := v.dirs[vol.Name]
		var err error
		switch {
		case vol.ConfigMap != nil:
			err = w.writeConfigMap(ctx, pod.Namespace, dir, vol.ConfigMap.Name, vol.ConfigMap.Items, vol.ConfigMap.Optional, fileMode(vol.ConfigMap.DefaultMode, nil))
		case vol.Secret != nil:
			err = w.writeSecret(ctx, pod.Namespace, dir, vol.Secret.SecretName, vol.Secret.Items, vol.Secret.Optional, fileMode(vol.Secret.DefaultMode, nil))
		case vol.DownwardAPI != nil:
			err = w.writeDownward(pod, dir, vol.DownwardAPI.Items, fileMode(vol.DownwardAPI.DefaultMode, nil))
		case vol.Projected != nil:
			mode := fileMode(vol.Projected.DefaultMode, nil)
			for _, src := range vol.Projected.Sources {
				switch {
				case src.ConfigMap != nil:
					err = w.writeConfigMap(ctx, pod.Namespace, dir, src.ConfigMap.Name, src.ConfigMap.Items, src.ConfigMap.Optional, mode)
				case src.Secret != nil:
					err = w.writeSecret(ctx, pod.Namespace, dir, src.Secret.Name, src.Secret.Items, src.Secret.Optional, mode)
				case src.DownwardAPI != nil:
					err = w.writeDownward(pod, dir, src.DownwardAPI.Items, mode)
				}
				if err != nil {
					break
				}
			}
		}
		if err != nil {
			return fmt.Errorf("volume %q: %w", vol.Name, err)
		}
	}
	v.contentRV, v.contentTime = pod.ResourceVersion, now
	return nil
}

func (w *podWorker) requestToken(ctx context.Context, pod *corev1.Pod, t *projectedToken) error {
	exp := t.expSecs
	if exp < 600 {
		exp = 600
	}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: &exp,
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}
	if t.audience != "" {
		req.Spec.Audiences = []string{t.audience}
	}
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	tr, err := w.n.client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, sa, req, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("token for service account %s/%s: %w", pod.Namespace, sa, err)
	}
	if err := writeAtomic(t.file, []byte(tr.Status.Token), t.mode); err != nil {
		return err
	}
	life := time.Until(tr.Status.ExpirationTimestamp.Time)
	if life <= 0 {
		life = time.Duration(exp) * time.Second
	}
	t.refreshAt = time.Now().Add(life * 8 / 10)
	return nil
}

func fileMode(def *int32, item *int32) os.FileMode {
	if item != nil {
		return os.FileMode(*item) & 0o777
	}
	if def != nil {
		return os.FileMode(*def) & 0o777
	}
	return 0o644
}

func (w *podWorker) writeConfigMap(ctx context.Context, ns, dir, name string, items []corev1.KeyToPath, optional *bool, mode os.FileMode) error {
	cm, err := w.n.client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if optional != nil && *optional {
			return nil
		}
		return fmt.Errorf("configmap %q: %w", name, err)
	}
	data := map[string][]byte{}
	for k, val := range cm.Data {
		data[k] = []byte(val)
	}
	for k, val := range cm.BinaryData {
		data[k] = val
	}
	return writeKeys(dir, data, items, mode)
}

func (w *podWorker) writeSecret(ctx context.Context, ns, dir, name string, items []corev1.KeyToPath, optional *bool, mode os.FileMode) error {
	s, err := w.n.client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if optional != nil && *optional {
			return nil
		}
		return fmt.Errorf("secret %q: %w", name, err)
	}
	return writeKeys(dir, s.Data, items, mode)
}

func writeKeys(dir string, data map[string][]byte, items []corev1.KeyToPath, mode os.FileMode) error {
	if len(items) == 0 {
		for k, val := range data {
			if err := writeAtomic(filepath.Join(dir, filepath.Clean("/"+k)), val, mode); err != nil {
				return err
			}
		}
		return nil
	}
	for _, it := range items {
		val, ok := data[it.Key]
		if !ok {
			return fmt.Errorf("key %q not found", it.Key)
		}
		m := mode
		if it.Mode != nil {
			m = os.FileMode(*it.Mode) & 0o777
		}
		if err := writeAtomic(filepath.Join(dir, filepath.Clean("/"+it.Path)), val, m); err != nil {
			return err
		}
	}
	return nil
}

func (w *podWorker) writeDownward(pod *corev1.Pod, dir string, items []corev1.DownwardAPIVolumeFile, mode os.FileMode) error {
	for _, it := range items {
		if it.FieldRef == nil {
			continue // resource fields: not simulated
		}
		val, err := fieldValue(pod, it.FieldRef.FieldPath)
		if err != nil {
			return err
		}
		m := mode
		if it.Mode != nil {
			m = os.FileMode(*it.Mode) & 0o777
		}
		if err := writeAtomic(filepath.Join(dir, filepath.Clean("/"+it.Path)), []byte(val), m); err != nil {
			return err
		}
	}
	return nil
}

// formatMap renders labels or annotations the way kubelet writes them into
// downward API files: sorted key="quoted value" lines.
func formatMap(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(strconv.Quote(m[k]))
	}
	return b.String()
}

// fieldValue resolves a downward API field path of the pod.
func fieldValue(pod *corev1.Pod, fp string) (string, error) {
	if k, ok := subscript(fp, "metadata.annotations"); ok {
		return pod.Annotations[k], nil
	}
	if k, ok := subscript(fp, "metadata.labels"); ok {
		return pod.Labels[k], nil
	}
	switch fp {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "metadata.labels":
		return formatMap(pod.Labels), nil
	case "metadata.annotations":
		return formatMap(pod.Annotations), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.hostIP":
		return pod.Status.HostIP, nil
	case "status.hostIPs":
		var s []string
		for _, ip := range pod.Status.HostIPs {
			s = append(s, ip.IP)
		}
		return strings.Join(s, ","), nil
	case "status.podIP":
		return pod.Status.PodIP, nil
	case "status.podIPs":
		var s []string
		for _, ip := range pod.Status.PodIPs {
			s = append(s, ip.IP)
		}
		return strings.Join(s, ","), nil
	}
	return "", fmt.Errorf("field path %q not supported", fp)
}

func subscript(fp, prefix string) (string, bool) {
	if !strings.HasPrefix(fp, prefix+"['") || !strings.HasSuffix(fp, "']") {
		return "", false
	}
	return fp[len(prefix)+2 : len(fp)-2], true
}

// writeAtomic replaces file with data unless it already holds it.
func writeAtomic(file string, data []byte, mode os.FileMode) error {
	if old, err := os.ReadFile(file); err == nil && bytes.Equal(old, data) {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return err
	}
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	if err := os.Chmod(tmp, mode); err != nil {
		return err
	}
	return os.Rename(tmp, file)
}

// rebaser rewrites container paths into node paths (see docs/design/test-harness.md).
type rebaser struct {
	mounts    []mapping // volume mounts and the termination message file, longest first
	hostPaths []mapping // hostPath volume paths, longest first
}

type mapping struct{ from, to string }

func newRebaser(c *corev1.Container, v *volumes, terminationFile string) *rebaser {
	r := &rebaser{}
	for _, m := range c.VolumeMounts {
		dir, ok := v.dirs[m.Name]
		if !ok {
			continue
		}
		if m.SubPath != "" {
			dir = filepath.Join(dir, filepath.Clean("/"+m.SubPath))
		}
		r.mounts = append(r.mounts, mapping{path.Clean(m.MountPath), dir})
	}
	if terminationFile != "" {
		tp := c.TerminationMessagePath
		if tp == "" {
			tp = corev1.TerminationMessagePathDefault
		}
		r.mounts = append(r.mounts, mapping{path.Clean(tp), terminationFile})
	}
	for from, to := range v.hostPaths {
		r.hostPaths = append(r.hostPaths, mapping{from, to})
	}
	byLen := func(m []mapping) {
		sort.Slice(m, func(i, j int) bool { return len(m[i].from) > len(m[j].from) })
	}
	byLen(r.mounts)
	byLen(r.hostPaths)
	return r
}

// value rebases a whole value that is a path, or the value part of a
// "--flag=/path" or "NAME=/path" argument.
func (r *rebaser) value(s string) string {
	if strings.HasPrefix(s, "/") {
		return r.path(s)
	}
	if i := strings.IndexByte(s, '='); i > 0 && strings.HasPrefix(s[i+1:], "/") {
		return s[:i+1] + r.path(s[i+1:])
	}
	return s
}

func (r *rebaser) path(p string) string {
	for _, set := range [][]mapping{r.mounts, r.hostPaths} {
		for _, m := range set {
			if m.from == "/" {
				continue
			}
			if p == m.from {
				return m.to
			}
			if strings.HasPrefix(p, m.from+"/") {
				return m.to + p[len(m.from):]
			}
		}
	}
	return p
}
