package load

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// NewH2Client returns an HTTP/2 client. http:// URLs are spoken in cleartext with prior
// knowledge (h2c, as h2load and curl --http2-prior-knowledge do: no Upgrade from
// HTTP/1.1, which would put an HTTP/1.1 round trip in every first request); https:// URLs
// use TLS with ALPN h2, configured by tlsConfig (nil: system roots). Either way the
// client refuses to fall back to HTTP/1.1, so a run labelled HTTP/2 measured HTTP/2.
//
// A session carries one request at a time. By default it has a connection of its own, so
// N sessions are N connections, as with the HTTP/1.1 client (and h2load -c N -m 1); with
// ClientOptions.Streams = m, every m sessions share one connection as concurrent streams
// (h2load -m m). With DisableKeepAlive every request opens its own connection and
// Streams does not apply.
//
// The client speaks the protocol itself over x/net's framer and HPACK coder, as h2load
// does over nghttp2: a request is one buffered write of its frames and one wake-up of
// its session when the connection's reader sees the stream end. net/http's
// general-purpose transport took 2.7 times h2load's CPU per request here; this client
// takes 1.3 to 1.6 times (scripts/bench-load.sh, 4 connections of 8 streams). Those
// wake-ups are most of it, so closed runs in cleartext with keep-alive do not come here:
// runClosedH2Epoll (epollh2.go) drives all their connections from one event loop.
func NewH2Client(o ClientOptions, tlsConfig *tls.Config) Client {
	c := &h2Client{opts: o, dial: o.dial(), tls: tlsConfig}
	c.conns = connGroup[*h2Conn]{size: o.streams(), newConn: func() *h2Conn { return &h2Conn{c: c} }}
	return c
}

// Flow-control windows the client grants: h2load's defaults (-w 30 -W 30), so that a
// response never waits for a window update on any path we measure.
const (
	h2StreamWindow = 1 << 30
	h2ConnWindow   = 1 << 30
	// h2UpdateAt is how much received data a window update waits for.
	h2UpdateAt = 1 << 29
)

type h2Client struct {
	opts  ClientOptions
	dial  DialFunc
	tls   *tls.Config
	conns connGroup[*h2Conn]
}

// h2Request is a request ready for the wire: its header fields in HTTP/2 form.
type h2Request struct {
	addr       string // host:port to dial
	serverName string // for TLS
	https      bool
	fields     []hpack.HeaderField // pseudo-headers first
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
	hr := &h2Request{https: u.Scheme == "https", addr: u.Host, serverName: u.Hostname()}
	if u.Port() == "" {
		port := "80"
		if hr.https {
			port = "443"
		}
		hr.addr = net.JoinHostPort(u.Hostname(), port)
	}
	authority := u.Host
	if h := r.Header.Get("Host"); h != "" {
		authority = h
	}
	hr.fields = []hpack.HeaderField{
		{Name: ":method", Value: method},
		{Name: ":scheme", Value: u.Scheme},
		{Name: ":authority", Value: authority},
		{Name: ":path", Value: u.RequestURI()},
	}
	agent := false
	for k, vs := range r.Header {
		if !validToken(k) {
			return nil, fmt.Errorf("header name %q is not a valid HTTP token", k)
		}
		name := strings.ToLower(k)
		switch name {
		case "host":
			continue // sent as :authority
		case "connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade":
			continue // connection-specific, forbidden in HTTP/2 (RFC 9113 8.2.2), dropped as net/http does
		case "user-agent":
			agent = true
		}
		for _, v := range vs {
			hr.fields = append(hr.fields, hpack.HeaderField{Name: name, Value: v})
		}
	}
	if !agent {
		hr.fields = append(hr.fields, hpack.HeaderField{Name: "user-agent", Value: "meshmark"}) // as the HTTP/1.1 client
	}
	if len(r.Body) > 0 || method == "POST" || method == "PUT" || method == "PATCH" {
		hr.fields = append(hr.fields, hpack.HeaderField{Name: "content-length", Value: strconv.Itoa(len(r.Body))})
	}
	return &Prepared{Request: r, Encoded: hr}, nil
}

