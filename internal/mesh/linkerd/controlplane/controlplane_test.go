package controlplane

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pbdest "github.com/linkerd/linkerd2-proxy-api/go/destination"
	pbidentity "github.com/linkerd/linkerd2-proxy-api/go/identity"
	pbinbound "github.com/linkerd/linkerd2-proxy-api/go/inbound"
	pboutbound "github.com/linkerd/linkerd2-proxy-api/go/outbound"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/meshmark/meshmark/internal/pki"
)

// These tests run the control plane's real gRPC servers on loopback and talk to them
// over TLS the way linkerd2-proxy does (server names checked against the mesh CA);
// the proxy itself is exercised in package linkerd.

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

type running struct {
	cfg      *Config
	ca       *pki.CA
	tokenKey []byte
}

func start(t *testing.T, mutate func(*Config)) running {
	t.Helper()
	dir := t.TempDir()
	ca, err := pki.NewCA("cluster.local", 0)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := ca.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	tokenKey := []byte("0123456789abcdef0123456789abcdef")
	files := map[string][]byte{"ca.pem": ca.CertPEM(), "ca-key.pem": keyPEM, "token": tokenKey}
	for n, b := range files {
		if err := os.WriteFile(filepath.Join(dir, n), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	id := func(sa string) string { return IdentityName(sa, "bookinfo", "cluster.local") }
	cfg := &Config{
		Namespace: "bookinfo", TrustDomain: "cluster.local",
		IdentityAddr: freeAddr(t), DestinationAddr: freeAddr(t), PolicyAddr: freeAddr(t),
		CACert: filepath.Join(dir, "ca.pem"), CAKey: filepath.Join(dir, "ca-key.pem"), TokenKey: filepath.Join(dir, "token"),
		CertValidity: Duration{time.Hour},
		Services: []Service{
			{Name: "productpage", VIP: "198.19.128.1", Port: 9080, Versions: []Version{{Name: "v1", Weight: 100, Endpoints: []Endpoint{{Pod: "productpage-v1-0", IP: "198.18.1.2", Port: 9080, Identity: id("productpage")}}}}},
			{Name: "reviews", VIP: "198.19.128.2", Port: 9080, Versions: []Version{
				{Name: "v1", Weight: 20, Endpoints: []Endpoint{{Pod: "reviews-v1-0", IP: "198.18.1.3", Port: 9080, Identity: id("reviews")}}},
				{Name: "v2", Weight: 80, Endpoints: []Endpoint{{Pod: "reviews-v2-0", IP: "198.18.1.4", Port: 9080, Identity: id("reviews")}}},
				{Name: "v3", Weight: 0, Endpoints: []Endpoint{{Pod: "reviews-v3-0", IP: "198.18.1.5", Port: 9080}}},
			}},
		},
		Workloads: []Workload{{Pod: "productpage-v1-0", Identity: id("productpage")}, {Pod: "reviews-v1-0", Identity: id("reviews")}},
	}
	if mutate != nil {
		mutate(cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	srv, err := Listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return running{cfg: cfg, ca: ca, tokenKey: tokenKey}
}

// dial connects as a proxy would: TLS verifying the component's Linkerd name.
func (r running) dial(t *testing.T, addr, account string) *grpc.ClientConn {
	t.Helper()
	conf := &tls.Config{RootCAs: r.ca.Pool(), ServerName: IdentityName(account, ControlNamespace, "cluster.local"), MinVersion: tls.VersionTLS12}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(conf)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func csrFor(t *testing.T, name string) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{DNSNames: []string{name}}, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func TestCertifySignsOnlyAuthenticatedKnownIdentities(t *testing.T) {
	r := start(t, nil)
	client := pbidentity.NewIdentityClient(r.dial(t, r.cfg.IdentityAddr, IdentityAccount))
	ctx := context.Background()
	id := IdentityName("reviews", "bookinfo", "cluster.local")

	resp, err := client.Certify(ctx, &pbidentity.CertifyRequest{Identity: id, Token: Token(r.tokenKey, id), CertificateSigningRequest: csrFor(t, id)})
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(resp.GetLeafCertificate())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: r.ca.Pool(), DNSName: id, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("issued certificate does not verify for %s: %v", id, err)
	}
	if life := time.Until(leaf.NotAfter); life > time.Hour || life < 59*time.Minute {
		t.Errorf("certificate lives %v, want the configured hour", life)
	}
	if !resp.GetValidUntil().AsTime().Equal(leaf.NotAfter) {
		t.Errorf("valid_until %v, certificate NotAfter %v", resp.GetValidUntil().AsTime(), leaf.NotAfter)
	}

	other := IdentityName("productpage", "bookinfo", "cluster.local")
	for name, req := range map[string]*pbidentity.CertifyRequest{
		"wrong token":       {Identity: id, Token: Token(r.tokenKey, other), CertificateSigningRequest: csrFor(t, id)},
		"CSR for another":   {Identity: id, Token: Token(r.tokenKey, id), CertificateSigningRequest: csrFor(t, other)},
		"unknown workload":  {Identity: IdentityName("ratings", "bookinfo", "cluster.local"), Token: Token(r.tokenKey, IdentityName("ratings", "bookinfo", "cluster.local")), CertificateSigningRequest: csrFor(t, IdentityName("ratings", "bookinfo", "cluster.local"))},
		"CSR not parseable": {Identity: id, Token: Token(r.tokenKey, id), CertificateSigningRequest: []byte("x")},
	} {
		if _, err := client.Certify(ctx, req); err == nil {
			t.Errorf("%s: certified", name)
		}
	}
}

func TestDestinationServesEndpointsIdentitiesAndTheSplit(t *testing.T) {
	r := start(t, nil)
	client := pbdest.NewDestinationClient(r.dial(t, r.cfg.DestinationAddr, DestinationAccount))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	prof, err := client.GetProfile(ctx, &pbdest.GetDestination{Path: "198.19.128.2:9080"})
	if err != nil {
		t.Fatal(err)
	}
	p, err := prof.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if p.GetFullyQualifiedName() != "reviews.bookinfo.svc.cluster.local" {
		t.Errorf("fully_qualified_name %q", p.GetFullyQualifiedName())
	}
	var split []string
	for _, o := range p.GetDstOverrides() {
		split = append(split, fmt.Sprintf("%s=%d", o.GetAuthority(), o.GetWeight()))
	}
	if got := strings.Join(split, " "); got != "reviews-v1.bookinfo.svc.cluster.local:9080=20 reviews-v2.bookinfo.svc.cluster.local:9080=80" {
		t.Errorf("dst_overrides %s, want v1 20 and v2 80 (v3 has weight 0)", got)
	}

	get, err := client.Get(ctx, &pbdest.GetDestination{Path: "reviews-v2.bookinfo.svc.cluster.local:9080"})
	if err != nil {
		t.Fatal(err)
	}
	up, err := get.Recv()
	if err != nil {
		t.Fatal(err)
	}
	addrs := up.GetAdd().GetAddrs()
	if len(addrs) != 1 || addrs[0].GetAddr().GetPort() != 9080 || addrs[0].GetAddr().GetIp().GetIpv4() != 198<<24|18<<16|1<<8|4 {
		t.Fatalf("reviews-v2 endpoints %v", addrs)
	}
	if got := addrs[0].GetTlsIdentity().GetDnsLikeIdentity().GetName(); got != IdentityName("reviews", "bookinfo", "cluster.local") {
		t.Errorf("endpoint identity %q", got)
	}
	if addrs[0].GetProtocolHint().GetH2() == nil {
		t.Error("a meshed endpoint lacks the HTTP/2 protocol hint")
	}

	// An unmeshed endpoint gets no identity, so proxies do not try mTLS to it.
	v3, err := client.Get(ctx, &pbdest.GetDestination{Path: "reviews-v3.bookinfo.svc.cluster.local:9080"})
	if err != nil {
		t.Fatal(err)
	}
	if up, err := v3.Recv(); err != nil || up.GetAdd().GetAddrs()[0].GetTlsIdentity() != nil {
		t.Errorf("unmeshed endpoint: %v, %v", up, err)
	}

	// A name that is not a service is an error, not an empty set.
	bad, err := client.Get(ctx, &pbdest.GetDestination{Path: "nope.bookinfo.svc.cluster.local:9080"})
	if err == nil {
		_, err = bad.Recv()
	}
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("unknown service: %v", err)
	}
}

func TestPolicyDefaultsStrictAndAuthz(t *testing.T) {
	for _, c := range []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"default", nil, "all-unauthenticated"},
		{"strict", func(c *Config) { c.Strict = true }, "all-authenticated"},
		{"authz", func(c *Config) { c.Authz = []string{IdentityName("productpage", "bookinfo", "cluster.local")} }, "meshmark-authz"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := start(t, c.mutate)
			cc := r.dial(t, r.cfg.PolicyAddr, DestinationAccount)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			srv, err := pbinbound.NewInboundServerPoliciesClient(cc).GetPort(ctx, &pbinbound.PortSpec{Workload: `{"ns":"bookinfo","pod":"reviews-v1-0"}`, Port: 9080})
			if err != nil {
				t.Fatal(err)
			}
			if srv.GetProtocol().GetDetect().GetTimeout() == nil || srv.GetLabels()["name"] != c.want || len(srv.GetAuthorizations()) != 1 {
				t.Fatalf("server policy %v", srv)
			}
			authn := srv.GetAuthorizations()[0].GetAuthentication()
			switch c.name {
			case "default":
				if authn.GetUnauthenticated() == nil {
					t.Errorf("default policy does not admit unauthenticated clients: %v", authn)
				}
			case "strict":
				if s := authn.GetMeshTLS().GetIdentities().GetSuffixes(); len(s) != 1 || len(s[0].GetParts()) != 0 {
					t.Errorf("strict policy is not any-mesh-identity: %v", authn)
				}
			case "authz":
				if ids := authn.GetMeshTLS().GetIdentities().GetIdentities(); len(ids) != 1 || ids[0].GetName() != r.cfg.Authz[0] {
					t.Errorf("authz policy admits %v", ids)
				}
			}
			// Outbound: a service address gets its routes, anything else NotFound.
			ob := pboutbound.NewOutboundPoliciesClient(cc)
			if _, err = ob.Get(ctx, &pboutbound.TrafficSpec{Target: &pboutbound.TrafficSpec_Addr{Addr: tcpAddr("198.18.1.3", 9080)}}); status.Code(err) != codes.NotFound {
				t.Errorf("outbound policy for a pod address: %v, want NotFound", err)
			}
			pol, err := ob.Get(ctx, &pboutbound.TrafficSpec{Target: &pboutbound.TrafficSpec_Addr{Addr: tcpAddr("198.19.128.2", 9080)}})
			if err != nil {
				t.Fatal(err)
			}
			det := pol.GetProtocol().GetDetect()
			if det.GetTimeout() == nil || det.GetOpaque() == nil || det.GetHttp2() == nil || pol.GetMetadata().GetResource().GetName() != "reviews" {
				t.Fatalf("outbound policy %v", pol)
			}
			var split []string
			for _, wb := range det.GetHttp1().GetRoutes()[0].GetRules()[0].GetBackends().GetRandomAvailable().GetBackends() {
				be := wb.GetBackend().GetBackend()
				split = append(split, fmt.Sprintf("%s=%d", be.GetBalancer().GetDiscovery().GetDst().GetPath(), wb.GetWeight()))
				if be.GetQueue().GetCapacity() == 0 || be.GetBalancer().GetPeakEwma() == nil {
					t.Errorf("backend without queue or balancer: %v", be)
				}
			}
			if got := strings.Join(split, " "); got != "reviews-v1.bookinfo.svc.cluster.local:9080=20 reviews-v2.bookinfo.svc.cluster.local:9080=80" {
				t.Errorf("outbound split %s", got)
			}
		})
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "cp.json")
	if err := os.WriteFile(path, []byte(`{"namespace":"x","trust_domain":"cluster.local","identity_addr":"nope","destination_addr":"127.0.0.1:1","policy_addr":"127.0.0.1:2","ca_cert":"a","ca_key":"b","token_key":"c","services":[{"name":"s","vip":"1.2.3","port":1}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := LoadConfig(path)
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "identity_addr") || !strings.Contains(err.Error(), "service s: vip") {
		t.Errorf("got %v", err)
	}
	if err := os.WriteFile(path, []byte(`{"namespace":"x","extra":1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadConfig(path); err == nil || !strings.Contains(err.Error(), `unknown field "extra"`) {
		t.Errorf("unknown field: %v", err)
	}
}
