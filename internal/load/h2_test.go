package load

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// h2cServer serves h with net/http speaking both HTTP/1.1 and cleartext HTTP/2, so that
// a client falling back to HTTP/1.1 would be served, and caught by the checks of
// ProtoMajor, rather than refused.
type h2cServer struct {
	url         string
	conns       atomic.Int64 // connections accepted
	served, h1  atomic.Int64 // requests, and those not over HTTP/2
	bodies      atomic.Int64 // request body bytes received
	hosts       atomic.Value // last :authority seen
	userAgent   atomic.Value
	handlerFunc http.HandlerFunc
}

func startH2C(t *testing.T, h http.HandlerFunc) *h2cServer {
	t.Helper()
	return startH2CWith(t, h, nil)
}

// startH2CWith is startH2C with the server's HTTP/2 settings.
func startH2CWith(t *testing.T, h http.HandlerFunc, conf *http.HTTP2Config) *h2cServer {
	t.Helper()
	s := &h2cServer{handlerFunc: h}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv := &http.Server{
		Protocols: p,
		HTTP2:     conf,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			s.served.Add(1)
			if r.ProtoMajor != 2 {
				s.h1.Add(1)
			}
			n, _ := io.Copy(io.Discard, r.Body)
			s.bodies.Add(n)
			s.hosts.Store(r.Host)
			s.userAgent.Store(r.UserAgent())
			if s.handlerFunc != nil {
				s.handlerFunc(w, r)
			}
		}),
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateNew {
				s.conns.Add(1)
			}
		},
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	s.url = "http://" + ln.Addr().String() + "/"
	return s
}

func TestH2CClosedAndOpen(t *testing.T) {
	payload := strings.Repeat("x", 1000)
	s := startH2C(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, payload) })
	c := NewH2Client(ClientOptions{}, nil)
	res := runH2Epoll(t, Config{Request: Request{URL: s.url}, Closed: &ClosedModel{Connections: 2}, Count: 400, Client: c})
	if res.Succeeded != 400 || s.served.Load() != 400 || res.StatusCodes[200] != 400 || res.BytesIn != 400*1000 {
		t.Fatalf("closed: ok %d, served %d, codes %v, bytes %d; errors %+v %v", res.Succeeded, s.served.Load(), res.StatusCodes, res.BytesIn, res.Errors, res.ErrorSamples)
	}
	if s.h1.Load() != 0 {
		t.Errorf("%d requests arrived over HTTP/1.x", s.h1.Load())
	}
	if s.conns.Load() != 2 || res.Health.Connections != 2 {
		t.Errorf("closed -c 2: server saw %d connections, client reports %d dials; want 2 and 2", s.conns.Load(), res.Health.Connections)
	}
	if ua := s.userAgent.Load(); ua != "meshmark" {
		t.Errorf("user agent %q", ua)
	}
	if fb := res.FirstByte.Quantile(50); fb <= 0 || fb > res.Service.Quantile(50) {
		t.Errorf("first byte p50 %v, service p50 %v", fb, res.Service.Quantile(50))
	}

	open := startH2C(t, nil)
	res = run(t, Config{
		Request:  Request{URL: open.url},
		Open:     &OpenModel{Schedule: ScheduleSpec{Arrival: Constant, Rate: 200}},
		Duration: 1500 * time.Millisecond,
		Client:   c,
	})
	if res.Errors.Total() != 0 || res.Completed != res.Sent || res.Sent != open.served.Load() || res.Sent < 280 {
		t.Fatalf("open: sent %d, completed %d, served %d, errors %+v %v", res.Sent, res.Completed, open.served.Load(), res.Errors, res.ErrorSamples)
	}
	if open.h1.Load() != 0 || open.conns.Load() != res.Health.Connections {
		t.Errorf("open: %d HTTP/1.x requests; server saw %d connections, client dialed %d", open.h1.Load(), open.conns.Load(), res.Health.Connections)
	}
}

