package load

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// testCert is a self-signed server certificate for 127.0.0.1, localhost and
// example.test, and a pool that trusts it.
func testCert(tb testing.TB) (tls.Certificate, *x509.CertPool) {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "meshmark test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		DNSNames:              []string{"localhost", "example.test"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: cert}, pool
}

// tlsServer is a raw HTTP/1.1 server over TLS that answers "ok" and keeps count of
// what its clients did.
type tlsServer struct {
	url                  string
	roots                *x509.CertPool
	requests             atomic.Int64
	full, resumed        atomic.Int64 // completed handshakes
	mu                   sync.Mutex
	serverNames, offered []string // SNI and ALPN of every ClientHello
}

func startTLSServer(tb testing.TB, closeAfter bool) *tlsServer {
	tb.Helper()
	cert, roots := testCert(tb)
	s := &tlsServer{roots: roots}
	cfg := &tls.Config{
		Certificates: []tls.Certificate{cert},
		NextProtos:   []string{"http/1.1"},
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			s.mu.Lock()
			s.serverNames = append(s.serverNames, h.ServerName)
			s.offered = append(s.offered, strings.Join(h.SupportedProtos, ","))
			s.mu.Unlock()
			return nil, nil
		},
		// Runs for resumed handshakes too.
		VerifyConnection: func(cs tls.ConnectionState) error {
			if cs.DidResume {
				s.resumed.Add(1)
			} else {
				s.full.Add(1)
			}
			return nil
		},
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	s.url = serveRawOn(tb, tls.NewListener(ln, cfg), "https", func(c net.Conn) bool {
		s.requests.Add(1)
		_, err := c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
		return err == nil && !closeAfter
	})
	return s
}

func (s *tlsServer) names() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.serverNames...)
}

func TestHTTPSClosedAndOpen(t *testing.T) {
	srv := startTLSServer(t, false)
	trust := &tls.Config{RootCAs: srv.roots}

	// A plaintext run takes the epoll loop, so the counter below can tell.
	before := epollRuns.Load()
	plain := startShapeServer(t, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false)
	run(t, Config{Request: Request{URL: plain}, Closed: &ClosedModel{Connections: 1}, Count: 5})
	if epollRuns.Load() != before+1 {
		t.Fatal("the plaintext closed run did not take the epoll loop; the check below would prove nothing")
	}

	const count = 300
	res := run(t, Config{Request: Request{URL: srv.url}, Closed: &ClosedModel{Connections: 3}, Count: count, TLS: trust})
	if epollRuns.Load() != before+1 {
		t.Error("an https closed run took the epoll loop, which writes plaintext")
	}
	if res.Succeeded != count || res.BytesIn != 2*count || srv.requests.Load() != count {
		t.Errorf("closed over TLS: succeeded %d, bytes %d, served %d; want %d, %d, %d; errors %+v %v",
			res.Succeeded, res.BytesIn, srv.requests.Load(), count, 2*count, count, res.Errors, res.ErrorSamples)
	}
	if c := res.Health.Connections; c < 1 || c > 3 || srv.full.Load()+srv.resumed.Load() != c {
		t.Errorf("closed over TLS: %d connections opened, server saw %d full and %d resumed handshakes; want 1..3 and one per connection",
			c, srv.full.Load(), srv.resumed.Load())
	}

	// The open model writes from the scheduler on warm connections (SplitSession).
	srv.requests.Store(0)
	res = run(t, Config{
		Request:  Request{URL: srv.url},
		Open:     &OpenModel{Schedule: ScheduleSpec{Arrival: Constant, Rate: 300}, Connections: 2},
		Duration: time.Second,
		TLS:      trust,
	})
	if res.Sent < 250 || res.Succeeded != res.Sent || srv.requests.Load() != res.Sent || res.Errors.Total() != 0 {
		t.Errorf("open over TLS: sent %d, succeeded %d, served %d, errors %+v %v; want about 300, all served and succeeded",
			res.Sent, res.Succeeded, srv.requests.Load(), res.Errors, res.ErrorSamples)
	}
	// The pool grows while every connection is busy, as it does when this shared
	// machine stalls the process, but a connection per request would be one per send.
	if c := res.Health.Connections; c*2 > res.Sent {
		t.Errorf("open over TLS: %d connections for %d requests; kept-alive connections are not being reused", c, res.Sent)
	}
	for _, p := range srv.offered {
		if p != "http/1.1" {
			t.Errorf("client offered ALPN %q, want http/1.1 only", p)
			break
		}
	}
}

