package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"time"
)

// Some meshes keep their root offline and sign workloads with an intermediate that the
// control plane holds: Linkerd's identity controller is given an issuer certificate
// for identity.linkerd.<trust domain> signed by a trust anchor, as `step certificate
// create ... --profile root-ca` and `--profile intermediate-ca` make them in Linkerd's
// docs.

// NewTrustAnchor creates a self-signed P-256 root named commonName that may sign one
// level of intermediate CAs (NewCA's roots sign workloads directly and may not).
func NewTrustAnchor(trustDomain, commonName string, validity time.Duration) (*CA, error) {
	if err := validateTrustDomain(trustDomain); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: generate trust anchor key: %w", err)
	}
	tmpl := caTemplate(commonName, validity, 1)
	return newCA(trustDomain, tmpl, tmpl, key, key)
}

// NewIntermediate creates a P-256 CA named commonName (as subject and DNS SAN, which is
// how Linkerd checks its issuer), signed by c, that signs workloads only.
func (c *CA) NewIntermediate(commonName string, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: generate intermediate key: %w", err)
	}
	tmpl := caTemplate(commonName, validity, 0)
	tmpl.DNSNames = []string{commonName}
	if tmpl.NotAfter.After(c.cert.NotAfter) {
		tmpl.NotAfter = c.cert.NotAfter
	}
	return newCA(c.TrustDomain, tmpl, c.cert, key, c.key)
}

func caTemplate(commonName string, validity time.Duration, maxPathLen int) *x509.Certificate {
	if validity <= 0 {
		validity = DefaultCAValidity
	}
	now := time.Now()
	return &x509.Certificate{
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            maxPathLen,
		MaxPathLenZero:        maxPathLen == 0,
	}
}

func newCA(trustDomain string, tmpl, parent *x509.Certificate, key, parentKey *ecdsa.PrivateKey) (*CA, error) {
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl.SerialNumber = serial
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		return nil, fmt.Errorf("pki: sign %s: %w", tmpl.Subject.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("pki: parse %s: %w", tmpl.Subject.CommonName, err)
	}
	return &CA{TrustDomain: trustDomain, cert: cert, key: key,
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}
