package ambient

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/pki"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	securityapi "istio.io/api/security/v1alpha1"
)

// csrFor makes a PKCS#10 request the way ztunnel does (SAN = the identity).
func csrFor(t *testing.T, id string) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(id)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{URIs: []*url.URL{u}}, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
}

func request(t *testing.T, id string) *securityapi.IstioCertificateRequest {
	md, err := structpb.NewStruct(map[string]any{impersonationKey: id})
	if err != nil {
		t.Fatal(err)
	}
	return &securityapi.IstioCertificateRequest{Csr: csrFor(t, id), ValidityDuration: 3600, Metadata: md}
}

// startControlPlane runs the real control plane on a loopback port with the token
// "s3cret" and the identities given (policyFile may be empty), until the test ends, and
// returns a gRPC connection to it that trusts its root, as ztunnel's does.
func startControlPlane(t *testing.T, dir string, identities []string, policyFile string) *grpc.ClientConn {
	t.Helper()
	tok := filepath.Join(dir, "token")
	if err := os.WriteFile(tok, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- ServeControlPlane(ctx, ControlPlaneConfig{Dir: dir, TrustDomain: "cluster.local", Listen: addr,
			Hostnames: []string{caHostname}, TokenFile: tok, Identities: identities, PolicyFile: policyFile})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	var root []byte
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if root, err = os.ReadFile(filepath.Join(dir, RootCertFile)); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(root)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: caHostname})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestControlPlaneServesCertificates runs the real control plane (gRPC over TLS on
// loopback) and calls it as ztunnel does: bearer token, impersonated identity.
func TestControlPlaneServesCertificates(t *testing.T) {
	dir := t.TempDir()
	allowed := "spiffe://cluster.local/ns/bookinfo/sa/reviews"
	conn := startControlPlane(t, dir, []string{allowed}, "")
	client := securityapi.NewIstioCertificateServiceClient(conn)
	withToken := func(tok string) context.Context {
		return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+tok, "clusterid", "Kubernetes")
	}

	resp, err := client.CreateCertificate(withToken("s3cret"), request(t, allowed))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.CertChain) != 2 {
		t.Fatalf("chain of %d, want leaf and root", len(resp.CertChain))
	}
	block, _ := pem.Decode([]byte(resp.CertChain[0]))
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != allowed {
		t.Errorf("leaf identity %v, want %s", leaf.URIs, allowed)
	}
	root, _ := os.ReadFile(filepath.Join(dir, RootCertFile))
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(root)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Errorf("leaf does not chain to the root: %v", err)
	}
	if d := time.Until(leaf.NotAfter); d > time.Hour+time.Minute || d < 50*time.Minute {
		t.Errorf("leaf valid for %v, asked for 1h", d)
	}
	issued, _ := os.ReadFile(filepath.Join(dir, IssuedFile))
	if strings.TrimSpace(string(issued)) != allowed {
		t.Errorf("issue log %q", issued)
	}

	for _, tc := range []struct {
		name string
		ctx  context.Context
		req  *securityapi.IstioCertificateRequest
		code codes.Code
	}{
		{"wrong token", withToken("guess"), request(t, allowed), codes.Unauthenticated},
		{"no token", context.Background(), request(t, allowed), codes.Unauthenticated},
		{"identity not enrolled", withToken("s3cret"), request(t, "spiffe://cluster.local/ns/bookinfo/sa/intruder"), codes.PermissionDenied},
		{"no identity", withToken("s3cret"), &securityapi.IstioCertificateRequest{Csr: csrFor(t, allowed)}, codes.InvalidArgument},
		{"garbage CSR", withToken("s3cret"), func() *securityapi.IstioCertificateRequest { r := request(t, allowed); r.Csr = "nope"; return r }(), codes.InvalidArgument},
	} {
		_, err := client.CreateCertificate(tc.ctx, tc.req)
		if status.Code(err) != tc.code {
			t.Errorf("%s: got %v, want %s", tc.name, err, tc.code)
		}
	}
}

func TestSignCSRRejectsForeignTrustDomain(t *testing.T) {
	ca, err := pki.NewCA("cluster.local", 0)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode([]byte(csrFor(t, "spiffe://other.domain/ns/a/sa/b")))
	if _, _, err := ca.SignCSR(block.Bytes, "spiffe://other.domain/ns/a/sa/b", 0); err == nil {
		t.Error("signed an identity outside the trust domain")
	}
}
