package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/meshmark/meshmark/internal/load"
	"github.com/meshmark/meshmark/internal/pki"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func TestLoadCommandBadInputExitsTwo(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer srv.Close()
	for _, args := range [][]string{
		{"load"},
		{"load", "http://8.8.8.8/"},
		{"load", "http://example.com/"},
		{"load", "ftp://127.0.0.1/"},
		{"load", srv.URL, "--rate", "abc"},
		{"load", srv.URL, "--rate", "10", "--poisson", "10"},
		{"load", srv.URL, "--steps", "1:2:3"},
		{"load", srv.URL, "--ramp", "x:1"},
		{"load", srv.URL, "--format", "xml"},
		{"load", srv.URL, "-H", "no colon"},
		{"load", srv.URL, "--users", "2", "--think", "5s-1s"},
		{"load", srv.URL, "--no-such-flag"},
		{"load", srv.URL, "--rate", "10", "--limit", "5"},
		{"load", srv.URL, "--protocol", "h3"},
		{"load", srv.URL, "--grpc-method", "/grpc.health.v1.Health/Check"},
		{"load", srv.URL, "--protocol", "h2c", "--grpc-method", "/a.B/C"},
		{"load", "https://127.0.0.1:8443/", "--protocol", "h2c"},
		{"load", srv.URL, "--protocol", "grpc", "--no-keepalive"},
		{"load", srv.URL, "--protocol", "grpc", "-m", "POST"},
		{"load", srv.URL, "--protocol", "grpc", "--grpc-method", "NoSlash"},
		{"load", srv.URL, "--protocol", "grpc", "--grpc-method", "/a.B/C/D"},
		{"load", srv.URL + "/a.B/C", "--protocol", "grpc"},
		{"load", srv.URL + "/?x=1", "--protocol", "grpc"},
		{"load", "http://127.0.0.1/", "--protocol", "grpc"},
		{"load", "https://127.0.0.1:8443/", "--protocol", "grpc"},
		{"load", "http://8.8.8.8:50051/", "--protocol", "grpc"},
		{"load", srv.URL, "--protocol", "grpc", "-H", "grpc-timeout: 1S"},
	} {
		if code := Main(args); code != 2 {
			t.Errorf("meshmark %v: exit code %d, want 2", args, code)
		}
	}
}

// TestLoadCommandProtocols runs h2c and gRPC from the command line against servers that
// only count what arrives over HTTP/2.
func TestLoadCommandProtocols(t *testing.T) {
	var h2 atomic.Int64
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	hs := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor == 2 {
			h2.Add(1)
		}
	}))
	hs.Config.Protocols = p
	hs.Start()
	defer hs.Close()
	res := loadJSON(t, hs.URL, "--protocol", "h2c", "-c", "2", "-n", "30")
	if res.Succeeded != 30 || h2.Load() != 30 {
		t.Errorf("h2c: ok %d, HTTP/2 requests served %d; want 30, 30", res.Succeeded, h2.Load())
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	gs := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		calls.Add(1)
		return h(ctx, req)
	}))
	hc := health.NewServer()
	hc.SetServingStatus("probe", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(gs, hc)
	go gs.Serve(ln)
	defer gs.Stop()
	target := "http://" + ln.Addr().String()
	res = loadJSON(t, target, "--protocol", "grpc", "-c", "2", "-n", "30")
	if res.Succeeded != 30 || res.StatusCodes[200] != 30 || calls.Load() != 30 || res.Target != target+load.HealthCheckMethod {
		t.Errorf("grpc health check: ok %d, codes %v, server calls %d, target %q; errors %v", res.Succeeded, res.StatusCodes, calls.Load(), res.Target, res.ErrorSamples)
	}
	// the request message from a file, sent as is: HealthCheckRequest{service: "probe"}
	body := filepath.Join(t.TempDir(), "req.bin")
	if err := os.WriteFile(body, []byte("\x0a\x05probe"), 0o644); err != nil {
		t.Fatal(err)
	}
	res = loadJSON(t, target+"/", "--protocol", "grpc", "--grpc-method", "grpc.health.v1.Health/Check", "--body-file", body, "-n", "5")
	if res.Succeeded != 5 {
		t.Errorf("grpc with a request message: ok %d, errors %v", res.Succeeded, res.ErrorSamples)
	}
	res = loadJSON(t, target, "--protocol", "grpc", "--body", "\x0a\x04nope", "-n", "5")
	if res.Errors.Non2xx != 5 || res.StatusCodes[404] != 5 {
		t.Errorf("grpc health check of an unknown service: errors %+v, codes %v", res.Errors, res.StatusCodes)
	}
}

func TestLoadCommandWritesJSON(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Probe") != "yes" {
			w.WriteHeader(http.StatusBadRequest)
		}
	}))
	defer srv.Close()
	out := filepath.Join(t.TempDir(), "run.json")
	if code := Main([]string{"load", srv.URL, "-c", "2", "-n", "40", "-H", "X-Probe: yes", "--format", "json", "-o", out}); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := load.ReadJSON(f)
	if err != nil {
		t.Fatal(err)
	}
	if res.Succeeded != 40 || res.Latency.TotalCount() != 40 {
		t.Fatalf("succeeded %d, latencies %d, errors %+v", res.Succeeded, res.Latency.TotalCount(), res.Errors)
	}
}

