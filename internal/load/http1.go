package load

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// NewHTTP1Client returns meshmark's lean HTTP/1.1 client: each request is serialised
// once, written with one call, and the response is parsed in place from a per-connection
// buffer without allocating. It follows RFC 9112 framing (Content-Length, chunked,
// read-until-close) and retries once on a kept-alive connection the server closed.
// https URLs go over crypto/tls, configured by o.TLS.
func NewHTTP1Client(o ClientOptions) Client {
	if o.ReadBufferSize <= 0 {
		o.ReadBufferSize = 16 << 10
	}
	base := o.TLS.Clone()
	if base == nil {
		base = &tls.Config{}
	}
	// Every connection of the client resumes the TLS session of an earlier one (a
	// ticket, in TLS 1.3), as browsers and HTTP libraries do: reconnecting, notably with
	// DisableKeepAlive, then costs what it costs a real client, not a full handshake.
	if base.ClientSessionCache == nil {
		base.ClientSessionCache = tls.NewLRUClientSessionCache(0)
	}
	// This client speaks HTTP/1.1 only; a server offered h2 by ALPN could choose it.
	base.NextProtos = []string{"http/1.1"}
	return &http1Client{opts: o, dial: o.dial(), tlsBase: base}
}

type http1Client struct {
	opts    ClientOptions
	dial    DialFunc
	tlsBase *tls.Config

	mu sync.Mutex
	// tlsByName holds one config per server name, so that requests to the same server
	// share a connection (sessions compare configs by pointer).
	tlsByName map[string]*tls.Config
}

type http1Request struct {
	addr string // host:port to dial
	// tls is the config of the connection's TLS client (https); nil: plaintext. Such
	// requests must not take the epoll paths, which write the wire bytes to the socket.
	tls     *tls.Config
	wire    []byte // the request exactly as written
	noBody  bool   // HEAD: the response has no body whatever its headers say
	idempot bool   // safe to resend after a stale keep-alive connection
}

// tlsFor returns the config for connections to host. As curl does, the server name
// (SNI and the name verified) is the URL's host, not a Host header; crypto/tls sends no
// SNI for an IP address and verifies it against the certificate's IP SANs.
func (c *http1Client) tlsFor(host string) *tls.Config {
	name := c.tlsBase.ServerName
	if name == "" {
		name = host
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if tc := c.tlsByName[name]; tc != nil {
		return tc
	}
	if c.tlsByName == nil {
		c.tlsByName = map[string]*tls.Config{}
	}
	tc := c.tlsBase.Clone() // the clone shares the session cache
	tc.ServerName = name
	c.tlsByName[name] = tc
	return tc
}

// Prepare serialises r.
func (c *http1Client) Prepare(r Request) (*Prepared, error) {
	u, err := url.Parse(r.URL)
	if err != nil {
		return nil, fmt.Errorf("request URL %q: %w", r.URL, err)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("request URL %q: no host", r.URL)
	}
	var tc *tls.Config
	port := "80"
	switch u.Scheme {
	case "http":
	case "https":
		tc, port = c.tlsFor(u.Hostname()), "443"
	default:
		return nil, fmt.Errorf("request URL %q: scheme %q not supported by the HTTP/1.1 client (want http or https)", r.URL, u.Scheme)
	}
	method := r.Method
	if method == "" {
		method = "GET"
	}
	if !validToken(method) {
		return nil, fmt.Errorf("method %q is not a valid HTTP token", method)
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), port)
	}
	target := u.RequestURI()
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\n", method, target)
	host := u.Host
	if h := r.Header.Get("Host"); h != "" {
		host = h
	}
	fmt.Fprintf(&b, "Host: %s\r\n", host)
	names := make([]string, 0, len(r.Header))
	for k := range r.Header {
		names = append(names, k)
	}
	sort.Strings(names) // a stable wire form makes runs comparable byte for byte
	hasUA := false
	for _, k := range names {
		if !validToken(k) {
			return nil, fmt.Errorf("header name %q is not a valid HTTP token", k)
		}
		switch strings.ToLower(k) {
		case "host", "content-length", "connection", "transfer-encoding":
			continue // owned by the client: framing must match what it sends
		case "user-agent":
			hasUA = true
		}
		for _, v := range r.Header[k] {
			if strings.ContainsAny(v, "\r\n\x00") {
				return nil, fmt.Errorf("header %s: value contains CR, LF or NUL", k)
			}
			fmt.Fprintf(&b, "%s: %s\r\n", k, v)
		}
	}
	if !hasUA {
		b.WriteString("User-Agent: meshmark\r\n")
	}
	if len(r.Body) > 0 || method == "POST" || method == "PUT" || method == "PATCH" {
		fmt.Fprintf(&b, "Content-Length: %d\r\n", len(r.Body))
	}
	if c.opts.DisableKeepAlive {
		b.WriteString("Connection: close\r\n")
	}
	b.WriteString("\r\n")
	b.Write(r.Body)
	hr := &http1Request{
		addr:    addr,
		tls:     tc,
		wire:    b.Bytes(),
		noBody:  method == "HEAD",
		idempot: method == "GET" || method == "HEAD" || method == "OPTIONS" || method == "PUT" || method == "DELETE",
	}
	return &Prepared{Request: r, Encoded: hr}, nil
}

