package pki

import (
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"time"
)

// The functions here serve meshes whose identities are DNS-like names rather than (or
// beside) SPIFFE URIs, and control planes that run in a process of their own: Linkerd's
// proxies send a CSR for "<sa>.<ns>.serviceaccount.identity.linkerd.<trust domain>" to
// an identity controller that holds the CA key.

// KeyPEM is the CA's PKCS#8 private key, for handing the CA to a control-plane process
// through a file only that process reads. Never store it with results.
func (c *CA) KeyPEM() ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(c.key)
	if err != nil {
		return nil, fmt.Errorf("pki: encode CA key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// LoadCA rebuilds a CA from CertPEM and KeyPEM; the trust domain is the root's SPIFFE
// URI SAN.
func LoadCA(certPEM, keyPEM []byte) (*CA, error) {
	cb, _ := pem.Decode(certPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, errors.New("pki: CA certificate: no PEM CERTIFICATE block")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("pki: CA certificate: %w", err)
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return nil, errors.New("pki: CA key: no PEM block")
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("pki: CA key: %w", err)
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok || !key.PublicKey.Equal(cert.PublicKey) {
		return nil, errors.New("pki: CA key does not match the CA certificate")
	}
	td := ""
	for _, u := range cert.URIs {
		if u.Scheme == "spiffe" {
			td = u.Host
		}
	}
	if td == "" {
		return nil, errors.New("pki: CA certificate carries no SPIFFE trust domain")
	}
	return &CA{TrustDomain: td, cert: cert, key: key, certPEM: append([]byte(nil), certPEM...)}, nil
}

// SignPublicKey issues a client-and-server certificate for pub naming dnsNames (DNS
// SANs) and, when spiffeID is set, that SPIFFE ID (URI SAN). It returns the DER leaf.
// validity <= 0 means DefaultLeafValidity; it never outlives the CA.
func (c *CA) SignPublicKey(pub any, dnsNames []string, spiffeID string, validity time.Duration) ([]byte, time.Time, error) {
	if len(dnsNames) == 0 && spiffeID == "" {
		return nil, time.Time{}, errors.New("pki: a certificate needs at least one name")
	}
	var uris []*url.URL
	if spiffeID != "" {
		id, err := ParseSPIFFEID(spiffeID)
		if err != nil {
			return nil, time.Time{}, err
		}
		if id.Host != c.TrustDomain {
			return nil, time.Time{}, fmt.Errorf("pki: %q is outside trust domain %q", spiffeID, c.TrustDomain)
		}
		uris = []*url.URL{id}
	}
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
	// Certificates carry whole seconds; what is returned must be what is signed.
	notAfter = notAfter.Truncate(time.Second)
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{Organization: []string{c.TrustDomain}},
		NotBefore:    now.Add(-clockSkew),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:     dnsNames,
		URIs:         uris,
	}
	if len(dnsNames) > 0 {
		tmpl.Subject.CommonName = dnsNames[0]
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, pub, c.key)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("pki: sign %v: %w", dnsNames, err)
	}
	return der, notAfter, nil
}

// SignCSRForDNS checks a DER certificate signing request's signature and that it asks for
// exactly the DNS name want (nothing else), then signs it as SignPublicKey would.
func (c *CA) SignCSRForDNS(csrDER []byte, want, spiffeID string, validity time.Duration) ([]byte, time.Time, error) {
	csr, err := x509.ParseCertificateRequest(csrDER)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("pki: CSR: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, time.Time{}, fmt.Errorf("pki: CSR signature: %w", err)
	}
	if len(csr.DNSNames) != 1 || csr.DNSNames[0] != want || len(csr.URIs) > 0 || len(csr.IPAddresses) > 0 || len(csr.EmailAddresses) > 0 {
		return nil, time.Time{}, fmt.Errorf("pki: CSR asks for DNS %v URIs %v, want exactly %s", csr.DNSNames, csr.URIs, want)
	}
	return c.SignPublicKey(csr.PublicKey, []string{want}, spiffeID, validity)
}
