// Package pki is meshmark's own workload certificate authority: an in-memory ECDSA P-256
// CA that issues short-lived leaf certificates carrying a SPIFFE identity as URI SAN,
// the way Istio's CA does, so mesh profiles can turn mTLS on without any external PKI.
// Nothing here touches disk; profiles write the PEM bytes where their proxies read them.
package pki

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
	"net/url"
	"strings"
	"time"
)

// Default lifetimes: a study lasts hours, never days, and short-lived material is what
// meshes issue too (Istio's workload certificates live 24 hours).
const (
	DefaultCAValidity   = 7 * 24 * time.Hour
	DefaultLeafValidity = 24 * time.Hour
	// clockSkew backdates NotBefore so a certificate is valid at once on every process.
	clockSkew = 5 * time.Minute
)

// CA is a certificate authority for one SPIFFE trust domain.
type CA struct {
	TrustDomain string
	cert        *x509.Certificate
	key         *ecdsa.PrivateKey
	certPEM     []byte
}

// NewCA creates a self-signed root for trustDomain (e.g. "cluster.local").
func NewCA(trustDomain string, validity time.Duration) (*CA, error) {
	if err := validateTrustDomain(trustDomain); err != nil {
		return nil, err
	}
	if validity <= 0 {
		validity = DefaultCAValidity
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: generate CA key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{trustDomain}, CommonName: "meshmark workload CA"},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
		URIs:                  []*url.URL{{Scheme: "spiffe", Host: trustDomain}},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("pki: self-sign CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("pki: parse CA: %w", err)
	}
	return &CA{
		TrustDomain: trustDomain,
		cert:        cert,
		key:         key,
		certPEM:     pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
	}, nil
}

// CertPEM is the root certificate that verifiers trust.
func (c *CA) CertPEM() []byte { return append([]byte(nil), c.certPEM...) }

// Certificate is the parsed root certificate.
func (c *CA) Certificate() *x509.Certificate { return c.cert }

// Pool is a certificate pool holding only this root.
func (c *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(c.cert)
	return p
}

// Leaf is an issued workload certificate and its private key.
type Leaf struct {
	ID       string // the SPIFFE ID in the URI SAN
	CertPEM  []byte // the leaf certificate (the root is not appended; verifiers hold it)
	KeyPEM   []byte // PKCS#8 private key
	NotAfter time.Time
}

// TLSCertificate makes the leaf usable by crypto/tls.
func (l *Leaf) TLSCertificate() (tls.Certificate, error) {
	return tls.X509KeyPair(l.CertPEM, l.KeyPEM)
}

// Issue signs a certificate for spiffeID, usable both as TLS client and server, like a
// mesh workload certificate. validity <= 0 means DefaultLeafValidity; it never outlives
// the CA.
func (c *CA) Issue(spiffeID string, validity time.Duration) (*Leaf, error) {
	id, err := ParseSPIFFEID(spiffeID)
	if err != nil {
		return nil, err
	}
	if id.Host != c.TrustDomain {
		return nil, fmt.Errorf("pki: %q is outside trust domain %q", spiffeID, c.TrustDomain)
	}
	if validity <= 0 {
		validity = DefaultLeafValidity
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: generate key for %s: %w", spiffeID, err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	notAfter := now.Add(validity)
	if notAfter.After(c.cert.NotAfter) {
		notAfter = c.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		// SPIFFE X.509-SVIDs identify by URI SAN only; the subject is informational.
		Subject:     pkix.Name{Organization: []string{c.TrustDomain}},
		NotBefore:   now.Add(-clockSkew),
		NotAfter:    notAfter,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:        []*url.URL{id},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	if err != nil {
		return nil, fmt.Errorf("pki: sign %s: %w", spiffeID, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("pki: encode key for %s: %w", spiffeID, err)
	}
	return &Leaf{
		ID:       spiffeID,
		CertPEM:  pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:   pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		NotAfter: notAfter,
	}, nil
}

// PeerID verifies a peer's certificate chain against this CA and returns the SPIFFE ID
// it carries; tests and probes use it to see which identity answered.
func (c *CA) PeerID(chain []*x509.Certificate) (string, error) {
	if len(chain) == 0 {
		return "", errors.New("pki: peer presented no certificate")
	}
	inter := x509.NewCertPool()
	for _, ic := range chain[1:] {
		inter.AddCert(ic)
	}
	if _, err := chain[0].Verify(x509.VerifyOptions{
		Roots:         c.Pool(),
		Intermediates: inter,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	}); err != nil {
		return "", fmt.Errorf("pki: peer certificate: %w", err)
	}
	for _, u := range chain[0].URIs {
		if u.Scheme == "spiffe" {
			return u.String(), nil
		}
	}
	return "", errors.New("pki: peer certificate carries no SPIFFE ID")
}

// ParseSPIFFEID checks s against the SPIFFE ID rules (spiffe scheme, a lower-case trust
// domain, a path without empty, "." or ".." segments, no query, fragment, port or user).
func ParseSPIFFEID(s string) (*url.URL, error) {
	bad := func(why string) (*url.URL, error) {
		return nil, fmt.Errorf("pki: invalid SPIFFE ID %q: %s", s, why)
	}
	if len(s) > 2048 {
		return bad("longer than 2048 bytes")
	}
	rest, ok := strings.CutPrefix(s, "spiffe://")
	if !ok {
		return bad(`must start with "spiffe://"`)
	}
	td, path, _ := strings.Cut(rest, "/")
	if err := validateTrustDomain(td); err != nil {
		return bad(err.Error())
	}
	if path != "" || strings.HasSuffix(rest, "/") {
		for _, seg := range strings.Split(path, "/") {
			switch seg {
			case "":
				return bad("empty path segment")
			case ".", "..":
				return bad("path segment " + seg)
			}
			for _, r := range seg {
				if !isPathChar(r) {
					return bad(fmt.Sprintf("character %q in path", r))
				}
			}
		}
	}
	u := &url.URL{Scheme: "spiffe", Host: td}
	if path != "" {
		u.Path = "/" + path
	}
	return u, nil
}

func validateTrustDomain(td string) error {
	if td == "" {
		return errors.New("empty trust domain")
	}
	if len(td) > 255 {
		return errors.New("trust domain longer than 255 bytes")
	}
	for _, r := range td {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '.' || r == '-' || r == '_') {
			return fmt.Errorf("character %q in trust domain %q", r, td)
		}
	}
	return nil
}

func isPathChar(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' ||
		r == '.' || r == '-' || r == '_'
}

func newSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("pki: serial number: %w", err)
	}
	return n, nil
}