func (c *h2Client) NewSession() Session {
	conn := c.conns.join()
	conn.enter()
	return &h2Session{conn: conn, st: h2Stream{done: make(chan struct{}, 1)}}
}

// h2Conn is one shared connection slot: the live connection of its sessions, replaced
// when it fails or the server sends GOAWAY.
type h2Conn struct {
	c *h2Client
	sharers
	mu   sync.Mutex
	link *h2Link
}

// get returns a live connection, dialing one by deadline if needed; dialed says it did.
func (hc *h2Conn) get(ctx context.Context, hr *h2Request, deadline time.Time) (l *h2Link, dialed bool, err error) {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	if hc.link != nil && hc.link.usable() {
		return hc.link, false, nil
	}
	if hc.link != nil {
		hc.link.retire()
		hc.link = nil
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	l, err = hc.c.open(ctx, hr)
	if err != nil {
		return nil, false, err
	}
	hc.link = l
	return l, true, nil
}

func (hc *h2Conn) close() {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	if hc.link != nil {
		hc.link.retire()
		hc.link = nil
	}
}

// open dials, does TLS with ALPN h2 for https, sends the connection preface with the
// client's settings, and returns once the server's settings arrived.
func (c *h2Client) open(ctx context.Context, hr *h2Request) (*h2Link, error) {
	nc, err := c.dial(ctx, "tcp", hr.addr)
	if err != nil {
		return nil, err
	}
	if hr.https {
		conf := &tls.Config{}
		if c.tls != nil {
			conf = c.tls.Clone()
		}
		if conf.ServerName == "" {
			conf.ServerName = hr.serverName
		}
		conf.NextProtos = []string{http2.NextProtoTLS}
		tc := tls.Client(nc, conf)
		if err := tc.HandshakeContext(ctx); err != nil {
			nc.Close()
			return nil, err
		}
		if p := tc.ConnectionState().NegotiatedProtocol; p != http2.NextProtoTLS {
			tc.Close()
			return nil, fmt.Errorf("TLS server at %s did not agree to HTTP/2 (ALPN %q)", hr.addr, p)
		}
		nc = tc
	}
	size := c.opts.ReadBufferSize
	if size <= 0 {
		size = 16 << 10
	}
	l := &h2Link{nc: nc, bw: bufio.NewWriterSize(nc, 16<<10), nextID: 1, streams: map[uint32]*h2Stream{},
		sendWin: 65535, initSendWin: 65535, maxFrame: 16384, maxStreams: 1 << 31,
		settled: make(chan struct{}), dead: make(chan struct{})}
	l.cond.L = &l.smu
	l.henc = hpack.NewEncoder(&l.hbuf)
	l.fr = http2.NewFramer(l.bw, bufio.NewReaderSize(nc, size))
	l.fr.SetReuseFrames()
	l.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	l.fr.MaxHeaderListSize = 1 << 20
	if d, ok := ctx.Deadline(); ok {
		err = nc.SetWriteDeadline(d)
	}
	if err == nil {
		_, err = l.bw.WriteString(http2.ClientPreface)
	}
	if err == nil {
		err = l.fr.WriteSettings(
			http2.Setting{ID: http2.SettingEnablePush, Val: 0},
			http2.Setting{ID: http2.SettingInitialWindowSize, Val: h2StreamWindow},
			http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: 1 << 20},
		)
	}
	if err == nil {
		err = l.fr.WriteWindowUpdate(0, h2ConnWindow-65535)
	}
	if err == nil {
		err = l.bw.Flush()
	}
	if err != nil {
		nc.Close()
		return nil, err
	}
	go l.read()
	// The first request waits for the server's settings: sent before them, streams
	// beyond its concurrency limit would be refused.
	select {
	case <-l.settled:
		return l, nil
	case <-l.dead:
		return nil, l.failure()
	case <-ctx.Done():
		l.fail(fmt.Errorf("no HTTP/2 settings from %s: %w", hr.addr, ctx.Err()))
		return nil, l.failure()
	}
}

