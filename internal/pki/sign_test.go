package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"net"
	"net/url"
	"testing"
	"time"
)

// TestSignCSR: the certificate carries the identity the CA chose (not the one the
// request asked for), the requester's key, and chains to the root.
func TestSignCSR(t *testing.T) {
	ca, err := NewCA("cluster.local", 0)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	asked, _ := url.Parse("spiffe://cluster.local/ns/x/sa/admin")
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{URIs: []*url.URL{asked}}, key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, notAfter, err := ca.SignCSR(csr, "spiffe://cluster.local/ns/x/sa/app", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(certPEM)
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if id, err := ca.PeerID([]*x509.Certificate{cert}); err != nil || id != "spiffe://cluster.local/ns/x/sa/app" {
		t.Errorf("identity %q (%v)", id, err)
	}
	if !cert.PublicKey.(*ecdsa.PublicKey).Equal(&key.PublicKey) {
		t.Error("certificate is not for the requester's key")
	}
	if !cert.NotAfter.Equal(notAfter) || time.Until(notAfter) > time.Hour {
		t.Errorf("not after %v (returned %v)", cert.NotAfter, notAfter)
	}
	csr[len(csr)-1] ^= 1
	if _, _, err := ca.SignCSR(csr, "spiffe://cluster.local/ns/x/sa/app", 0); err == nil {
		t.Error("signed a CSR whose signature does not verify")
	}
}

func TestIssueServer(t *testing.T) {
	ca, err := NewCA("cluster.local", 0)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.IssueServer([]string{"istiod.istio-system.svc"}, []net.IP{net.ParseIP("198.18.1.1")}, 0)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := leaf.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(tc.Certificate[0])
	for _, host := range []string{"istiod.istio-system.svc", "198.18.1.1"} {
		if _, err := cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), DNSName: host}); err != nil {
			t.Errorf("%s: %v", host, err)
		}
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), DNSName: "evil.example"}); err == nil {
		t.Error("verifies for a name it does not carry")
	}
}
