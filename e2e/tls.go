package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
)

// tlsMode says how members serve clients.
type tlsMode int

const (
	tlsOff    tlsMode = iota
	tlsServer         // clients verify the members; members ask nothing of clients
	tlsMutual         // members also require a client certificate from the cluster's CA
)

// DefaultClientCommonName is the common name of the client certificate a
// TLS cluster issues for Client, NewClient and ClientAs. It names no etcd
// user, so under WithAuth the certificate alone grants nothing: etcd takes
// a verified client certificate's common name as the user name only when no
// password token is sent.
const DefaultClientCommonName = "leasehold-e2e-client"

// WithTLS makes members serve clients, and each other, over TLS with
// certificates issued by a certificate authority generated for the cluster
// (ECDSA P-256, valid for a day, for 127.0.0.1, ::1 and localhost).
// Endpoints become https URLs; clients from Client, NewClient and ClientAs
// trust the CA. CAFile, ClientCertFile and ClientKeyFile name PEM files for
// other programs, such as the leasehold CLI or etcdctl.
func WithTLS() Option {
	return func(c *config) error {
		c.tls = max(c.tls, tlsServer)
		return nil
	}
}

// WithMutualTLS is WithTLS, and members also refuse clients that do not
// present a certificate issued by the cluster's CA. The cluster's own
// clients present one (common name DefaultClientCommonName); ClientTLS
// issues others.
func WithMutualTLS() Option {
	return func(c *config) error {
		c.tls = tlsMutual
		return nil
	}
}

// pki is a cluster's certificate authority and the certificates it issued,
// with their PEM files under dir.
type pki struct {
	dir    string
	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
	pool   *x509.CertPool
	client tls.Certificate // DefaultClientCommonName's

	caFile, memberCertFile, memberKeyFile, clientCertFile, clientKeyFile string

	mu     sync.Mutex
	serial int64
}

// newPKI creates a CA, a member certificate (server and client use: members
// are each other's clients) and the default client certificate, and writes
// them under dir.
func newPKI(dir string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("e2e: tls: %w", err)
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("e2e: tls: CA key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "leasehold e2e CA", Organization: []string{"leasehold e2e"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("e2e: tls: CA certificate: %w", err)
	}
	caCert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("e2e: tls: CA certificate: %w", err)
	}
	p := &pki{dir: dir, caCert: caCert, caKey: caKey, pool: x509.NewCertPool(), serial: 1}
	p.pool.AddCert(caCert)
	p.caFile = filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(p.caFile, pemBlock("CERTIFICATE", der), 0o644); err != nil {
		return nil, fmt.Errorf("e2e: tls: %w", err)
	}
	if p.memberCertFile, p.memberKeyFile, err = p.writeCert("member", "leasehold-e2e-member", true); err != nil {
		return nil, err
	}
	if p.clientCertFile, p.clientKeyFile, err = p.writeCert("client", DefaultClientCommonName, false); err != nil {
		return nil, err
	}
	if p.client, err = tls.LoadX509KeyPair(p.clientCertFile, p.clientKeyFile); err != nil {
		return nil, fmt.Errorf("e2e: tls: %w", err)
	}
	return p, nil
}

// issue returns a new certificate and key, PEM-encoded, signed by the CA.
// A member certificate serves 127.0.0.1, ::1 and localhost and is also a
// client certificate (for peer connections); a client certificate carries
// commonName, which etcd may take as the user name.
func (p *pki) issue(commonName string, member bool) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("e2e: tls: key: %w", err)
	}
	p.mu.Lock()
	p.serial++
	serial := p.serial
	p.mu.Unlock()
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: commonName, Organization: []string{"leasehold e2e"}},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if member {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
		tmpl.DNSNames = []string{"localhost"}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, &key.PublicKey, p.caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("e2e: tls: certificate for %q: %w", commonName, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("e2e: tls: key for %q: %w", commonName, err)
	}
	return pemBlock("CERTIFICATE", der), pemBlock("PRIVATE KEY", keyDER), nil
}