func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte("\"(),/:;<=>?@[\\]{}", c) >= 0 {
			return false
		}
	}
	return true
}

func (c *http1Client) NewSession() Session { return &http1Session{c: c} }

type http1Session struct {
	c    *http1Client
	conn net.Conn // requests go over it: raw, or TLS over raw
	raw  net.Conn // the TCP connection
	addr string
	tls  *tls.Config // conn's TLS config; nil: plaintext
	br   *bufio.Reader
	used bool // the connection already carried a response
	// broken: the connection failed, so Close does not send TLS's close_notify, a write
	// that could block on it for up to 5 s.
	broken bool
	// interrupt unblocks the connection when the run's context ends.
	ctx       context.Context
	interrupt func() bool
	armed     time.Time // the connection's current deadline; zero: none known
}

func (s *http1Session) Close() error {
	if s.conn == nil {
		return nil
	}
	if s.interrupt != nil {
		s.interrupt()
		s.interrupt, s.ctx = nil, nil
	}
	var err error
	if s.broken {
		err = s.raw.Close()
	} else {
		err = s.conn.Close()
	}
	s.conn, s.raw = nil, nil
	return err
}

// serves reports whether the open connection can carry hr.
func (s *http1Session) serves(hr *http1Request) bool {
	return s.conn != nil && s.addr == hr.addr && s.tls == hr.tls
}

// connect opens a connection for hr; for https the TLS handshake is part of it, bounded
// by the same deadline as the dial, so that its cost lands on the request that opened
// the connection. dialed: a TCP connection was opened, even if its handshake failed.
func (s *http1Session) connect(ctx context.Context, hr *http1Request, deadline time.Time) (dialed bool, err error) {
	s.Close()
	dctx, cancel := context.WithDeadline(ctx, deadline)
	raw, err := s.c.dial(dctx, "tcp", hr.addr)
	cancel()
	if err != nil {
		return false, err
	}
	conn := raw
	if hr.tls != nil {
		conn = tls.Client(raw, hr.tls)
	}
	s.conn, s.raw, s.addr, s.tls, s.used, s.broken, s.armed = conn, raw, hr.addr, hr.tls, false, false, time.Time{}
	if hr.tls != nil {
		// Set before watch, whose interrupt must win over it.
		if err := raw.SetDeadline(deadline); err != nil {
			s.broken = true
			s.Close()
			return true, err
		}
		s.armed = deadline
	}
	s.watch(ctx)
	if tc, ok := conn.(*tls.Conn); ok {
		if err := tc.Handshake(); err != nil {
			s.broken = true
			s.Close()
			return true, fmt.Errorf("TLS handshake: %w", err)
		}
	}
	if s.br == nil {
		s.br = bufio.NewReaderSize(conn, s.c.opts.ReadBufferSize)
	} else {
		s.br.Reset(conn)
	}
	return true, nil
}

// watch makes a blocked read or write return when ctx ends; one registration per
// connection, not per request.
func (s *http1Session) watch(ctx context.Context) {
	if s.interrupt != nil {
		s.interrupt()
	}
	conn := s.conn
	s.ctx = ctx
	s.interrupt = context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
}

// arm makes the connection time out no earlier than deadline and no later than a tenth
// of the remaining time after it. Re-arming a deadline costs two runtime timer updates,
// so a connection re-arms only every tenth of the timeout, not per request.
func (s *http1Session) arm(deadline time.Time) error {
	if !s.armed.IsZero() && !s.armed.Before(deadline) {
		return nil
	}
	at := deadline.Add(time.Until(deadline) / 10)
	if err := s.conn.SetDeadline(at); err != nil {
		return err
	}
	s.armed = at
	return nil
}

