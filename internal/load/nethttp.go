package load

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"time"
)

// NewNetHTTPClient returns a Client over the standard library's net/http: slower and
// allocating, but it follows every corner of the protocol. Each session has its own
// transport limited to one connection, like the lean client.
func NewNetHTTPClient(o ClientOptions) Client {
	tc := o.TLS.Clone()
	if tc == nil {
		tc = &tls.Config{}
	}
	// Shared by every session's transport, so that their connections resume TLS
	// sessions as the lean client's do.
	if tc.ClientSessionCache == nil {
		tc.ClientSessionCache = tls.NewLRUClientSessionCache(0)
	}
	tc.NextProtos = nil // HTTP/1.1, as the lean client speaks
	return &netHTTPClient{opts: o, tls: tc}
}

type netHTTPClient struct {
	opts ClientOptions
	tls  *tls.Config
}

func (c *netHTTPClient) Prepare(r Request) (*Prepared, error) {
	req, err := http.NewRequest(r.Method, r.URL, nil)
	if err != nil {
		return nil, err
	}
	for k, v := range r.Header {
		req.Header[k] = v
	}
	if h := r.Header.Get("Host"); h != "" {
		req.Host = h
	}
	return &Prepared{Request: r, Encoded: req}, nil
}

func (c *netHTTPClient) NewSession() Session {
	t := &http.Transport{
		DialContext:         c.opts.dial(),
		DisableKeepAlives:   c.opts.DisableKeepAlive,
		MaxConnsPerHost:     1,
		MaxIdleConnsPerHost: 1,
		DisableCompression:  true,
		TLSClientConfig:     c.tls,
	}
	return &netHTTPSession{client: &http.Client{Transport: t}, transport: t}
}

type netHTTPSession struct {
	client    *http.Client
	transport *http.Transport
}

func (s *netHTTPSession) Do(ctx context.Context, p *Prepared, deadline time.Time, out *Outcome) error {
	*out = Outcome{}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	req := p.Encoded.(*http.Request).Clone(ctx)
	if b := p.Request.Body; len(b) > 0 {
		req.Body = io.NopCloser(bytes.NewReader(b))
		req.ContentLength = int64(len(b))
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return err
	}
	return drain(resp, out)
}

// drain reads a net/http response's body into out; its headers have just arrived.
func drain(resp *http.Response, out *Outcome) error {
	out.FirstByte = time.Now()
	out.Status = resp.StatusCode
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	out.BytesIn = n
	return err
}

func (s *netHTTPSession) Close() error {
	s.transport.CloseIdleConnections()
	return nil
}
