package cluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki holds the files the control plane is started with.
type pki struct {
	CAFile, CAKeyFile       string
	ServingCert, ServingKey string
	// KubeletClientCert/Key: the apiserver's client certificate towards
	// kubelets (simulated nodes accept only certificates of the CA).
	KubeletClientCert, KubeletClientKey string
	SAPublic, SAPrivate                 string
	CAPEM                               []byte
}

func newKey() (*ecdsa.PrivateKey, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) }

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		panic(err)
	}
	return n
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode)
}

func writeKey(path string, k *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return err
	}
	return writePEM(path, "EC PRIVATE KEY", der, 0o600)
}

// newPKI writes a CA, a serving certificate for the apiserver on loopback
// (and the in-cluster names of the kubernetes service), and a service-account
// signing key pair into dir.
func newPKI(dir string, serviceIP net.IP) (*pki, error) {
	p := &pki{
		CAFile: filepath.Join(dir, "ca.crt"), CAKeyFile: filepath.Join(dir, "ca.key"),
		ServingCert: filepath.Join(dir, "apiserver.crt"), ServingKey: filepath.Join(dir, "apiserver.key"),
		KubeletClientCert: filepath.Join(dir, "apiserver-kubelet-client.crt"), KubeletClientKey: filepath.Join(dir, "apiserver-kubelet-client.key"),
		SAPublic: filepath.Join(dir, "sa.pub"), SAPrivate: filepath.Join(dir, "sa.key"),
	}
	now := time.Now().Add(-time.Hour)
	caKey, err := newKey()
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "consul-cni-repair-test-ca"},
		NotBefore:             now,
		NotAfter:              now.Add(10 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	p.CAPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	if err := os.WriteFile(p.CAFile, p.CAPEM, 0o644); err != nil {
		return nil, err
	}
	if err := writeKey(p.CAKeyFile, caKey); err != nil {
		return nil, err
	}

	if err := p.serving(ca, caKey, now, serviceIP); err != nil {
		return nil, err
	}
	if err := p.kubeletClient(ca, caKey, now); err != nil {
		return nil, err
	}
	if err := p.serviceAccountKey(); err != nil {
		return nil, err
	}
	return p, nil
}

// serving writes the apiserver's serving certificate for loopback and the
// in-cluster names of the kubernetes service.
func (p *pki) serving(ca *x509.Certificate, caKey *ecdsa.PrivateKey, now time.Time, serviceIP net.IP) error {
	srvKey, err := newKey()
	if err != nil {
		return err
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now,
		NotAfter:     now.Add(10 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
			"kubernetes.default.svc.cluster.local"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback, serviceIP},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("serving certificate: %w", err)
	}
	if err := writePEM(p.ServingCert, "CERTIFICATE", srvDER, 0o644); err != nil {
		return err
	}
	if err := writeKey(p.ServingKey, srvKey); err != nil {
		return err
	}
	return nil
}

// serviceAccountKey writes the service-account signing key pair.
func (p *pki) serviceAccountKey() error {
	saKey, err := newKey()
	if err != nil {
		return err
	}
	if err := writeKey(p.SAPrivate, saKey); err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return err
	}
	if err := writePEM(p.SAPublic, "PUBLIC KEY", pub, 0o644); err != nil {
		return err
	}
	return nil
}

// kubeletClient writes the apiserver's client certificate for kubelets.
func (p *pki) kubeletClient(ca *x509.Certificate, caKey *ecdsa.PrivateKey, now time.Time) error {
	key, err := newKey()
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "kube-apiserver-kubelet-client"},
		NotBefore:    now,
		NotAfter:     now.Add(10 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("kubelet client certificate: %w", err)
	}
	if err := writePEM(p.KubeletClientCert, "CERTIFICATE", der, 0o644); err != nil {
		return err
	}
	return writeKey(p.KubeletClientKey, key)
}

func randomToken() string {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}