// h2Link is one HTTP/2 connection.
type h2Link struct {
	nc net.Conn

	wmu    sync.Mutex // the write side: frames, HPACK encoder, stream ids
	bw     *bufio.Writer
	fr     *http2.Framer // writes under wmu; reads in read alone
	henc   *hpack.Encoder
	hbuf   bytes.Buffer
	nextID uint32

	smu         sync.Mutex // the streams and the peer's limits
	cond        sync.Cond  // on smu: a window opened, a stream ended, or the link failed
	streams     map[uint32]*h2Stream
	sendWin     int64 // connection send window
	initSendWin int64
	maxFrame    uint32
	maxStreams  uint32
	reserved    int // streams past the concurrency check, not yet registered
	goAway      bool
	retired     bool
	err         error
	recvUnacked int64
	settled     chan struct{} // closed when the server's first settings are applied
	dead        chan struct{} // closed when the connection failed
}

// h2Stream is a session's request in flight; the session reuses it.
type h2Stream struct {
	id        uint32
	sendWin   int64
	status    int
	firstByte time.Time
	bytes     int64
	unacked   int64
	err       error
	done      chan struct{} // receives once when the stream ends
}

func (l *h2Link) usable() bool {
	l.smu.Lock()
	defer l.smu.Unlock()
	return l.err == nil && !l.goAway
}

// retire closes the connection once no stream is left on it.
func (l *h2Link) retire() {
	l.smu.Lock()
	l.retired = true
	idle := len(l.streams) == 0
	l.smu.Unlock()
	if idle {
		l.nc.Close()
	}
}

// end completes st with err (nil: a response); smu is held.
func (l *h2Link) end(st *h2Stream, err error) {
	if l.streams[st.id] != st {
		return
	}
	delete(l.streams, st.id)
	st.err = err
	select {
	case st.done <- struct{}{}:
	default: // cannot happen: a stream ends once and its session takes the signal
	}
	l.cond.Broadcast()
	if l.retired && len(l.streams) == 0 {
		l.nc.Close()
	}
}

// failure is why the connection failed.
func (l *h2Link) failure() error {
	l.smu.Lock()
	defer l.smu.Unlock()
	return l.err
}

// fail ends every stream with err and closes the connection.
func (l *h2Link) fail(err error) {
	l.smu.Lock()
	if l.err == nil {
		l.err = err
		close(l.dead)
	}
	for _, st := range l.streams {
		l.end(st, l.err)
	}
	l.cond.Broadcast()
	l.smu.Unlock()
	l.nc.Close()
}

// h2ControlWriteTimeout bounds the writes of the connection's own frames (settings
// and ping acknowledgements, window updates).
const h2ControlWriteTimeout = 10 * time.Second

// write runs fn on the framer and flushes, under the write lock, by deadline. A write
// that fails may have left half a frame on the wire, so it fails the connection.
func (l *h2Link) write(deadline time.Time, fn func(fr *http2.Framer) error) error {
	l.wmu.Lock()
	err := l.nc.SetWriteDeadline(deadline)
	if err == nil {
		err = fn(l.fr)
	}
	if err == nil {
		err = l.bw.Flush()
	}
	l.wmu.Unlock()
	if err != nil {
		l.fail(err)
	}
	return err
}

// control writes one of the connection's own frames.
func (l *h2Link) control(fn func(fr *http2.Framer) error) error {
	return l.write(time.Now().Add(h2ControlWriteTimeout), fn)
}

