package pki

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

// handshake runs a real mutual-TLS handshake over loopback: the server requires a client
// certificate from roots, the client trusts roots for the server. It returns the SPIFFE
// ID the server saw from the client, or the handshake error.
func handshake(t *testing.T, server, client *Leaf, serverRoots, clientRoots *x509.CertPool) (string, error) {
	t.Helper()
	srvCert, err := server.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	cliCert, err := client.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{srvCert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    serverRoots,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type result struct {
		id  string
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- result{err: err}
			return
		}
		defer c.Close()
		tc := c.(*tls.Conn)
		if err := tc.Handshake(); err != nil {
			done <- result{err: err}
			return
		}
		peers := tc.ConnectionState().PeerCertificates
		id := ""
		if len(peers) > 0 && len(peers[0].URIs) > 0 {
			id = peers[0].URIs[0].String()
		}
		_, _ = tc.Write([]byte("ok"))
		done <- result{id: id}
	}()
	conn, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{
		Certificates: []tls.Certificate{cliCert},
		RootCAs:      clientRoots,
		// SPIFFE peers are verified by URI SAN, not by host name.
		InsecureSkipVerify: true,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			cert, err := x509.ParseCertificate(raw[0])
			if err != nil {
				return err
			}
			_, err = cert.Verify(x509.VerifyOptions{Roots: clientRoots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
			return err
		},
	})
	if err == nil {
		_, err = io.ReadAll(conn)
		conn.Close()
	}
	r := <-done
	if r.err != nil {
		return "", r.err
	}
	return r.id, err
}

func TestMutualTLSWithIssuedCertificates(t *testing.T) {
	ca, err := NewCA("cluster.local", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ca.Issue("spiffe://cluster.local/ns/default/sa/reviews", 0)
	if err != nil {
		t.Fatal(err)
	}
	cli, err := ca.Issue("spiffe://cluster.local/ns/default/sa/productpage", 0)
	if err != nil {
		t.Fatal(err)
	}
	id, err := handshake(t, srv, cli, ca.Pool(), ca.Pool())
	if err != nil {
		t.Fatalf("handshake between two leaves of one CA: %v", err)
	}
	if id != "spiffe://cluster.local/ns/default/sa/productpage" {
		t.Fatalf("server saw client identity %q", id)
	}
	if srv.NotAfter.After(ca.Certificate().NotAfter) {
		t.Fatalf("leaf outlives its CA: %v > %v", srv.NotAfter, ca.Certificate().NotAfter)
	}
}

func TestForeignCAIsRejected(t *testing.T) {
	ours, _ := NewCA("cluster.local", time.Hour)
	theirs, _ := NewCA("cluster.local", time.Hour)
	srv, _ := ours.Issue("spiffe://cluster.local/ns/default/sa/reviews", 0)
	intruder, _ := theirs.Issue("spiffe://cluster.local/ns/default/sa/productpage", 0)
	if _, err := handshake(t, srv, intruder, ours.Pool(), ours.Pool()); err == nil {
		t.Fatal("server accepted a client certificate from another CA")
	}
	// And the identity check on an issued chain.
	cert, err := x509.ParseCertificate(pemDER(t, intruder.CertPEM))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ours.PeerID([]*x509.Certificate{cert}); err == nil {
		t.Fatal("PeerID accepted a foreign certificate")
	}
	good, _ := x509.ParseCertificate(pemDER(t, srv.CertPEM))
	if id, err := ours.PeerID([]*x509.Certificate{good}); err != nil || id != srv.ID {
		t.Fatalf("PeerID(own leaf) = %q, %v", id, err)
	}
}

func TestIssueRefusesOtherTrustDomainAndBadIDs(t *testing.T) {
	ca, _ := NewCA("cluster.local", time.Hour)
	for _, id := range []string{
		"spiffe://example.org/ns/a/sa/b",
		"https://cluster.local/ns/a/sa/b",
		"spiffe://cluster.local/ns//sa/b",
		"spiffe://cluster.local/ns/../sa/b",
		"spiffe://Cluster.local/ns/a",
		"spiffe://cluster.local/ns/a?x=1",
	} {
		if _, err := ca.Issue(id, 0); err == nil {
			t.Errorf("Issue(%q) succeeded", id)
		} else if !strings.Contains(err.Error(), id) {
			t.Errorf("Issue(%q) error does not name the ID: %v", id, err)
		}
	}
}

func TestNewCARejectsBadTrustDomain(t *testing.T) {
	for _, td := range []string{"", "Cluster.local", "a/b", "a:80"} {
		if _, err := NewCA(td, 0); err == nil {
			t.Errorf("NewCA(%q) succeeded", td)
		}
	}
}

func FuzzParseSPIFFEID(f *testing.F) {
	for _, s := range []string{"spiffe://cluster.local/ns/default/sa/reviews", "spiffe://td", "spiffe://td/", "spiffe:///x", "spiffe://a/b/./c", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := ParseSPIFFEID(s)
		if err != nil {
			if !strings.Contains(err.Error(), "invalid SPIFFE ID") {
				t.Fatalf("error without context: %v", err)
			}
			return
		}
		// Every accepted ID must survive a round trip unchanged: what we put in a SAN
		// is exactly what the peer will compare.
		if u.String() != s {
			t.Fatalf("ParseSPIFFEID(%q).String() = %q", s, u.String())
		}
	})
}

func pemDER(t *testing.T, p []byte) []byte {
	t.Helper()
	b, _ := pem.Decode(p)
	if b == nil || b.Type != "CERTIFICATE" {
		t.Fatal(errors.New("no certificate PEM"))
	}
	return b.Bytes
}