// loadJSON runs `meshmark load` with args and returns its result.
func loadJSON(t *testing.T, args ...string) *load.Result {
	t.Helper()
	out := filepath.Join(t.TempDir(), "run.json")
	if s, code, err := execResults(t, append(append([]string{"load"}, args...), "--format", "json", "-o", out)...); code != 0 {
		t.Fatalf("meshmark load %v: exit code %d, %v\n%s", args, code, err, s)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := load.ReadJSON(f)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func writeFile(t *testing.T, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func certPEM(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

func TestLoadCommandHTTPS(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer srv.Close()
	res := loadJSON(t, srv.URL, "-c", "1", "-n", "3")
	if res.Errors.Other != 3 || len(res.ErrorSamples) == 0 || !strings.Contains(res.ErrorSamples[0], "certificate") {
		t.Errorf("untrusted server: errors %+v %v, want 3 of kind other mentioning the certificate", res.Errors, res.ErrorSamples)
	}
	ca := writeFile(t, "ca.pem", certPEM(srv.Certificate()))
	for _, args := range [][]string{
		{"--cacert", ca},
		{"-k"},
		{"--cacert", ca, "--no-keepalive"},
		{"--cacert", ca, "--rate", "200", "-d", "500ms"},
		// httptest's certificate is for example.com as well as 127.0.0.1
		{"--cacert", ca, "--servername", "example.com"},
	} {
		res := loadJSON(t, append([]string{srv.URL, "-c", "2", "-n", "40"}, args...)...)
		if res.Succeeded == 0 || res.Succeeded != res.Completed || res.Errors.Total() != 0 {
			t.Errorf("%v: succeeded %d of %d, errors %+v %v", args, res.Succeeded, res.Completed, res.Errors, res.ErrorSamples)
		}
	}
	res = loadJSON(t, srv.URL, "-n", "2", "--cacert", ca, "--servername", "other.example")
	if res.Errors.Other != 2 {
		t.Errorf("--servername the certificate does not carry: errors %+v %v", res.Errors, res.ErrorSamples)
	}
}

// TestLoadCommandMTLS: a target that requires a client certificate refuses a client
// without one and serves one with --cert/--key (or --cert alone on a combined file).
func TestLoadCommandMTLS(t *testing.T) {
	ca, err := pki.NewCA("mtls.test", 0)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue("spiffe://mtls.test/meshmark", 0)
	if err != nil {
		t.Fatal(err)
	}
	var peers atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id, err := ca.PeerID(r.TLS.PeerCertificates); err == nil && id == leaf.ID {
			peers.Add(1)
		}
	}))
	srv.TLS = &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool()}
	srv.StartTLS()
	defer srv.Close()
	serverCA := writeFile(t, "server.pem", certPEM(srv.Certificate()))
	certFile := writeFile(t, "client.pem", leaf.CertPEM)
	keyFile := writeFile(t, "client.key", leaf.KeyPEM)
	both := writeFile(t, "both.pem", append(append([]byte(nil), leaf.CertPEM...), leaf.KeyPEM...))

	res := loadJSON(t, srv.URL, "-c", "1", "-n", "3", "--cacert", serverCA)
	if res.Succeeded != 0 || res.Errors.Total() != 3 || peers.Load() != 0 {
		t.Errorf("no client certificate: succeeded %d, errors %+v %v; want 3 failures", res.Succeeded, res.Errors, res.ErrorSamples)
	}
	for _, args := range [][]string{{"--cert", certFile, "--key", keyFile}, {"--cert", both}} {
		peers.Store(0)
		res := loadJSON(t, append([]string{srv.URL, "-c", "2", "-n", "20", "--cacert", serverCA}, args...)...)
		if res.Succeeded != 20 || peers.Load() != 20 {
			t.Errorf("%v: succeeded %d, server saw the client's identity %d times; want 20, 20; errors %+v %v",
				args, res.Succeeded, peers.Load(), res.Errors, res.ErrorSamples)
		}
	}
}

func TestLoadCommandBadTLSFlags(t *testing.T) {
	dir := t.TempDir()
	garbage := writeFile(t, "garbage.pem", []byte("not a certificate\n"))
	missing := filepath.Join(dir, "missing.pem")
	for _, c := range []struct {
		args []string
		want string // in the error
	}{
		{[]string{"--cacert", missing}, missing},
		{[]string{"--cacert", garbage}, garbage},
		{[]string{"--cert", garbage}, garbage},
		{[]string{"--cert", missing}, missing},
		{[]string{"--cert", garbage, "--key", missing}, missing},
		{[]string{"--key", garbage}, "--key needs --cert"},
	} {
		args := append([]string{"load", "https://127.0.0.1:1/", "-n", "1"}, c.args...)
		_, code, err := execResults(t, args...)
		if code != 2 || err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("meshmark %v: exit code %d, error %v; want 2 and an error naming %s", args, code, err, c.want)
		}
	}
	_, code, err := execResults(t, "load", "http://127.0.0.1:1/", "-n", "1", "-k")
	if code != 2 || err == nil || !strings.Contains(err.Error(), "https://") {
		t.Errorf("-k on an http:// URL: exit code %d, error %v", code, err)
	}
}