// read is the connection's reader: it ends streams and answers the peer's settings,
// pings and window updates, until the connection fails.
func (l *h2Link) read() {
	for {
		f, err := l.fr.ReadFrame()
		var se http2.StreamError
		if errors.As(err, &se) {
			// One response's headers were bad: that stream fails, the connection goes on.
			l.smu.Lock()
			if st := l.streams[se.StreamID]; st != nil {
				l.end(st, se)
			}
			l.smu.Unlock()
			if l.control(func(fr *http2.Framer) error { return fr.WriteRSTStream(se.StreamID, se.Code) }) != nil {
				return
			}
			continue
		}
		if err != nil {
			var ce http2.ConnectionError
			if errors.As(err, &ce) {
				err = fmt.Errorf("HTTP/2 protocol error from the server (not an HTTP/2 server?): %w", err)
			}
			l.fail(err)
			return
		}
		if err := l.handle(f); err != nil {
			l.fail(err)
			return
		}
	}
}

func (l *h2Link) handle(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.MetaHeadersFrame:
		l.smu.Lock()
		defer l.smu.Unlock()
		st := l.streams[f.StreamID]
		if st == nil {
			return nil
		}
		if st.status == 0 {
			status, err := strconv.Atoi(f.PseudoValue("status"))
			if err != nil {
				l.end(st, fmt.Errorf("HTTP/2 response without a valid :status %q", f.PseudoValue("status")))
				return nil
			}
			if status >= 200 { // 1xx: informational, the response is still to come
				st.status, st.firstByte = status, time.Now()
			}
		}
		if f.StreamEnded() {
			l.end(st, nil)
		}
	case *http2.DataFrame:
		n := int64(f.Length) // padding counts against the window too
		l.smu.Lock()
		st := l.streams[f.StreamID]
		l.recvUnacked += n
		connUpdate, streamUpdate := int64(0), int64(0)
		if l.recvUnacked >= h2UpdateAt {
			connUpdate, l.recvUnacked = l.recvUnacked, 0
		}
		if st != nil {
			st.bytes += int64(len(f.Data()))
			st.unacked += n
			if f.StreamEnded() {
				l.end(st, nil)
			} else if st.unacked >= h2UpdateAt {
				streamUpdate, st.unacked = st.unacked, 0
			}
		}
		l.smu.Unlock()
		if connUpdate > 0 || streamUpdate > 0 {
			return l.control(func(fr *http2.Framer) error {
				if connUpdate > 0 {
					if err := fr.WriteWindowUpdate(0, uint32(connUpdate)); err != nil {
						return err
					}
				}
				if streamUpdate > 0 {
					return fr.WriteWindowUpdate(f.StreamID, uint32(streamUpdate))
				}
				return nil
			})
		}
	case *http2.SettingsFrame:
		if f.IsAck() {
			return nil
		}
		var tableSize uint32
		var haveTableSize bool
		l.smu.Lock()
		err := f.ForeachSetting(func(s http2.Setting) error {
			switch s.ID {
			case http2.SettingInitialWindowSize:
				delta := int64(s.Val) - l.initSendWin
				l.initSendWin = int64(s.Val)
				for _, st := range l.streams {
					st.sendWin += delta
				}
			case http2.SettingMaxFrameSize:
				l.maxFrame = s.Val
			case http2.SettingMaxConcurrentStreams:
				l.maxStreams = s.Val
			case http2.SettingHeaderTableSize:
				tableSize, haveTableSize = s.Val, true
			}
			return nil
		})
		l.cond.Broadcast()
		l.smu.Unlock()
		if err != nil {
			return err
		}
		err = l.control(func(fr *http2.Framer) error {
			if haveTableSize {
				l.henc.SetMaxDynamicTableSizeLimit(tableSize)
			}
			return fr.WriteSettingsAck()
		})
		select {
		case <-l.settled:
		default:
			close(l.settled) // only the reader closes it
		}
		return err
	case *http2.WindowUpdateFrame:
		l.smu.Lock()
		if f.StreamID == 0 {
			l.sendWin += int64(f.Increment)
		} else if st := l.streams[f.StreamID]; st != nil {
			st.sendWin += int64(f.Increment)
		}
		l.cond.Broadcast()
		l.smu.Unlock()
	case *http2.PingFrame:
		if !f.IsAck() {
			return l.control(func(fr *http2.Framer) error { return fr.WritePing(true, f.Data) })
		}
	case *http2.RSTStreamFrame:
		l.smu.Lock()
		if st := l.streams[f.StreamID]; st != nil {
			l.end(st, http2.StreamError{StreamID: f.StreamID, Code: f.ErrCode})
		}
		l.smu.Unlock()
	case *http2.GoAwayFrame:
		l.smu.Lock()
		l.goAway = true
		for id, st := range l.streams {
			if id > f.LastStreamID {
				l.end(st, fmt.Errorf("HTTP/2 GOAWAY (%v) before the server took the request", f.ErrCode))
			}
		}
		l.cond.Broadcast()
		l.smu.Unlock()
	}
	return nil
}

