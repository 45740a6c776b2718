package load

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync/atomic"
	"time"
)

// NewH2Client returns an HTTP/2 client over net/http. http:// URLs are spoken in
// cleartext with prior knowledge (h2c, as h2load and curl --http2-prior-knowledge do: no
// Upgrade from HTTP/1.1, which would put an HTTP/1.1 round trip in every first request);
// https:// URLs use TLS with ALPN h2, configured by tlsConfig (nil: system roots). Either
// way the client refuses to fall back to HTTP/1.1, so a run labelled HTTP/2 measured
// HTTP/2.
//
// A session carries one request at a time. By default it has a connection of its own, so
// N sessions are N connections, as with the HTTP/1.1 client (and h2load -c N -m 1); with
// ClientOptions.Streams = m, every m sessions share one connection as concurrent streams
// (h2load -m m). With DisableKeepAlive every request opens its own connection and
// Streams does not apply.
func NewH2Client(o ClientOptions, tlsConfig *tls.Config) Client {
	c := &h2Client{opts: o, dial: o.dial(), tls: tlsConfig}
	c.conns = connGroup[*h2Conn]{size: o.streams(), newConn: c.newConn}
	return c
}

type h2Client struct {
	opts  ClientOptions
	dial  DialFunc
	tls   *tls.Config
	conns connGroup[*h2Conn]
}

// h2Conn is one transport holding at most one connection, shared by its sessions.
type h2Conn struct {
	t     *http.Transport
	dials atomic.Int32 // successful dials not yet reported in an Outcome
	sharers
}

type h2Request struct {
	req *http.Request // without context or body; sessions shallow-copy it
}

func (c *h2Client) Prepare(r Request) (*Prepared, error) {
	u, err := url.Parse(r.URL)
	if err != nil {
		return nil, fmt.Errorf("request URL %q: %w", r.URL, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("request URL %q: scheme %q not supported by the HTTP/2 client (want http for h2c or https)", r.URL, u.Scheme)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("request URL %q: no host", r.URL)
	}
	method := r.Method
	if method == "" {
		method = "GET"
	}
	if !validToken(method) {
		return nil, fmt.Errorf("method %q is not a valid HTTP token", method)
	}
	req, err := http.NewRequest(method, r.URL, nil)
	if err != nil {
		return nil, err
	}
	for k, v := range r.Header {
		if !validToken(k) {
			return nil, fmt.Errorf("header name %q is not a valid HTTP token", k)
		}
		req.Header[http.CanonicalHeaderKey(k)] = v
	}
	if h := req.Header.Get("Host"); h != "" {
		req.Host = h
		req.Header.Del("Host") // HTTP/2 sends it as :authority
	}
	if req.Header.Get("User-Agent") == "" {
		req.Header.Set("User-Agent", "meshmark") // as the HTTP/1.1 client, not Go-http-client
	}
	if len(r.Body) > 0 || method == "POST" || method == "PUT" || method == "PATCH" {
		req.ContentLength = int64(len(r.Body))
	}
	return &Prepared{Request: r, Encoded: &h2Request{req: req}}, nil
}

func (c *h2Client) NewSession() Session {
	conn := c.conns.join()
	conn.enter()
	return &h2Session{conn: conn}
}

func (c *h2Client) newConn() *h2Conn {
	s := &h2Conn{}
	p := new(http.Protocols)
	p.SetUnencryptedHTTP2(true)
	p.SetHTTP2(true)
	dial := c.dial
	var tc *tls.Config
	if c.tls != nil {
		tc = c.tls.Clone() // the transport adds its ALPN protocols to the config it is given
	}
	s.t = &http.Transport{
		Protocols: p,
		// Dials are counted here rather than through httptrace, which would cost a
		// context value and a trace per request.
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := dial(ctx, network, addr)
			if err == nil {
				s.dials.Add(1)
			}
			return conn, err
		},
		TLSClientConfig:     tc,
		DisableKeepAlives:   c.opts.DisableKeepAlive,
		MaxConnsPerHost:     1,
		MaxIdleConnsPerHost: 1,
		DisableCompression:  true,
	}
	return s
}

type h2Session struct {
	conn   *h2Conn
	closed bool
}

// h2Body is a request body that can be read again: the transport retries a request
// refused by a GOAWAY on a fresh connection and asks GetBody for a new copy.
func h2Body(b []byte) (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }

func (s *h2Session) Do(ctx context.Context, p *Prepared, deadline time.Time, out *Outcome) error {
	hr, ok := p.Encoded.(*h2Request)
	if !ok {
		return errors.New("h2: request was not prepared by this client")
	}
	*out = Outcome{}
	s.conn.reopen(&s.closed)
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	// A shallow copy suffices: RoundTrip must not modify the request, and the header
	// map is never written after Prepare.
	req := hr.req.WithContext(ctx)
	if b := p.Request.Body; len(b) > 0 {
		req.Body, _ = h2Body(b)
		req.GetBody = func() (io.ReadCloser, error) { return h2Body(b) }
	}
	resp, err := s.conn.t.RoundTrip(req)
	out.Dialed = s.conn.dials.Swap(0) > 0
	if err != nil {
		return err
	}
	return drain(resp, out)
}

// Close closes the connection once none of the sessions sharing it is open.
func (s *h2Session) Close() error {
	if s.conn.leave(&s.closed) {
		s.conn.t.CloseIdleConnections()
	}
	return nil
}