// SignCSR issues a workload certificate for spiffeID to the key in a PKCS#10 request,
// as a mesh CA service does: the requester keeps its private key. The request's own
// SANs are ignored; the caller decides the identity. It returns the certificate PEM.
func (c *CA) SignCSR(csrDER []byte, spiffeID string, validity time.Duration) ([]byte, time.Time, error) {
	csr, err := x509.ParseCertificateRequest(csrDER)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("pki: parse CSR: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, time.Time{}, fmt.Errorf("pki: CSR signature: %w", err)
	}
	id, err := ParseSPIFFEID(spiffeID)
	if err != nil {
		return nil, time.Time{}, err
	}
	if id.Host != c.TrustDomain {
		return nil, time.Time{}, fmt.Errorf("pki: %q is outside trust domain %q", spiffeID, c.TrustDomain)
	}
	return c.sign(&x509.Certificate{
		Subject:     pkix.Name{Organization: []string{c.TrustDomain}},
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:        []*url.URL{id},
	}, csr.PublicKey, validity)
}

// IssueServer signs a TLS server certificate for DNS names and IP addresses, for a
// control-plane endpoint (Istio's CA serves under the same root it signs with).
func (c *CA) IssueServer(dnsNames []string, ips []net.IP, validity time.Duration) (*Leaf, error) {
	return c.IssueNamed(pkix.Name{Organization: []string{c.TrustDomain}}, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, dnsNames, ips, validity)
}

// sign fills serial and validity into tmpl and signs pub with the CA key.
func (c *CA) sign(tmpl *x509.Certificate, pub any, validity time.Duration) ([]byte, time.Time, error) {
	if validity <= 0 {
		validity = DefaultLeafValidity
	}
	serial, err := newSerial()
	if err != nil {
		return nil, time.Time{}, err
	}
	now := time.Now()
	notAfter := now.Add(validity)
	if notAfter.After(c.cert.NotAfter) {
		notAfter = c.cert.NotAfter
	}
	// Certificates keep whole seconds; return what the certificate says.
	notAfter = notAfter.UTC().Truncate(time.Second)
	tmpl.SerialNumber, tmpl.NotBefore, tmpl.NotAfter = serial, now.Add(-clockSkew), notAfter
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, pub, c.key)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("pki: sign: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), notAfter, nil
}

// IssueNamed signs a certificate whose identity is its subject, as Kubernetes reads it
// (common name the user, organizations the groups), for the given uses, names and
// addresses: the certificates of a cluster's own components.
func (c *CA) IssueNamed(subject pkix.Name, usages []x509.ExtKeyUsage, dnsNames []string, ips []net.IP, validity time.Duration) (*Leaf, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: generate key: %w", err)
	}
	certPEM, notAfter, err := c.sign(&x509.Certificate{
		Subject:     subject,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: usages,
		DNSNames:    dnsNames,
		IPAddresses: ips,
	}, &key.PublicKey, validity)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("pki: encode key: %w", err)
	}
	return &Leaf{CertPEM: certPEM, KeyPEM: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), NotAfter: notAfter}, nil
}