// writeCert issues a certificate and writes it to <name>.pem and
// <name>-key.pem (readable by the owner only).
func (p *pki) writeCert(name, commonName string, member bool) (certFile, keyFile string, err error) {
	certPEM, keyPEM, err := p.issue(commonName, member)
	if err != nil {
		return "", "", err
	}
	certFile, keyFile = filepath.Join(p.dir, name+".pem"), filepath.Join(p.dir, name+"-key.pem")
	if err := os.WriteFile(certFile, certPEM, 0o644); err != nil {
		return "", "", fmt.Errorf("e2e: tls: %w", err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		return "", "", fmt.Errorf("e2e: tls: %w", err)
	}
	return certFile, keyFile, nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

// clientConfig trusts the CA and presents cert.
func (p *pki) clientConfig(cert tls.Certificate) *tls.Config {
	return &tls.Config{RootCAs: p.pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
}

// setupTLS creates the cluster's PKI under dir when TLS is on.
func (c *Cluster) setupTLS(dir string) error {
	if c.cfg.tls == tlsOff {
		return nil
	}
	p, err := newPKI(filepath.Join(dir, "tls"))
	if err != nil {
		return err
	}
	c.pki = p
	return nil
}

// scheme is the scheme of the members' URLs.
func (c *Cluster) scheme() string {
	if c.pki != nil {
		return "https"
	}
	return "http"
}

// configureTLS sets a member's client and peer TLS. Peers always
// authenticate each other with the member certificate; clients must
// present one only under WithMutualTLS.
func (c *Cluster) configureTLS(ec *embed.Config) {
	if c.pki == nil {
		return
	}
	p := c.pki
	ec.ClientTLSInfo = transport.TLSInfo{CertFile: p.memberCertFile, KeyFile: p.memberKeyFile}
	if c.cfg.tls == tlsMutual {
		// etcd requires a client certificate whenever a trusted CA is set.
		ec.ClientTLSInfo.TrustedCAFile = p.caFile
		ec.ClientTLSInfo.ClientCertAuth = true
	}
	ec.PeerTLSInfo = transport.TLSInfo{
		CertFile: p.memberCertFile, KeyFile: p.memberKeyFile, TrustedCAFile: p.caFile, ClientCertAuth: true,
	}
}

// TLSConfig returns a new client TLS configuration that trusts the
// cluster's CA and presents the default client certificate (common name
// DefaultClientCommonName), or nil if the cluster does not use TLS.
func (c *Cluster) TLSConfig() *tls.Config {
	if c.pki == nil {
		return nil
	}
	return c.pki.clientConfig(c.pki.client)
}

// ClientTLS returns a client TLS configuration that trusts the cluster's
// CA and presents a new certificate with the given common name. Under
// WithMutualTLS and WithAuth, etcd takes that common name as the user name
// of requests that carry no password token: a certificate for an existing
// user authenticates as that user.
func (c *Cluster) ClientTLS(commonName string) (*tls.Config, error) {
	if c.pki == nil {
		return nil, errors.New("e2e: ClientTLS: the cluster does not use TLS (WithTLS, WithMutualTLS)")
	}
	if commonName == "" {
		return nil, errors.New("e2e: ClientTLS: empty common name")
	}
	certPEM, keyPEM, err := c.pki.issue(commonName, false)
	if err != nil {
		return nil, err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("e2e: ClientTLS: %w", err)
	}
	return c.pki.clientConfig(cert), nil
}

// CAFile returns the path of the cluster CA's PEM certificate, or "" if
// the cluster does not use TLS. The file lives as long as the cluster.
func (c *Cluster) CAFile() string {
	if c.pki == nil {
		return ""
	}
	return c.pki.caFile
}

// ClientCertFile returns the path of the default client certificate (PEM),
// or "" if the cluster does not use TLS.
func (c *Cluster) ClientCertFile() string {
	if c.pki == nil {
		return ""
	}
	return c.pki.clientCertFile
}

// ClientKeyFile returns the path of the default client certificate's
// private key (PEM, PKCS #8), or "" if the cluster does not use TLS.
func (c *Cluster) ClientKeyFile() string {
	if c.pki == nil {
		return ""
	}
	return c.pki.clientKeyFile
}