// start sends p's headers (and body) on a new stream st.
func (l *h2Link) start(p *Prepared, hr *h2Request, st *h2Stream, deadline time.Time) error {
	if !time.Now().Before(deadline) {
		// A write deadline in the past fails the write, and with it the shared connection.
		return context.DeadlineExceeded
	}
	l.smu.Lock()
	// The server's concurrency limit: wait for a stream to end.
	if !l.await(deadline, func() bool {
		return l.err != nil || l.goAway || uint32(len(l.streams)+l.reserved) < l.maxStreams
	}) {
		l.smu.Unlock()
		return context.DeadlineExceeded
	}
	if l.err != nil || l.goAway {
		err := l.err
		l.smu.Unlock()
		if err == nil {
			err = errors.New("HTTP/2 connection going away")
		}
		return err
	}
	l.reserved++
	l.smu.Unlock()

	body := p.Request.Body
	l.wmu.Lock()
	*st = h2Stream{id: l.nextID, done: st.done}
	l.nextID += 2
	l.smu.Lock()
	l.reserved--
	if l.nextID >= 1<<31-1 {
		l.goAway = true // stream ids are spent: the next request takes a new connection
	}
	st.sendWin = l.initSendWin
	l.streams[st.id] = st
	maxFrame := int(l.maxFrame)
	l.smu.Unlock()
	l.hbuf.Reset()
	var err error
	for _, f := range hr.fields {
		if err = l.henc.WriteField(f); err != nil {
			break
		}
	}
	if err == nil {
		err = l.nc.SetWriteDeadline(deadline)
	}
	if err == nil {
		err = writeHeaderBlock(l.fr, st.id, l.hbuf.Bytes(), len(body) == 0, maxFrame)
	}
	if err == nil && len(body) == 0 {
		err = l.bw.Flush()
	}
	l.wmu.Unlock()
	if err != nil {
		l.fail(err) // the encoder's table or the wire may be half-written
		return err
	}
	if len(body) == 0 {
		return nil
	}
	return l.sendBody(st, body, deadline)
}

// writeHeaderBlock writes a header block as HEADERS and CONTINUATION frames.
func writeHeaderBlock(fr *http2.Framer, id uint32, block []byte, endStream bool, maxFrame int) error {
	first := block[:min(len(block), maxFrame)]
	rest := block[len(first):]
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: first, EndStream: endStream, EndHeaders: len(rest) == 0}); err != nil {
		return err
	}
	for len(rest) > 0 {
		chunk := rest[:min(len(rest), maxFrame)]
		rest = rest[len(chunk):]
		if err := fr.WriteContinuation(id, len(rest) == 0, chunk); err != nil {
			return err
		}
	}
	return nil
}

