// Package testcerts makes X.509 certificates for tests with crypto/x509: a
// CA, and certificates it signs for a server on 127.0.0.1 and localhost or
// for a client named by its common name. Keys are ECDSA P-256; everything
// is valid for a day.
package testcerts

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CA is a certificate authority.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// PEM is the CA's certificate, PEM-encoded.
	PEM []byte
}

// NewCA returns a self-signed CA named name.
func NewCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := template(name)
	tmpl.IsCA = true
	tmpl.BasicConstraintsValid = true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("create CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{cert: cert, key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// Server returns a server certificate for 127.0.0.1, ::1 and localhost,
// and the DNS names names, and its key, PEM-encoded.
func (ca *CA) Server(names ...string) (certPEM, keyPEM []byte, err error) {
	tmpl := template("localhost")
	tmpl.DNSNames = append([]string{"localhost"}, names...)
	tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	return ca.issue(tmpl)
}

// Client returns a client certificate with common name cn and its key,
// PEM-encoded.
func (ca *CA) Client(cn string) (certPEM, keyPEM []byte, err error) {
	tmpl := template(cn)
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	return ca.issue(tmpl)
}

func (ca *CA) issue(tmpl *x509.Certificate) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, nil, fmt.Errorf("create certificate %s: %w", tmpl.Subject.CommonName, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}

func template(cn string) *x509.Certificate {
	serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	now := time.Now()
	return &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(24 * time.Hour),
	}
}

// Set is a CA and a server certificate it signed, written to a directory.
type Set struct {
	CA *CA
	// CAFile, CertFile and KeyFile are the CA's certificate and the
	// server's certificate and key, PEM files.
	CAFile, CertFile, KeyFile string
	dir                       string
}

// NewSet makes a CA and a server certificate (see Server) and writes them
// to dir as ca.crt, server.crt and server.key.
func NewSet(dir string) (*Set, error) {
	ca, err := NewCA("berth test CA")
	if err != nil {
		return nil, err
	}
	s := &Set{CA: ca, CAFile: filepath.Join(dir, "ca.crt"), dir: dir}
	if err := os.WriteFile(s.CAFile, ca.PEM, 0o600); err != nil {
		return nil, err
	}
	certPEM, keyPEM, err := ca.Server()
	if err != nil {
		return nil, err
	}
	if s.CertFile, s.KeyFile, err = Write(dir, "server", certPEM, keyPEM); err != nil {
		return nil, err
	}
	return s, nil
}

// ClientFiles writes a client certificate of common name cn signed by the
// set's CA, and its key, to the set's directory as cn.crt and cn.key.
func (s *Set) ClientFiles(cn string) (certFile, keyFile string, err error) {
	certPEM, keyPEM, err := s.CA.Client(cn)
	if err != nil {
		return "", "", err
	}
	return Write(s.dir, cn, certPEM, keyPEM)
}

// Write writes certPEM and keyPEM to dir/name.crt and dir/name.key (0600)
// and returns their paths.
func Write(dir, name string, certPEM, keyPEM []byte) (certFile, keyFile string, err error) {
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}
