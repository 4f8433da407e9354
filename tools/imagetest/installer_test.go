//go:build images

package imagetest

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/tools/ociimage"
)

// The node's primary network before the installer runs.
const ptpConflist = `{
  "cniVersion": "1.0.0",
  "name": "k8s-pod-network",
  "plugins": [
    {"type": "ptp", "ipMasq": false, "ipam": {"type": "host-local", "subnet": "198.18.0.0/24"}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`

const saDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// TestInstallerChainsPlugin runs the installer image the way its DaemonSet
// does: the manifest's command, args, host directories (temp directories
// here) mounted at its volumeMounts, a service-account token mounted where
// kubelet puts it, no network. Its readiness probe command fails before and
// passes after the installer chained consul-cni into the ptp conflist and
// copied the image's plugin binary into the bin directory.
func TestInstallerChainsPlugin(t *testing.T) {
	spec := ociimage.Specs[1]
	plugin := spec.Binaries[1] // the plugin's binary name is its CNI type
	a := readArchive(t, spec)
	p := newPodman(t)
	p.load(a)
	w, c, _ := manifestContainer(t, spec)
	if len(c.Command) == 0 || c.ReadinessProbe == nil || c.ReadinessProbe.Exec == nil || len(c.ReadinessProbe.Exec.Command) == 0 {
		t.Fatalf("%s: container %s needs a command and an exec readiness probe", spec.Manifest, c.Name)
	}
	host := map[string]string{}
	var mounts []string
	for _, v := range w.Spec.Template.Spec.Volumes {
		if v.HostPath != nil {
			host[v.Name] = t.TempDir()
		}
	}
	for _, m := range c.VolumeMounts {
		if dir, ok := host[m.Name]; ok {
			mounts = append(mounts, "--volume", dir+":"+m.MountPath)
		}
	}
	netDir, binDir := host["cni-net-dir"], host["cni-bin-dir"]
	if netDir == "" || binDir == "" || len(mounts) != 4 {
		t.Fatalf("%s: want hostPath volumes cni-net-dir and cni-bin-dir mounted, got %v", spec.Manifest, mounts)
	}
	writeFile(t, filepath.Join(netDir, "10-ptp.conflist"), ptpConflist)
	mounts = append(mounts, "--volume", serviceAccount(t)+":"+saDir+":ro",
		"--env", "KUBERNETES_SERVICE_HOST=10.96.0.1", "--env", "KUBERNETES_SERVICE_PORT=443")

	probe := c.ReadinessProbe.Exec.Command
	if _, _, err := p.runImage(a.ref, append(mounts, "--entrypoint", probe[0]), probe[1:]...); exitCode(err) != 1 {
		t.Fatalf("readiness probe before the installer ran: exit %d (%v), want 1", exitCode(err), err)
	}

	args := append(append([]string{"run", "--detach", "--name", "installer"}, p.restricted...), mounts...)
	args = append(append(args, "--entrypoint", c.Command[0], a.ref), c.Args...)
	p.must(args...)
	waitReady(t, p, probe)

	var conf struct {
		Plugins []struct {
			Type string `json:"type"`
		} `json:"plugins"`
	}
	raw, err := os.ReadFile(filepath.Join(netDir, "10-ptp.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &conf); err != nil {
		t.Fatalf("conflist after install: %v\n%s", err, raw)
	}
	if n := len(conf.Plugins); n != 3 || conf.Plugins[0].Type != "ptp" || conf.Plugins[n-1].Type != plugin {
		t.Errorf("conflist after install has plugins %+v, want ptp, portmap, %s", conf.Plugins, plugin)
	}
	installed, err := os.ReadFile(filepath.Join(binDir, plugin))
	if err != nil {
		t.Fatalf("plugin binary not installed: %v", err)
	}
	files, err := ociimage.Files(a.platformImage(t, "linux", runtime.GOARCH))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(installed, files["usr/local/bin/"+plugin].Data) {
		t.Errorf("%s in the host bin directory differs from the image's", plugin)
	}
	if out, errOut, err := p.run("stop", "--time", "10", "installer"); err != nil {
		t.Errorf("stopping the installer: %v\n%s%s", err, out, errOut)
	}
}

// waitReady runs the readiness probe in the installer container until it
// passes; the installer exiting, or two minutes of not ready, fails.
func waitReady(t *testing.T, p *podman, probe []string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		out, errOut, err := p.run(append([]string{"exec", "installer"}, probe...)...)
		if err == nil {
			return
		}
		state, _, _ := p.run("inspect", "--format", "{{.State.Status}}", "installer")
		if time.Now().After(deadline) || bytes.Contains([]byte(state), []byte("exited")) {
			logs, logErr, _ := p.run("logs", "installer")
			t.Fatalf("installer not ready (state %s): %v\n%s%s\nlogs:\n%s%s", state, err, out, errOut, logs, logErr)
		}
		time.Sleep(time.Second)
	}
}

// serviceAccount writes what kubelet mounts for a pod's service account: a
// token, the cluster CA (a throwaway self-signed one) and the namespace.
func serviceAccount(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "ca.crt"), string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))
	writeFile(t, filepath.Join(dir, "token"), "test-token\n")
	writeFile(t, filepath.Join(dir, "namespace"), "consul-cni-repair\n")
	return dir
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