func TestHTTPSVerificationFailure(t *testing.T) {
	srv := startTLSServer(t, false)
	res := run(t, Config{Request: Request{URL: srv.url}, Closed: &ClosedModel{Connections: 1}, Count: 3})
	if res.Errors.Other != 3 || res.Succeeded != 0 || srv.requests.Load() != 0 {
		t.Fatalf("untrusted certificate: errors %+v, succeeded %d, served %d; want 3 other errors", res.Errors, res.Succeeded, srv.requests.Load())
	}
	if len(res.ErrorSamples) == 0 || !strings.Contains(res.ErrorSamples[0], "certificate") {
		t.Errorf("error samples %q do not mention the certificate", res.ErrorSamples)
	}
	// The handshake failed, the TCP connection was opened all the same.
	if res.Health.Connections != 3 {
		t.Errorf("%d connections opened for 3 failed handshakes", res.Health.Connections)
	}
	res = run(t, Config{Request: Request{URL: srv.url}, Closed: &ClosedModel{Connections: 1}, Count: 3, TLS: &tls.Config{InsecureSkipVerify: true}})
	if res.Succeeded != 3 {
		t.Errorf("InsecureSkipVerify: succeeded %d, errors %+v %v", res.Succeeded, res.Errors, res.ErrorSamples)
	}
}

// TestHTTPSNoKeepAliveResumes: a connection per request, and after the first
// handshake of each worker the TLS session is resumed, as a real client's would be.
func TestHTTPSNoKeepAliveResumes(t *testing.T) {
	for _, mk := range []struct {
		name   string
		client func(ClientOptions) Client
	}{{"lean", NewHTTP1Client}, {"net/http", NewNetHTTPClient}} {
		t.Run(mk.name, func(t *testing.T) {
			srv := startTLSServer(t, true)
			const count, conns = 40, 2
			opts := ClientOptions{DisableKeepAlive: true, TLS: &tls.Config{RootCAs: srv.roots}}
			res := run(t, Config{Request: Request{URL: srv.url}, Closed: &ClosedModel{Connections: conns}, Count: count,
				DisableKeepAlive: true, Client: mk.client(opts)})
			if res.Succeeded != count {
				t.Fatalf("succeeded %d of %d, errors %+v %v", res.Succeeded, count, res.Errors, res.ErrorSamples)
			}
			full, resumed := srv.full.Load(), srv.resumed.Load()
			if full+resumed != count {
				t.Errorf("server saw %d handshakes for %d requests without keep-alive", full+resumed, count)
			}
			if mk.name == "lean" && res.Health.Connections != count {
				t.Errorf("%d connections reported for %d requests", res.Health.Connections, count)
			}
			// Each worker's first connection may find no ticket yet.
			if full > conns {
				t.Errorf("%d full handshakes and %d resumed: sessions are not resumed across connections", full, resumed)
			}
		})
	}
}

// TestHTTPSServerName: SNI is the URL's host name, never a Host header and not sent for
// an IP address (as curl does), unless ServerName overrides it; verification follows.
func TestHTTPSServerName(t *testing.T) {
	srv := startTLSServer(t, false)
	port := srv.url[strings.LastIndex(srv.url, ":")+1 : len(srv.url)-1]
	cases := []struct {
		url, host, override string
		wantSNI             string
	}{
		{url: srv.url, wantSNI: ""},
		{url: srv.url, host: "example.test", wantSNI: ""},
		{url: "https://localhost:" + port + "/", wantSNI: "localhost"},
		{url: srv.url, override: "example.test", wantSNI: "example.test"},
	}
	for _, c := range cases {
		before := len(srv.names())
		req := Request{URL: c.url}
		if c.host != "" {
			req.Header = map[string][]string{"Host": {c.host}}
		}
		res := run(t, Config{Request: req, Closed: &ClosedModel{Connections: 1}, Count: 2,
			TLS: &tls.Config{RootCAs: srv.roots, ServerName: c.override}})
		if res.Succeeded != 2 {
			t.Errorf("%+v: succeeded %d, errors %+v %v", c, res.Succeeded, res.Errors, res.ErrorSamples)
			continue
		}
		names := srv.names()[before:]
		if len(names) != 1 || names[0] != c.wantSNI {
			t.Errorf("%+v: server saw SNI %q, want one hello with %q", c, names, c.wantSNI)
		}
	}
	// An override the certificate does not carry fails verification.
	res := run(t, Config{Request: Request{URL: srv.url}, Closed: &ClosedModel{Connections: 1}, Count: 1,
		TLS: &tls.Config{RootCAs: srv.roots, ServerName: "other.test"}})
	if res.Errors.Other != 1 || len(res.ErrorSamples) == 0 || !strings.Contains(res.ErrorSamples[0], "other.test") {
		t.Errorf("ServerName other.test: errors %+v %v, want a verification failure naming it", res.Errors, res.ErrorSamples)
	}
}

