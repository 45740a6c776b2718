package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"strings"
	"testing"
	"time"
)

func TestLoadCARoundTripsAndRefusesAForeignKey(t *testing.T) {
	ca, err := NewCA("cluster.local", 0)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := ca.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	loaded, err := LoadCA(ca.CertPEM(), keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	if loaded.TrustDomain != "cluster.local" {
		t.Errorf("trust domain %q", loaded.TrustDomain)
	}
	// What the loaded CA signs, the original verifies.
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, notAfter, err := loaded.SignPublicKey(&key.PublicKey, []string{"a.b.serviceaccount.identity.linkerd.cluster.local"}, "spiffe://cluster.local/ns/b/sa/a", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: ca.Pool(), DNSName: "a.b.serviceaccount.identity.linkerd.cluster.local"}); err != nil {
		t.Error(err)
	}
	if !leaf.NotAfter.Equal(notAfter) || len(leaf.URIs) != 1 || leaf.URIs[0].String() != "spiffe://cluster.local/ns/b/sa/a" {
		t.Errorf("NotAfter %v (returned %v), URIs %v", leaf.NotAfter, notAfter, leaf.URIs)
	}

	other, _ := NewCA("cluster.local", 0)
	otherKey, _ := other.KeyPEM()
	if _, err := LoadCA(ca.CertPEM(), otherKey); err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Errorf("foreign key: %v", err)
	}
	if _, _, err := loaded.SignPublicKey(&key.PublicKey, nil, "spiffe://elsewhere/ns/b/sa/a", 0); err == nil {
		t.Error("signed an identity outside the trust domain")
	}
}