func TestH2CRequestAndFailures(t *testing.T) {
	s := startH2C(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/slow":
			time.Sleep(20 * time.Millisecond)
		case "/fail":
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	c := NewH2Client(ClientOptions{}, nil)
	body := []byte(strings.Repeat("b", 3000))
	hdr := http.Header{"Host": {"svc.example"}, "User-Agent": {"probe"}}
	res := run(t, Config{Request: Request{Method: "POST", URL: s.url, Body: body, Header: hdr}, Closed: &ClosedModel{Connections: 1}, Count: 10, Client: c})
	if res.Succeeded != 10 || s.bodies.Load() != 10*3000 || s.hosts.Load() != "svc.example" || s.userAgent.Load() != "probe" {
		t.Errorf("POST: ok %d, body bytes %d, host %v, agent %v", res.Succeeded, s.bodies.Load(), s.hosts.Load(), s.userAgent.Load())
	}

	res = run(t, Config{Request: Request{URL: s.url + "slow"}, Closed: &ClosedModel{Connections: 2}, Count: 20, Client: c})
	if p50 := res.Service.Quantile(50); p50 < 20*time.Millisecond || p50 > 60*time.Millisecond {
		t.Errorf("20 ms handler: service p50 %v", p50)
	}
	if p50 := res.FirstByte.Quantile(50); p50 < 20*time.Millisecond {
		t.Errorf("20 ms handler: first byte p50 %v", p50)
	}

	res = run(t, Config{Request: Request{URL: s.url + "fail"}, Closed: &ClosedModel{Connections: 1}, Count: 5, Client: c})
	if res.Errors.Non2xx != 5 || res.StatusCodes[503] != 5 {
		t.Errorf("503s: errors %+v, codes %v", res.Errors, res.StatusCodes)
	}

	conns := s.conns.Load()
	res = run(t, Config{Request: Request{URL: s.url}, Closed: &ClosedModel{Connections: 2}, Count: 30, Client: NewH2Client(ClientOptions{DisableKeepAlive: true}, nil)})
	if n := s.conns.Load() - conns; res.Succeeded != 30 || n != 30 || res.Health.Connections != 30 {
		t.Errorf("no keep-alive: ok %d, server saw %d new connections, client dialed %d; want 30 each", res.Succeeded, n, res.Health.Connections)
	}

	// An HTTP/1.1-only server must fail the run, not be measured as HTTP/2.
	h1 := startServer(t, func(w http.ResponseWriter, r *http.Request) {})
	res = run(t, Config{Request: Request{URL: h1}, Closed: &ClosedModel{Connections: 1}, Count: 3, Client: c})
	if res.Succeeded != 0 || res.Errors.Total() != 3 {
		t.Errorf("h2c against an HTTP/1.1 server: ok %d, errors %+v", res.Succeeded, res.Errors)
	}

	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := closed.Addr().String()
	closed.Close()
	res = run(t, Config{Request: Request{URL: "http://" + addr + "/"}, Closed: &ClosedModel{Connections: 1}, Count: 3, Client: c})
	if res.Errors.Refused != 3 {
		t.Errorf("refused: errors %+v %v", res.Errors, res.ErrorSamples)
	}
}

// TestH2OverTLS: the same client speaks HTTP/2 over TLS (ALPN h2) for https URLs. The
// handler holds each request 1 ms, so that one session cannot take all 50 before the
// other has finished its handshake (seen once in CI on a loaded machine).
func TestH2OverTLS(t *testing.T) {
	var h2 atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor == 2 && r.TLS != nil {
			h2.Add(1)
		}
		time.Sleep(time.Millisecond)
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	c := NewH2Client(ClientOptions{}, &tls.Config{RootCAs: roots})
	res := run(t, Config{Request: Request{URL: srv.URL + "/"}, Closed: &ClosedModel{Connections: 2}, Count: 50, Client: c})
	if res.Succeeded != 50 || h2.Load() != 50 || res.Health.Connections != 2 {
		t.Errorf("h2 over TLS: ok %d, HTTP/2 TLS requests served %d, dials %d; errors %+v %v", res.Succeeded, h2.Load(), res.Health.Connections, res.Errors, res.ErrorSamples)
	}

	// A TLS server without h2 in its ALPN must fail the run, not be measured as HTTP/2.
	h1 := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	h1.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes are expected
	h1.StartTLS()
	defer h1.Close()
	roots = x509.NewCertPool()
	roots.AddCert(h1.Certificate())
	res = run(t, Config{Request: Request{URL: h1.URL + "/"}, Closed: &ClosedModel{Connections: 1}, Count: 3, Client: NewH2Client(ClientOptions{}, &tls.Config{RootCAs: roots})})
	if res.Succeeded != 0 || res.Errors.Total() != 3 {
		t.Errorf("h2 against an HTTP/1.1 TLS server: ok %d, errors %+v", res.Succeeded, res.Errors)
	}
}

func TestH2PrepareRejects(t *testing.T) {
	c := NewH2Client(ClientOptions{}, nil)
	for _, r := range []Request{
		{URL: "ftp://127.0.0.1/"},
		{URL: "http:///path"},
		{Method: "BAD METHOD", URL: "http://127.0.0.1/"},
		{URL: "http://127.0.0.1/", Header: http.Header{"Bad Name": {"x"}}},
	} {
		if _, err := c.Prepare(r); err == nil {
			t.Errorf("Prepare(%+v) accepted", r)
		}
	}
}

// inflightByConn records, per client connection (remote address), the most requests
// the server had in progress at once.
type inflightByConn struct {
	mu       sync.Mutex
	now, max map[string]int
}

func (f *inflightByConn) handler(hold time.Duration) http.HandlerFunc {
	f.now, f.max = map[string]int{}, map[string]int{}
	return func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.now[r.RemoteAddr]++
		f.max[r.RemoteAddr] = max(f.max[r.RemoteAddr], f.now[r.RemoteAddr])
		f.mu.Unlock()
		time.Sleep(hold)
		f.mu.Lock()
		f.now[r.RemoteAddr]--
		f.mu.Unlock()
	}
}

