package meshprobe

import (
	"bufio"
	"context"
	"crypto/tls"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// TestProbePlaintextTellsRefusedFromServed sends the plaintext probe's one request to
// real listeners on loopback, as a probe pod sends it to a meshed service: servers that
// answer serve it, in HTTP/1.1 and, for a gRPC or h2c service, in cleartext HTTP/2; a
// listener that wants TLS first (as a sidecar or ztunnel under strict mTLS), Go's HTTPS
// server (which answers 400 instead of an alert), a listener that closes or resets the
// connection, a mesh policy's 403 (Linkerd's answer to a caller without identity) and a
// proxy's own 5xx refuse it. The application's own error still counts as served: it
// answered.
func TestProbePlaintextTellsRefusedFromServed(t *testing.T) {
	workload := func(status int, body string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(status)
			io.WriteString(w, body)
		}
	}
	serve := func(h http.Handler) string {
		s := httptest.NewServer(h)
		t.Cleanup(s.Close)
		return s.Listener.Addr().String()
	}
	var h2cProto atomic.Value
	h2c := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h2cProto.Store(r.Proto)
		io.WriteString(w, `{"service":"emoji","pod":"emoji-v1-0"}`)
	}))
	h2c.Config.Protocols = new(http.Protocols)
	h2c.Config.Protocols.SetHTTP1(true)
	h2c.Config.Protocols.SetUnencryptedHTTP2(true)
	h2c.Start()
	t.Cleanup(h2c.Close)
	https := httptest.NewUnstartedServer(workload(200, "must not be reached"))
	https.Config.ErrorLog = log.New(io.Discard, "", 0) // it logs the plaintext request it refuses
	https.StartTLS()
	t.Cleanup(https.Close)

	cases := []struct {
		name, addr, protocol string
		refused              bool
		observed             string
	}{
		{"workload over HTTP/1.1", serve(workload(200, `{"service":"front","pod":"front-v1-0"}`)), "http", false, `served: HTTP 200 "{\"service\":\"front\",\"pod\":\"front-v1-0\"}"`},
		{"workload over h2c (a gRPC service)", h2c.Listener.Addr().String(), "grpc", false, `served: HTTP 200 "{\"service\":\"emoji\"`},
		{"workload's own error", serve(workload(500, "injected fault")), "http", false, `served: HTTP 500 "injected fault"`},
		{"TLS-only listener", tlsOnly(t, https.TLS.Certificates), "http", true, "refused: connection closed without an answer"},
		{"TLS-only listener, h2c", tlsOnly(t, https.TLS.Certificates), "h2c", true, "refused: "},
		{"Go HTTPS server", https.Listener.Addr().String(), "http", true, "refused: the server speaks TLS only (HTTP 400"},
		{"listener that closes", closing(t, false), "http", true, "refused: connection closed without an answer"},
		{"listener that resets", closing(t, true), "http", true, "refused: connection reset"},
		{"mesh policy's 403", serve(workload(403, "RBAC: access denied")), "http", true, `denied: HTTP 403 "RBAC: access denied"`},
		{"Envoy without an upstream", serve(workload(503, "upstream connect error or disconnect/reset before headers")), "http", true, "stopped by the proxy: HTTP 503"},
		{"linkerd2-proxy's own error", serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("l5d-proxy-error", "client error (Connect)")
			w.WriteHeader(502)
		})), "http", true, "stopped by the proxy: HTTP 502"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := ProbePlaintext(context.Background(), (&net.Dialer{}).DialContext, PlaintextTarget{Service: "svc", Addr: c.addr, Protocol: c.protocol})
			if got.Refused != c.refused || !strings.Contains(got.Observed, c.observed) || got.Service != "svc" || got.Target != c.addr+" ("+c.protocol+")" {
				t.Errorf("got %+v; want refused %v, observed %q", got, c.refused, c.observed)
			}
		})
	}
	if proto := h2cProto.Load(); proto != "HTTP/2.0" {
		t.Errorf("the gRPC service was called over %v, want cleartext HTTP/2", proto)
	}
}

// tlsOnly listens as a proxy that takes TLS only: it reads a TLS handshake, and closes a
// connection that does not start with one.
func tlsOnly(t *testing.T, certs []tls.Certificate) string {
	t.Helper()
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: certs})
	if err != nil {
		t.Fatal(err)
	}
	return handleEach(t, l, func(conn net.Conn) {
		defer conn.Close()
		_ = conn.(*tls.Conn).Handshake()
	})
}

// closing listens as a server that drops every connection once the request has come
// in: closed, or with reset, reset (no lingering).
func closing(t *testing.T, reset bool) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return handleEach(t, l, func(conn net.Conn) {
		_, _ = bufio.NewReader(conn).ReadString('\n')
		if reset {
			_ = conn.(*net.TCPConn).SetLinger(0)
		}
		conn.Close()
	})
}

// handleEach calls handle, in a goroutine of its own, with each connection l accepts
// until the test ends, and returns l's address.
func handleEach(t *testing.T, l net.Listener, handle func(net.Conn)) string {
	t.Helper()
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go handle(conn)
		}
	}()
	return l.Addr().String()
}