// Do implements Session.
func (s *http1Session) Do(ctx context.Context, p *Prepared, deadline time.Time, out *Outcome) error {
	hr, ok := p.Encoded.(*http1Request)
	if !ok {
		return errors.New("http1: request was not prepared by this client")
	}
	*out = Outcome{}
	for attempt := 0; ; attempt++ {
		if !s.serves(hr) {
			dialed, err := s.connect(ctx, hr, deadline)
			out.Dialed = out.Dialed || dialed
			if err != nil {
				return err
			}
		}
		if s.ctx != ctx {
			s.watch(ctx)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		reused := s.used
		err := s.roundTrip(hr, deadline, out)
		if err == nil {
			return nil
		}
		s.broken = true
		s.Close()
		// A kept-alive connection the server closed meanwhile fails before any byte of
		// the response; resending is what every HTTP client does and is not a failure.
		if reused && attempt == 0 && hr.idempot && out.FirstByte.IsZero() && Classify(err) == KindReset {
			continue
		}
		return err
	}
}

func (s *http1Session) roundTrip(hr *http1Request, deadline time.Time, out *Outcome) error {
	if err := s.arm(deadline); err != nil {
		return err
	}
	if _, err := s.conn.Write(hr.wire); err != nil {
		return err
	}
	return s.readResponse(hr, out)
}

func (s *http1Session) readResponse(hr *http1Request, out *Outcome) error {
	if _, err := s.br.Peek(1); err != nil {
		return err
	}
	out.FirstByte = time.Now()
	resp, err := ReadResponse(s.br, hr.noBody)
	if err != nil {
		return err
	}
	out.Status, out.BytesIn = resp.Status, resp.BodyBytes
	s.used = true
	if resp.Close || s.c.opts.DisableKeepAlive {
		s.Close()
	}
	return nil
}

// ResponseInfo is what ReadResponse learned about one response.
type ResponseInfo struct {
	Status    int
	BodyBytes int64
	Close     bool // the connection cannot carry another request
	// UntilClose: the body had no length and ran to the end of the input.
	UntilClose bool
}

// Errors from ReadResponse.
var (
	ErrMalformedResponse = errors.New("malformed HTTP response")
	errLineTooLong       = fmt.Errorf("%w: header line longer than the read buffer", ErrMalformedResponse)
)

const maxHeaderLines = 256

// ReadResponse reads one HTTP/1.x response from br (skipping 1xx interim responses) and
// discards its body. noBody is set for responses to HEAD. It does not allocate on
// well-formed input.
func ReadResponse(br *bufio.Reader, noBody bool) (ResponseInfo, error) {
	var r ResponseInfo
	for {
		line, err := readLine(br)
		if err != nil {
			return r, err
		}
		status, http10, ok := parseStatusLine(line)
		if !ok {
			return r, fmt.Errorf("%w: bad status line %.40q", ErrMalformedResponse, line)
		}
		r.Status = status
		h := respHeader{contentLength: -1}
		for n := 0; ; n++ {
			if n == maxHeaderLines {
				return r, fmt.Errorf("%w: more than %d header lines", ErrMalformedResponse, maxHeaderLines)
			}
			line, err := readLine(br)
			if err != nil {
				return r, err
			}
			if len(line) == 0 {
				break
			}
			if err := h.field(line); err != nil {
				return r, err
			}
		}
		if status >= 100 && status < 200 && status != 101 {
			continue // interim response; the real one follows
		}
		r.Close = h.closeConn || (http10 && !h.keepAlive)
		switch {
		case noBody || status == 204 || status == 304 || status == 101:
			return r, nil
		case h.chunked:
			n, err := discardChunked(br)
			r.BodyBytes = n
			return r, err
		case h.contentLength >= 0:
			n, err := br.Discard(int(h.contentLength))
			r.BodyBytes = int64(n)
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return r, err
		default: // body runs until the server closes the connection
			r.Close, r.UntilClose = true, true
			for {
				n, err := br.Discard(br.Size())
				r.BodyBytes += int64(n)
				if err == io.EOF {
					return r, nil
				}
				if err != nil {
					return r, err
				}
			}
		}
	}
}

// respHeader is what a response's header fields say about its body and connection.
type respHeader struct {
	contentLength                 int64 // -1: none given
	chunked, closeConn, keepAlive bool
}

// field takes one header line (without its line end) into h.
func (h *respHeader) field(line []byte) error {
	colon := bytes.IndexByte(line, ':')
	if colon <= 0 {
		return fmt.Errorf("%w: header line without name %.40q", ErrMalformedResponse, line)
	}
	// the length first: most headers are none of the three, and comparing names
	// case-insensitively is the parser's largest cost
	name, value := line[:colon], line[colon+1:]
	switch {
	case len(name) == len("Content-Length") && bytes.EqualFold(name, []byte("Content-Length")):
		value = bytes.TrimSpace(value)
		n, ok := parseDecimal(value)
		if !ok || (h.contentLength >= 0 && h.contentLength != n) {
			return fmt.Errorf("%w: bad Content-Length %.40q", ErrMalformedResponse, value)
		}
		h.contentLength = n
	case len(name) == len("Transfer-Encoding") && bytes.EqualFold(name, []byte("Transfer-Encoding")):
		h.chunked = hasTokenFold(value, "chunked")
	case len(name) == len("Connection") && bytes.EqualFold(name, []byte("Connection")):
		h.closeConn = h.closeConn || hasTokenFold(value, "close")
		h.keepAlive = h.keepAlive || hasTokenFold(value, "keep-alive")
	}
	return nil
}

// bufferedState says how far parseBuffered got.
type bufferedState int

const (
	bufferedIncomplete bufferedState = iota // more bytes are needed
	bufferedComplete                        // the response is whole in the buffer
	bufferedOther                           // not the common shape: ReadResponse must parse it
	bufferedError                           // malformed
)

// parseBuffered parses the common response, whole in buf, in place: a final status
// and a body with a Content-Length (or none). It saves the epoll loop the copy into a
// bufio.Reader and a scan per line; anything else (interim 1xx, chunked, a body that
// runs to the end of the connection, a line end other than CRLF) is bufferedOther and
// goes to ReadResponse, which parses every shape. used is how many bytes the response
// took.
func parseBuffered(buf []byte, noBody bool) (r ResponseInfo, used int, st bufferedState, err error) {
	// nextLine returns the line at used without its CRLF and moves used past it; ok
	// is false at the end of buf or at a line not ended by CRLF.
	nextLine := func() (line []byte, ok bool) {
		nl := bytes.IndexByte(buf[used:], '\n')
		if nl < 1 || buf[used+nl-1] != '\r' {
			return nil, false // headers still arriving, or bare LFs: ReadResponse tells
		}
		line = buf[used : used+nl-1]
		used += nl + 1
		return line, true
	}
	line, ok := nextLine()
	if !ok {
		return r, 0, bufferedOther, nil
	}
	status, http10, ok := parseStatusLine(line)
	if !ok {
		return r, 0, bufferedError, fmt.Errorf("%w: bad status line %.40q", ErrMalformedResponse, line)
	}
	if status < 200 && status != 101 {
		return r, 0, bufferedOther, nil
	}
	r.Status = status
	h := respHeader{contentLength: -1}
	for n := 0; ; n++ {
		if n == maxHeaderLines {
			return r, 0, bufferedError, fmt.Errorf("%w: more than %d header lines", ErrMalformedResponse, maxHeaderLines)
		}
		line, ok := nextLine()
		if !ok {
			return r, 0, bufferedOther, nil
		}
		if len(line) == 0 {
			break
		}
		if err := h.field(line); err != nil {
			return r, 0, bufferedError, err
		}
	}
	r.Close = h.closeConn || (http10 && !h.keepAlive)
	switch {
	case noBody || status == 204 || status == 304 || status == 101:
		return r, used, bufferedComplete, nil
	case h.chunked || h.contentLength < 0:
		return r, 0, bufferedOther, nil
	case int64(len(buf)-used) < h.contentLength:
		return r, 0, bufferedIncomplete, nil
	}
	r.BodyBytes = h.contentLength
	return r, used + int(h.contentLength), bufferedComplete, nil
}

// readLine returns one line without its CRLF (or LF), valid until the next read.
func readLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		return nil, errLineTooLong
	}
	if err != nil {
		if err == io.EOF && len(line) > 0 {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, nil
}

// parseStatusLine parses "HTTP/1.x NNN reason".
func parseStatusLine(line []byte) (status int, http10, ok bool) {
	if len(line) < 12 || string(line[:7]) != "HTTP/1." || (line[7] != '0' && line[7] != '1') || line[8] != ' ' {
		return 0, false, false
	}
	if len(line) > 12 && line[12] != ' ' {
		return 0, false, false
	}
	for _, c := range line[9:12] {
		if c < '0' || c > '9' {
			return 0, false, false
		}
		status = status*10 + int(c-'0')
	}
	if status < 100 {
		return 0, false, false
	}
	return status, line[7] == '0', true
}

func parseDecimal(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 18 {
		return 0, false
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// hasTokenFold reports whether the comma-separated list v contains token.
func hasTokenFold(v []byte, token string) bool {
	for len(v) > 0 {
		var item []byte
		if i := bytes.IndexByte(v, ','); i >= 0 {
			item, v = v[:i], v[i+1:]
		} else {
			item, v = v, nil
		}
		if bytes.EqualFold(bytes.TrimSpace(item), []byte(token)) {
			return true
		}
	}
	return false
}

func discardChunked(br *bufio.Reader) (int64, error) {
	var total int64
	for {
		line, err := readLine(br)
		if err != nil {
			return total, err
		}
		if i := bytes.IndexByte(line, ';'); i >= 0 {
			line = line[:i]
		}
		line = bytes.TrimSpace(line)
		if len(line) == 0 || len(line) > 15 {
			return total, fmt.Errorf("%w: bad chunk size %.20q", ErrMalformedResponse, line)
		}
		size, err := strconv.ParseInt(unsafeString(line), 16, 64)
		if err != nil || size < 0 {
			return total, fmt.Errorf("%w: bad chunk size %.20q", ErrMalformedResponse, line)
		}
		if size == 0 {
			for n := 0; ; n++ { // trailers end with an empty line
				if n == maxHeaderLines {
					return total, fmt.Errorf("%w: too many trailer lines", ErrMalformedResponse)
				}
				line, err := readLine(br)
				if err != nil {
					return total, err
				}
				if len(line) == 0 {
					return total, nil
				}
			}
		}
		n, err := br.Discard(int(size))
		total += int64(n)
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return total, err
		}
		crlf, err := readLine(br)
		if err != nil {
			return total, err
		}
		if len(crlf) != 0 {
			return total, fmt.Errorf("%w: chunk not followed by CRLF", ErrMalformedResponse)
		}
	}
}

// Ready implements SplitSession.
func (s *http1Session) Ready(p *Prepared) bool {
	hr, ok := p.Encoded.(*http1Request)
	return ok && s.serves(hr) && s.used && !s.c.opts.DisableKeepAlive
}

// Idle implements SplitSession.
func (s *http1Session) Idle(ctx context.Context) {
	if s.ctx != ctx {
		s.watch(ctx)
	}
	s.conn.SetDeadline(time.Time{})
	s.armed = time.Time{}
	// The run may have ended since the caller last looked: then the watcher has already
	// set its past deadline, which the line above just cleared, and Await would wait
	// on an idle connection for ever. The watcher only fires after ctx is done, so
	// looking after clearing loses no wake-up.
	if ctx.Err() != nil {
		s.conn.SetDeadline(time.Unix(1, 0))
		s.armed = time.Unix(1, 0)
	}
}

// Send implements SplitSession. It only touches the connection, which is safe while
// Await blocks reading it.
func (s *http1Session) Send(p *Prepared, deadline time.Time) error {
	hr := p.Encoded.(*http1Request)
	err := s.arm(deadline)
	if err == nil {
		_, err = s.conn.Write(hr.wire)
	}
	if err != nil {
		s.conn.SetDeadline(time.Unix(1, 0)) // no response will come: wake Await
		s.armed = time.Unix(1, 0)
		s.broken = true
	}
	return err
}

// Await implements SplitSession.
func (s *http1Session) Await(p *Prepared, out *Outcome) error {
	hr := p.Encoded.(*http1Request)
	*out = Outcome{}
	if _, err := s.br.Peek(1); err != nil {
		return err
	}
	out.FirstByte = time.Now()
	resp, err := ReadResponse(s.br, hr.noBody)
	out.Status, out.BytesIn, out.Close = resp.Status, resp.BodyBytes, resp.Close
	return err
}
