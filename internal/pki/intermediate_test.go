package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"encoding/pem"
	"testing"
	"time"
)

// A trust anchor signs an issuer, and the issuer signs a workload that verifies up to
// the anchor alone: Linkerd's chain. The anchor may not be skipped (the issuer cannot
// sign another CA), and the issuer's name is a DNS name its certificate verifies for.
func TestTrustAnchorIssuerChain(t *testing.T) {
	root, err := NewTrustAnchor("cluster.local", "root.linkerd.cluster.local", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	issuer, err := root.NewIntermediate("identity.linkerd.cluster.local", 2*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ic := issuer.Certificate()
	if !ic.IsCA || ic.MaxPathLen != 0 || !ic.MaxPathLenZero || ic.Subject.CommonName != "identity.linkerd.cluster.local" ||
		ic.KeyUsage&x509.KeyUsageCertSign == 0 || ic.NotAfter.After(root.Certificate().NotAfter) {
		t.Errorf("issuer: CA %v pathlen %d/%v CN %q usage %v, not after %v (root %v)", ic.IsCA, ic.MaxPathLen, ic.MaxPathLenZero,
			ic.Subject.CommonName, ic.KeyUsage, ic.NotAfter, root.Certificate().NotAfter)
	}
	if pub, ok := ic.PublicKey.(*ecdsa.PublicKey); !ok || pub.Curve != elliptic.P256() {
		t.Errorf("issuer key %T: Linkerd wants ECDSA P-256", ic.PublicKey)
	}
	if _, err := ic.Verify(x509.VerifyOptions{Roots: root.Pool(), DNSName: "identity.linkerd.cluster.local"}); err != nil {
		t.Errorf("issuer does not verify as identity.linkerd.cluster.local under the anchor: %v", err)
	}
	leaf, err := issuer.Issue("spiffe://cluster.local/ns/a/sa/b", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(leaf.CertPEM)
	lc, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := root.PeerID([]*x509.Certificate{lc, ic}); err != nil {
		t.Errorf("workload signed by the issuer does not verify up to the anchor: %v", err)
	}
	if _, err := root.PeerID([]*x509.Certificate{lc}); err == nil {
		t.Error("workload verified without its issuer")
	}
	sub, err := issuer.NewIntermediate("deeper", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	deep, err := sub.Issue("spiffe://cluster.local/ns/a/sa/c", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	b, _ = pem.Decode(deep.CertPEM)
	dc, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := root.PeerID([]*x509.Certificate{dc, sub.Certificate(), ic}); err == nil {
		t.Error("a workload under a CA the issuer signed verified: the issuer must sign workloads only")
	}
	if _, err := NewTrustAnchor("Not Valid", "x", 0); err == nil {
		t.Error("bad trust domain accepted")
	}
}