func TestPrepareHTTPS(t *testing.T) {
	c := NewHTTP1Client(ClientOptions{}).(*http1Client)
	a, err := c.Prepare(Request{URL: "https://127.0.0.1/a"})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := c.Prepare(Request{URL: "https://127.0.0.1:443/b"})
	h, _ := c.Prepare(Request{URL: "http://127.0.0.1/"})
	ha, hb, hh := a.Encoded.(*http1Request), b.Encoded.(*http1Request), h.Encoded.(*http1Request)
	if ha.addr != "127.0.0.1:443" || hh.addr != "127.0.0.1:80" {
		t.Errorf("default ports: https %s, http %s", ha.addr, hh.addr)
	}
	// One config per server: requests to it share connections.
	if ha.tls == nil || ha.tls != hb.tls || hh.tls != nil {
		t.Errorf("tls configs %p %p %p: want one shared by both https requests, none for http", ha.tls, hb.tls, hh.tls)
	}
	if _, err := c.Prepare(Request{URL: "ftp://127.0.0.1/"}); err == nil {
		t.Error("ftp accepted")
	}
}

// TestHTTPSHandshakeTimeout: a server that accepts and never answers the ClientHello
// holds each request no longer than its timeout, and the failure is a timeout.
func TestHTTPSHandshakeTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
		}
	}()
	began := time.Now()
	res := run(t, Config{Request: Request{URL: "https://" + ln.Addr().String() + "/"}, Closed: &ClosedModel{Connections: 1},
		Count: 3, Timeout: 100 * time.Millisecond, TLS: &tls.Config{InsecureSkipVerify: true}})
	if res.Errors.Timeout != 3 || res.Health.Connections != 3 {
		t.Errorf("silent TLS server: errors %+v %v, connections %d; want 3 timeouts on 3 connections", res.Errors, res.ErrorSamples, res.Health.Connections)
	}
	// one after another on one connection slot: 3 × 100 ms
	if d := time.Since(began); d < 300*time.Millisecond || d > 2*time.Second {
		t.Errorf("3 requests with a 100 ms timeout took %v", d)
	}
}

// TestHTTPSSplitSession: the open model's warm path over TLS, step by step: one
// goroutine blocks reading the connection while another writes the request on it.
func TestHTTPSSplitSession(t *testing.T) {
	srv := startTLSServer(t, false)
	c := NewHTTP1Client(ClientOptions{TLS: &tls.Config{RootCAs: srv.roots}})
	p, err := c.Prepare(Request{URL: srv.url})
	if err != nil {
		t.Fatal(err)
	}
	s := c.NewSession()
	defer s.Close()
	ss := s.(SplitSession)
	ctx := t.Context()
	var out Outcome
	if ss.Ready(p) {
		t.Fatal("Ready before any connection")
	}
	if err := s.Do(ctx, p, time.Now().Add(5*time.Second), &out); err != nil || out.Status != 200 || !out.Dialed {
		t.Fatalf("first request: %+v, %v", out, err)
	}
	for i := range 20 {
		if !ss.Ready(p) {
			t.Fatalf("request %d: kept-alive TLS connection not ready", i)
		}
		ss.Idle(ctx)
		done := make(chan error, 1)
		go func() { done <- ss.Await(p, &out) }()
		time.Sleep(time.Millisecond) // let Await block in its read first
		if err := ss.Send(p, time.Now().Add(5*time.Second)); err != nil {
			t.Fatalf("request %d: send: %v", i, err)
		}
		if err := <-done; err != nil || out.Status != 200 || out.BytesIn != 2 || out.Close {
			t.Fatalf("request %d: await: %+v, %v", i, out, err)
		}
	}
	if n, full, resumed := srv.requests.Load(), srv.full.Load(), srv.resumed.Load(); n != 21 || full+resumed != 1 {
		t.Errorf("server saw %d requests over %d handshakes, want 21 over 1", n, full+resumed)
	}
}