// TestH2CStreamsShareConnections: 8 sessions with 4 streams each are 2 connections, and
// the server sees 4 requests at once on each of them.
func TestH2CStreamsShareConnections(t *testing.T) {
	var f inflightByConn
	s := startH2C(t, f.handler(20*time.Millisecond))
	c := NewH2Client(ClientOptions{Streams: 4}, nil)
	res := runH2Epoll(t, Config{Request: Request{URL: s.url}, Closed: &ClosedModel{Connections: 8}, Count: 200, Client: c})
	if res.Succeeded != 200 || s.h1.Load() != 0 {
		t.Fatalf("ok %d, HTTP/1.x %d, errors %+v %v", res.Succeeded, s.h1.Load(), res.Errors, res.ErrorSamples)
	}
	if s.conns.Load() != 2 || res.Health.Connections != 2 {
		t.Errorf("8 sessions, 4 streams each: server saw %d connections, client dialed %d; want 2", s.conns.Load(), res.Health.Connections)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.max) != 2 {
		t.Fatalf("requests came from %d connections: %v", len(f.max), f.max)
	}
	for conn, m := range f.max {
		if m != 4 {
			t.Errorf("connection %s carried at most %d requests at once, want 4", conn, m)
		}
	}
}

// TestH2CProtocolLimits: the client keeps to what the server's settings allow, and a
// request that times out is reset without costing its connection. A body 48 times the
// server's receive window arrives whole (flow control: the client waits for window
// updates), 4 streams per connection against a limit of 2 never put more than 2 in
// flight, and after a timed-out request the connection carries the next ones.
func TestH2CProtocolLimits(t *testing.T) {
	var f inflightByConn
	hold := f.handler(5 * time.Millisecond)
	s := startH2CWith(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/stuck" {
			time.Sleep(300 * time.Millisecond)
			return
		}
		hold(w, r)
	}, &http.HTTP2Config{MaxConcurrentStreams: 2, MaxReceiveBufferPerStream: 64 << 10, MaxReceiveBufferPerConnection: 64 << 10})

	body := []byte(strings.Repeat("b", 3<<20))
	res := runH2Epoll(t, Config{Request: Request{Method: "POST", URL: s.url, Body: body}, Closed: &ClosedModel{Connections: 2}, Count: 4,
		Client: NewH2Client(ClientOptions{Streams: 2}, nil), Timeout: 20 * time.Second})
	if res.Succeeded != 4 || s.bodies.Load() != 4*int64(len(body)) {
		t.Fatalf("3 MiB bodies through 64 KiB windows: ok %d, body bytes %d of %d; errors %+v %v", res.Succeeded, s.bodies.Load(), 4*len(body), res.Errors, res.ErrorSamples)
	}

	res = runH2Epoll(t, Config{Request: Request{URL: s.url}, Closed: &ClosedModel{Connections: 4}, Count: 200, Client: NewH2Client(ClientOptions{Streams: 4}, nil)})
	if res.Succeeded != 200 {
		t.Fatalf("4 streams against a limit of 2: ok %d, errors %+v %v", res.Succeeded, res.Errors, res.ErrorSamples)
	}
	f.mu.Lock()
	for conn, m := range f.max {
		if m > 2 {
			t.Errorf("connection %s carried %d requests at once against a limit of 2", conn, m)
		}
	}
	f.mu.Unlock()

	conns := s.conns.Load()
	c := NewH2Client(ClientOptions{}, nil)
	res = run(t, Config{Request: Request{URL: s.url + "stuck"}, Closed: &ClosedModel{Connections: 1}, Count: 1, Client: c, Timeout: 50 * time.Millisecond})
	if res.Errors.Timeout != 1 {
		t.Fatalf("a 300 ms handler with a 50 ms timeout: errors %+v %v", res.Errors, res.ErrorSamples)
	}
	sess := c.NewSession()
	defer sess.Close()
	p, err := c.Prepare(Request{URL: s.url + "stuck"})
	if err != nil {
		t.Fatal(err)
	}
	var out Outcome
	if err := sess.Do(context.Background(), p, time.Now().Add(50*time.Millisecond), &out); Classify(err) != KindTimeout {
		t.Fatalf("timed-out request: %v", err)
	}
	p, _ = c.Prepare(Request{URL: s.url})
	for range 5 {
		if err := sess.Do(context.Background(), p, time.Now().Add(5*time.Second), &out); err != nil || out.Status != 200 || out.Dialed {
			t.Fatalf("after a timeout: %v, status %d, dialed %v", err, out.Status, out.Dialed)
		}
	}
	if n := s.conns.Load() - conns; n != 2 {
		t.Errorf("the runs opened %d connections, want 2 (one per run, the timeout kept its own)", n)
	}
}