// await waits, with smu held, until ready() or the deadline, and reports ready().
func (l *h2Link) await(deadline time.Time, ready func() bool) bool {
	if ready() {
		return true
	}
	wake := time.AfterFunc(time.Until(deadline), func() {
		l.smu.Lock()
		l.cond.Broadcast()
		l.smu.Unlock()
	})
	defer wake.Stop()
	for !ready() && time.Now().Before(deadline) {
		l.cond.Wait()
	}
	return ready()
}

// sendBody writes body as DATA frames within the peer's flow-control windows.
func (l *h2Link) sendBody(st *h2Stream, body []byte, deadline time.Time) error {
	for len(body) > 0 {
		l.smu.Lock()
		l.await(deadline, func() bool {
			return l.err != nil || l.streams[st.id] != st || (l.sendWin > 0 && st.sendWin > 0)
		})
		switch {
		case l.err != nil:
			err := l.err
			l.smu.Unlock()
			return err
		case l.streams[st.id] != st:
			l.smu.Unlock()
			return nil // the server answered (or reset) before taking the whole body
		case l.sendWin <= 0 || st.sendWin <= 0:
			l.smu.Unlock()
			return context.DeadlineExceeded
		}
		if !time.Now().Before(deadline) {
			l.smu.Unlock()
			return context.DeadlineExceeded
		}
		n := min(int64(len(body)), l.sendWin, st.sendWin, int64(l.maxFrame))
		l.sendWin -= n
		st.sendWin -= n
		l.smu.Unlock()
		chunk := body[:n]
		body = body[n:]
		last := len(body) == 0
		if err := l.write(deadline, func(fr *http2.Framer) error { return fr.WriteData(st.id, last, chunk) }); err != nil {
			return err
		}
	}
	return nil
}

// abandon forgets st (a timeout or cancellation) and resets it on the wire.
func (l *h2Link) abandon(st *h2Stream) {
	l.smu.Lock()
	ours := l.streams[st.id] == st
	if ours {
		delete(l.streams, st.id)
		l.cond.Broadcast()
	}
	select {
	case <-st.done: // it ended as we gave up
	default:
	}
	l.smu.Unlock()
	if ours {
		_ = l.control(func(fr *http2.Framer) error { return fr.WriteRSTStream(st.id, http2.ErrCodeCancel) })
	}
}

type h2Session struct {
	conn   *h2Conn
	closed bool
	st     h2Stream
	timer  *time.Timer
}

func (s *h2Session) Do(ctx context.Context, p *Prepared, deadline time.Time, out *Outcome) error {
	hr, ok := p.Encoded.(*h2Request)
	if !ok {
		return errors.New("h2: request was not prepared by this client")
	}
	*out = Outcome{}
	s.conn.reopen(&s.closed)
	var (
		l   *h2Link
		err error
	)
	if s.conn.c.opts.DisableKeepAlive {
		dctx, cancel := context.WithDeadline(ctx, deadline)
		l, err = s.conn.c.open(dctx, hr)
		cancel()
		out.Dialed = err == nil
		if l != nil {
			defer l.retire()
		}
	} else {
		l, out.Dialed, err = s.conn.get(ctx, hr, deadline)
	}
	if err != nil {
		return err
	}
	st := &s.st
	if err := l.start(p, hr, st, deadline); err != nil {
		l.abandon(st)
		return err
	}
	if s.timer == nil {
		s.timer = time.NewTimer(time.Until(deadline))
	} else {
		s.timer.Reset(time.Until(deadline))
	}
	select {
	case <-st.done:
		s.timer.Stop()
	case <-s.timer.C:
		l.abandon(st)
		return context.DeadlineExceeded
	case <-ctx.Done():
		s.timer.Stop()
		l.abandon(st)
		return ctx.Err()
	}
	if st.err != nil {
		return st.err
	}
	out.Status, out.FirstByte, out.BytesIn = st.status, st.firstByte, st.bytes
	return nil
}

// Close closes the connection once none of the sessions sharing it is open.
func (s *h2Session) Close() error {
	if s.conn.leave(&s.closed) {
		s.conn.close()
	}
	return nil
}
