package load

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"golang.org/x/sys/unix"
)

// Cleartext HTTP/2 in the closed model, run as h2load runs it: one goroutine with its
// own epoll set owns every connection and the streams on them. The goroutine client
// (h2.go) costs a wake-up of a session's goroutine and one of its connection's reader
// per request; here the loop records a stream's END_STREAM and puts the slot's next
// request on the same connection in the same pass over what one read returned, and the
// frames of all the streams a pass started leave in one write.
//
// A slot is what a session is to the goroutine client: one request at a time; every
// ClientOptions.Streams slots in a row share a connection (a group), as connGroup
// shares sessions. A group's connection is replaced when it fails or the server sends
// GOAWAY; the old one finishes the streams the server took, the others move to the new
// one.

const (
	// Windows granted to the server, updated once half is used. A window only has to
	// cover what the server sends during one round trip for it never to wait, little on
	// the loopback and 198.18/15 targets this path serves; these are small enough that
	// a response or a run large enough to need updates can be tested.
	h2eStreamWindow = 4 << 20
	h2eConnWindow   = 64 << 20
	// h2eMaxOut bounds the output a connection queues: request bodies are framed only
	// while less is waiting for the socket.
	h2eMaxOut     = 256 << 10
	h2eReadBuffer = 64 << 10
	// h2eMaxHeaderBlock bounds a response's header block as it is gathered from
	// CONTINUATION frames; it is also the SETTINGS_MAX_HEADER_LIST_SIZE we send, which
	// bounds the decoded fields, never smaller than their encoding.
	h2eMaxHeaderBlock = 1 << 20
	h2eMaxID          = 1<<31 - 1
)

// h2EpollRuns counts the runs runClosedH2Epoll drove, so tests can tell which path ran.
var h2EpollRuns atomic.Int64

type h2eSlot struct {
	g       *h2eGroup
	t       timing
	out     Outcome
	busy    bool     // a request was claimed and is not recorded yet
	link    *h2eLink // carries the request's stream; nil while the slot waits for one
	id      uint32
	sendWin int64
	body    []byte // request body not framed yet
	unacked int64  // response DATA not yet returned to the stream's window
	headed  bool   // the final (non-1xx) response headers arrived
	moved   bool   // the request was already moved off a connection that went away
}

type h2eGroup struct {
	slots   []*h2eSlot
	cur     *h2eLink   // where new streams go; nil: dialed on the next request
	waiting []*h2eSlot // busy slots waiting for a stream on cur, oldest first
}

// h2eLink is one connection.
type h2eLink struct {
	g       *h2eGroup
	fd      int // -1 once closed
	tag     int32
	dialed  time.Time
	settled bool // the server's first SETTINGS arrived: streams may open
	goAway  bool // no new streams: the server sent GOAWAY or the stream ids are spent
	streams map[uint32]*h2eSlot
	nextID  uint32

	// what the server's settings and window updates allow
	sendWin     int64
	initSendWin int64
	maxFrame    int
	maxStreams  uint32
	sending     []*h2eSlot // streams with request body left, in the order they opened

	enc  *hpack.Encoder
	hbuf bytes.Buffer
	// steady is a request header block made only of references to table entries, so
	// that sending it leaves the server's decoder as it found it and it can be sent
	// again as is; nil until the encoder produced one, and after the server changed its
	// table size.
	steady []byte

	dec      *statusDecoder
	blockID  uint32 // the stream whose header block goes on in CONTINUATION; 0: none
	blockEnd bool   // that block's HEADERS ended the stream
	block    []byte // its fragments so far

	in          []byte
	n           int
	out         []byte // frames not written yet
	dirty       bool   // in the loop's list of connections to flush
	writeWait   bool   // waiting for the socket to take more (EPOLLOUT watched)
	recvUnacked int64  // DATA not yet returned to the connection's window
}

type h2eLoop struct {
	e        *engine
	ctx      context.Context
	hr       *h2Request
	body     []byte
	set      *epollSet
	dial     DialFunc
	readSize int
	groups   []*h2eGroup
	links    []*h2eLink // by epoll tag; nil: free
	free     []int32
	dirty    []*h2eLink
	active   int       // slots not retired
	readAt   time.Time // when the read being parsed returned
}

// runClosedH2Epoll runs the closed model for the HTTP/2 client in cleartext with
// keep-alive and no rate limit; false means it did not start and the goroutine path
// must run.
func (e *engine) runClosedH2Epoll(ctx context.Context, p *Prepared) bool {
	c, ok := e.cfg.Client.(*h2Client)
	if !ok || c.opts.DisableKeepAlive || e.cfg.Closed.Rate > 0 {
		return false
	}
	hr, ok := p.Encoded.(*h2Request)
	if !ok || hr.https {
		return false
	}
	set, err := newEpollSet(epollTick)
	if err != nil {
		return false
	}
	defer set.Close()
	l := &h2eLoop{e: e, ctx: ctx, hr: hr, body: p.Request.Body, set: set, dial: c.dial,
		readSize: max(c.opts.ReadBufferSize, h2eReadBuffer)}
	n, m := e.cfg.Closed.Connections, c.opts.streams()
	for i := 0; i < n; i += m {
		g := &h2eGroup{}
		for range min(m, n-i) {
			g.slots = append(g.slots, &h2eSlot{g: g})
		}
		l.groups = append(l.groups, g)
	}
	// The first connection decides: if it gives no file descriptor, use goroutines.
	k, err := l.connect(l.groups[0])
	if errors.Is(err, errNoFD) {
		return false
	}
	l.groups[0].cur = k
	h2EpollRuns.Add(1)
	l.run()
	return true
}

func (l *h2eLoop) run() {
	now := time.Now()
	for _, g := range l.groups {
		l.active += len(g.slots)
		for _, s := range g.slots {
			l.next(s, now)
		}
	}
	events := make([]unix.EpollEvent, max(64, 2*len(l.groups)+2))
	lastCheck := now
	for l.active > 0 {
		l.flush()
		n, err := l.set.waitBusy(events)
		if err != nil && err != unix.EINTR {
			l.abort(err)
			break
		}
		for i := 0; i < n; i++ {
			ev := events[i]
			if ev.Fd < 0 || int(ev.Fd) >= len(l.links) {
				continue // the tick: checked below
			}
			k := l.links[ev.Fd]
			if k == nil {
				continue
			}
			if ev.Events&unix.EPOLLOUT != 0 {
				l.write(k)
			}
			if k.fd >= 0 && ev.Events&^unix.EPOLLOUT != 0 {
				l.readable(k)
			}
		}
		if now := time.Now(); now.Sub(lastCheck) >= epollTick || l.e.hard.Err() != nil {
			lastCheck = now
			l.expire(now)
			runtime.Gosched() // waitBusy holds the processor: let the others have it
		}
	}
	for _, k := range l.links {
		if k != nil {
			l.close(k)
		}
	}
}

// connect dials a connection for g and queues the connection preface, our settings and
// the connection window; streams wait for the server's settings.
func (l *h2eLoop) connect(g *h2eGroup) (*h2eLink, error) {
	ctx, cancel := context.WithTimeout(l.e.hard, l.e.cfg.Timeout)
	fd, err := dialFD(ctx, l.dial, l.hr.addr)
	cancel()
	if err != nil {
		return nil, err
	}
	k := &h2eLink{g: g, fd: fd, dialed: time.Now(), streams: map[uint32]*h2eSlot{}, nextID: 1,
		sendWin: 65535, initSendWin: 65535, maxFrame: 16384, maxStreams: h2eMaxID,
		in: make([]byte, l.readSize)}
	if n := len(l.free); n > 0 {
		k.tag, l.free = l.free[n-1], l.free[:n-1]
	} else {
		k.tag = int32(len(l.links))
		l.links = append(l.links, nil)
	}
	if err := l.set.add(fd, k.tag); err != nil {
		unix.Close(fd)
		l.free = append(l.free, k.tag)
		return nil, err
	}
	l.links[k.tag] = k
	// A connection serves many requests here, so it is counted when dialed rather than
	// through the Outcome of one of them.
	l.e.dialed.Add(1)
	k.enc = hpack.NewEncoder(&k.hbuf)
	k.dec = newStatusDecoder()
	k.out = append(k.out, http2.ClientPreface...)
	k.out = appendFrameHeader(k.out, 3*6, http2.FrameSettings, 0, 0)
	k.out = appendSetting(k.out, http2.SettingEnablePush, 0)
	k.out = appendSetting(k.out, http2.SettingInitialWindowSize, h2eStreamWindow)
	k.out = appendSetting(k.out, http2.SettingMaxHeaderListSize, h2eMaxHeaderBlock)
	k.out = appendWindowUpdate(k.out, 0, h2eConnWindow-65535)
	l.markDirty(k)
	return k, nil
}

func (l *h2eLoop) close(k *h2eLink) {
	if k.fd < 0 {
		return
	}
	l.set.del(k.fd)
	unix.Close(k.fd)
	k.fd = -1
	l.links[k.tag] = nil
	l.free = append(l.free, k.tag)
	if k.g.cur == k {
		k.g.cur = nil
	}
}

func (l *h2eLoop) markDirty(k *h2eLink) {
	if !k.dirty && k.fd >= 0 {
		k.dirty = true
		l.dirty = append(l.dirty, k)
	}
}

// flush writes what the connections queued.
func (l *h2eLoop) flush() {
	// failures met while writing may start requests on other connections: they are
	// appended and written in the same pass
	for i := 0; i < len(l.dirty); i++ {
		k := l.dirty[i]
		k.dirty = false
		l.write(k)
	}
	l.dirty = l.dirty[:0]
}

// write writes k's queued frames, framing more of the request bodies as the socket
// takes them.
func (l *h2eLoop) write(k *h2eLink) {
	for k.fd >= 0 && len(k.out) > 0 {
		n, err := rawWrite(k.fd, k.out)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			if !k.writeWait && l.set.watchWrite(k.fd, k.tag, true) == nil {
				k.writeWait = true
			}
			return
		case err != nil:
			l.fail(k, &net.OpError{Op: "write", Net: "tcp", Err: err})
			return
		}
		k.out = k.out[:copy(k.out, k.out[n:])]
		if len(k.out) == 0 && len(k.sending) > 0 {
			l.pump(k)
		}
	}
	if k.writeWait && k.fd >= 0 && l.set.watchWrite(k.fd, k.tag, false) == nil {
		k.writeWait = false
	}
}

// next starts s's next request, or retires s when the run is over.
func (l *h2eLoop) next(s *h2eSlot, now time.Time) {
	for {
		if l.ctx.Err() != nil || l.e.hard.Err() != nil || !l.e.claim() {
			l.active--
			return
		}
		s.t = l.e.beginAt(now, now) // intended when the slot is free, as it is now
		s.out, s.busy, s.moved = Outcome{}, true, false
		err := l.assign(s)
		if err == nil {
			return
		}
		l.record(s, err)
		now = s.t.done
	}
}

// assign queues s for a stream on its group's connection, dialing one if needed.
func (l *h2eLoop) assign(s *h2eSlot) error {
	g := s.g
	if g.cur == nil {
		k, err := l.connect(g)
		if err != nil {
			return err
		}
		g.cur = k
	}
	g.waiting = append(g.waiting, s)
	l.promote(g)
	return nil
}

// promote opens streams for g's waiting slots as far as the server allows.
func (l *h2eLoop) promote(g *h2eGroup) {
	k := g.cur
	if k == nil || !k.settled {
		return
	}
	i := 0
	for ; i < len(g.waiting) && !k.goAway && uint32(len(k.streams)) < k.maxStreams; i++ {
		l.open(k, g.waiting[i])
	}
	g.waiting = g.waiting[:copy(g.waiting, g.waiting[i:])]
	if k.goAway {
		l.retire(k)
	}
}

// open starts s's request on a new stream of k.
func (l *h2eLoop) open(k *h2eLink, s *h2eSlot) {
	id := k.nextID
	k.nextID += 2
	if k.nextID > h2eMaxID {
		k.goAway = true // the ids are spent: the next streams take a new connection
	}
	k.streams[id] = s
	s.link, s.id, s.sendWin, s.unacked, s.headed = k, id, k.initSendWin, 0, false
	k.out = appendHeaders(k.out, id, k.headerBlock(l.hr.fields), len(l.body) == 0, k.maxFrame)
	if len(l.body) > 0 {
		s.body = l.body
		k.sending = append(k.sending, s)
		l.pump(k)
	}
	l.markDirty(k)
}

// headerBlock encodes the request's header fields. The first block inserts them into
// the server's dynamic table (those that fit in the size its settings allow) and the
// next one refers to them by index; once a block is references only, it is reused.
func (k *h2eLink) headerBlock(fields []hpack.HeaderField) []byte {
	if k.steady != nil {
		return k.steady
	}
	k.hbuf.Reset()
	for _, f := range fields {
		k.enc.WriteField(f) // cannot fail: it writes to a bytes.Buffer
	}
	b := k.hbuf.Bytes()
	if onlyIndexed(b) {
		k.steady = slices.Clone(b)
	}
	return b
}

// onlyIndexed reports whether an HPACK block is nothing but indexed header fields
// (RFC 7541 6.1), which leave the dynamic table unchanged.
func onlyIndexed(b []byte) bool {
	for i := 0; i < len(b); {
		c := b[i]
		i++
		if c&0x80 == 0 {
			return false
		}
		if c&0x7f == 0x7f { // the index goes on in 7-bit groups, the last one below 0x80
			for i < len(b) && b[i]&0x80 != 0 {
				i++
			}
			i++
		}
	}
	return len(b) > 0
}

// pump frames request body as DATA within the flow-control windows, a frame per
// stream in turn.
func (l *h2eLoop) pump(k *h2eLink) {
	for len(k.sending) > 0 && k.sendWin > 0 && len(k.out) < h2eMaxOut {
		progress := false
		for i := 0; i < len(k.sending) && k.sendWin > 0 && len(k.out) < h2eMaxOut; {
			s := k.sending[i]
			n := int(min(int64(len(s.body)), int64(k.maxFrame), k.sendWin, s.sendWin))
			if n <= 0 {
				i++
				continue
			}
			var flags http2.Flags
			if n == len(s.body) {
				flags = http2.FlagDataEndStream
			}
			k.out = appendFrameHeader(k.out, n, http2.FrameData, flags, s.id)
			k.out = append(k.out, s.body[:n]...)
			s.body = s.body[n:]
			k.sendWin -= int64(n)
			s.sendWin -= int64(n)
			progress = true
			if len(s.body) == 0 {
				k.sending = slices.Delete(k.sending, i, i+1)
			} else {
				i++
			}
		}
		if !progress {
			break
		}
	}
	l.markDirty(k)
}

// record records s's request with err (nil: its response).
func (l *h2eLoop) record(s *h2eSlot, err error) {
	s.busy, s.link, s.body = false, nil, nil
	l.e.finish(&s.t, &s.out, err)
}

// detach takes s's stream off k, closing k when it was going away and that was its
// last stream.
func (l *h2eLoop) detach(k *h2eLink, s *h2eSlot) {
	delete(k.streams, s.id)
	if len(s.body) > 0 {
		k.sending = slices.DeleteFunc(k.sending, func(x *h2eSlot) bool { return x == s })
		s.body = nil
	}
	s.link = nil
	if k.goAway && len(k.streams) == 0 {
		l.close(k)
	}
}

// end records s's request on k with err (nil: its response) and goes on with s.
func (l *h2eLoop) end(k *h2eLink, s *h2eSlot, err error) {
	l.detach(k, s)
	l.record(s, err)
	l.next(s, s.t.done)
	l.promote(s.g) // when s retired, its stream may be what a waiting slot needs
}

// reset ends s's stream with RST_STREAM and records its request with err.
func (l *h2eLoop) reset(k *h2eLink, s *h2eSlot, code http2.ErrCode, err error) {
	k.out = appendRSTStream(k.out, s.id, code)
	l.markDirty(k)
	l.end(k, s, err)
}

// retire stops k from taking streams; it closes once its streams are done, and the
// slots waiting for it get a new connection.
func (l *h2eLoop) retire(k *h2eLink) {
	k.goAway = true
	g := k.g
	if g.cur == k {
		g.cur = nil
	}
	if len(k.streams) == 0 {
		l.close(k)
	}
	if g.cur != nil || len(g.waiting) == 0 {
		return
	}
	nk, err := l.connect(g)
	if err == nil {
		g.cur = nk
		return
	}
	failed := slices.Clone(g.waiting)
	g.waiting = g.waiting[:0]
	for _, s := range failed {
		l.record(s, err)
	}
	for _, s := range failed {
		l.next(s, s.t.done)
	}
}

// fail gives k up: its requests, and those waiting for it, are recorded with err.
func (l *h2eLoop) fail(k *h2eLink, err error) {
	g := k.g
	var hit []*h2eSlot
	for _, s := range k.streams {
		hit = append(hit, s)
	}
	if g.cur == k {
		hit = append(hit, g.waiting...)
		g.waiting = g.waiting[:0]
	}
	clear(k.streams)
	k.sending = nil
	l.close(k)
	for _, s := range hit {
		l.record(s, err)
	}
	for _, s := range hit {
		l.next(s, s.t.done)
	}
}

// lost handles the end of k's input: an error unless nothing depended on k.
func (l *h2eLoop) lost(k *h2eLink, err error) {
	if len(k.streams) == 0 && (k.g.cur != k || len(k.g.waiting) == 0) {
		l.close(k) // idle, or drained after GOAWAY: the next request dials
		return
	}
	l.fail(k, err)
}

// protocolError gives k up after the server broke the protocol, telling it why first
// (RFC 9113 5.4.1), as far as the socket takes it at once.
func (l *h2eLoop) protocolError(k *h2eLink, err error) {
	code := http2.ErrCodeProtocol
	var ce http2.ConnectionError
	if errors.As(err, &ce) {
		code = http2.ErrCode(ce)
	}
	k.out = appendFrameHeader(k.out, 8, http2.FrameGoAway, 0, 0)
	k.out = binary.BigEndian.AppendUint32(k.out, 0) // no stream of the server's was taken
	k.out = binary.BigEndian.AppendUint32(k.out, uint32(code))
	rawWrite(k.fd, k.out)
	l.fail(k, fmt.Errorf("HTTP/2 protocol error from the server (not an HTTP/2 server?): %w", err))
}

// connError is a violation of the protocol, with the code RFC 9113 gives it.
func connError(code http2.ErrCode, format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), http2.ConnectionError(code))
}

// expire resets requests past their deadline (the connection stays) and gives up
// connections that got no settings in time; once the run is cut off it ends all.
func (l *h2eLoop) expire(now time.Time) {
	if l.e.hard.Err() != nil {
		l.abort(context.Canceled)
		return
	}
	timeout := l.e.cfg.Timeout
	for _, k := range l.links {
		if k != nil && !k.settled && now.Sub(k.dialed) >= timeout {
			l.fail(k, fmt.Errorf("no HTTP/2 settings from %s: %w", l.hr.addr, context.DeadlineExceeded))
		}
	}
	for _, g := range l.groups {
		for _, s := range g.slots {
			if !s.busy || now.Before(s.t.sent.Add(timeout)) {
				continue
			}
			if k := s.link; k != nil {
				l.reset(k, s, http2.ErrCodeCancel, context.DeadlineExceeded)
				continue
			}
			g.waiting = slices.DeleteFunc(g.waiting, func(x *h2eSlot) bool { return x == s })
			l.record(s, context.DeadlineExceeded)
			l.next(s, s.t.done)
		}
	}
}

// abort ends the loop: the requests in flight are recorded with err (as aborted once
// the run is cut off).
func (l *h2eLoop) abort(err error) {
	for _, g := range l.groups {
		g.waiting = g.waiting[:0]
		for _, s := range g.slots {
			if s.busy {
				if k := s.link; k != nil {
					l.detach(k, s)
				}
				l.record(s, err)
				l.active--
			}
		}
	}
}

// readable reads what k's socket holds and handles the whole frames in it.
func (l *h2eLoop) readable(k *h2eLink) {
	m, err := rawRead(k.fd, k.in[k.n:])
	if err == unix.EAGAIN || err == unix.EINTR {
		return
	}
	if err != nil || m == 0 {
		switch {
		case err != nil:
			err = &net.OpError{Op: "read", Net: "tcp", Err: err}
		case bytes.HasPrefix(k.in[:k.n], []byte("HTTP/1.")):
			err = fmt.Errorf("the server answered in HTTP/1.x, not HTTP/2: %w", io.ErrUnexpectedEOF)
		case k.n > 0:
			err = io.ErrUnexpectedEOF
		default:
			err = io.EOF
		}
		l.lost(k, err)
		return
	}
	l.readAt = time.Now()
	k.n += m
	p := 0
	for k.fd >= 0 && k.n-p >= 9 {
		b := k.in[p:k.n]
		length := int(b[0])<<16 | int(b[1])<<8 | int(b[2])
		if len(b) < 9+length {
			if 9+length > len(k.in) {
				// Frames above our SETTINGS_MAX_FRAME_SIZE are read as the goroutine
				// client's framer reads them, so that both fail alike on a server that
				// is not HTTP/2 (an HTTP/1.1 response reads as a frame header of some
				// megabytes; the server closes before they come).
				k.in = append(k.in[:k.n], make([]byte, 9+length-k.n)...)
			}
			break
		}
		typ, flags := http2.FrameType(b[3]), http2.Flags(b[4])
		id := binary.BigEndian.Uint32(b[5:]) & h2eMaxID
		p += 9 + length
		if err := l.frame(k, typ, flags, id, b[9:9+length]); err != nil {
			if k.fd >= 0 {
				l.protocolError(k, err)
			}
			return
		}
	}
	if k.fd >= 0 {
		k.n = copy(k.in, k.in[p:k.n])
	}
}

// frame handles one frame from the server.
func (l *h2eLoop) frame(k *h2eLink, typ http2.FrameType, flags http2.Flags, id uint32, payload []byte) error {
	if k.blockID != 0 && typ != http2.FrameContinuation {
		return connError(http2.ErrCodeProtocol, "%v frame inside a header block", typ)
	}
	switch typ {
	case http2.FrameData:
		if id == 0 {
			return connError(http2.ErrCodeProtocol, "DATA on stream 0")
		}
		data, err := unpad(flags, payload)
		if err != nil {
			return err
		}
		// the whole payload, padding included, counts against the windows
		if k.recvUnacked += int64(len(payload)); k.recvUnacked >= h2eConnWindow/2 {
			k.out = appendWindowUpdate(k.out, 0, uint32(k.recvUnacked))
			k.recvUnacked = 0
			l.markDirty(k)
		}
		s := k.streams[id]
		if s == nil {
			return nil // a stream we reset
		}
		s.out.BytesIn += int64(len(data))
		if flags.Has(http2.FlagDataEndStream) {
			l.complete(k, s)
			return nil
		}
		if s.unacked += int64(len(payload)); s.unacked >= h2eStreamWindow/2 {
			k.out = appendWindowUpdate(k.out, id, uint32(s.unacked))
			s.unacked = 0
			l.markDirty(k)
		}
	case http2.FrameHeaders:
		if id == 0 {
			return connError(http2.ErrCodeProtocol, "HEADERS on stream 0")
		}
		frag, err := unpad(flags, payload)
		if err != nil {
			return err
		}
		if flags.Has(http2.FlagHeadersPriority) {
			if len(frag) < 5 {
				return connError(http2.ErrCodeFrameSize, "HEADERS too short for its priority")
			}
			frag = frag[5:]
		}
		if !flags.Has(http2.FlagHeadersEndHeaders) {
			k.blockID, k.blockEnd = id, flags.Has(http2.FlagHeadersEndStream)
			k.block = append(k.block[:0], frag...)
			return nil
		}
		return l.headerBlock(k, id, frag, flags.Has(http2.FlagHeadersEndStream))
	case http2.FrameContinuation:
		if k.blockID == 0 || id != k.blockID {
			return connError(http2.ErrCodeProtocol, "CONTINUATION outside a header block")
		}
		if k.block = append(k.block, payload...); len(k.block) > h2eMaxHeaderBlock {
			return connError(http2.ErrCodeEnhanceYourCalm, "response header block above %d bytes", h2eMaxHeaderBlock)
		}
		if flags.Has(http2.FlagContinuationEndHeaders) {
			k.blockID = 0
			return l.headerBlock(k, id, k.block, k.blockEnd)
		}
	case http2.FrameRSTStream:
		if len(payload) != 4 {
			return connError(http2.ErrCodeFrameSize, "RST_STREAM of %d bytes", len(payload))
		}
		if s := k.streams[id]; s != nil {
			l.end(k, s, http2.StreamError{StreamID: id, Code: http2.ErrCode(binary.BigEndian.Uint32(payload))})
		}
	case http2.FrameSettings:
		if flags.Has(http2.FlagSettingsAck) {
			return nil
		}
		if len(payload)%6 != 0 || id != 0 {
			return connError(http2.ErrCodeFrameSize, "malformed SETTINGS")
		}
		return l.settings(k, payload)
	case http2.FramePing:
		if len(payload) != 8 {
			return connError(http2.ErrCodeFrameSize, "PING of %d bytes", len(payload))
		}
		if !flags.Has(http2.FlagPingAck) {
			k.out = appendFrameHeader(k.out, 8, http2.FramePing, http2.FlagPingAck, 0)
			k.out = append(k.out, payload...)
			l.markDirty(k)
		}
	case http2.FrameGoAway:
		if len(payload) < 8 {
			return connError(http2.ErrCodeFrameSize, "GOAWAY of %d bytes", len(payload))
		}
		l.goAway(k, binary.BigEndian.Uint32(payload)&h2eMaxID, http2.ErrCode(binary.BigEndian.Uint32(payload[4:])))
	case http2.FrameWindowUpdate:
		if len(payload) != 4 {
			return connError(http2.ErrCodeFrameSize, "WINDOW_UPDATE of %d bytes", len(payload))
		}
		inc := int64(binary.BigEndian.Uint32(payload) & h2eMaxID)
		if id == 0 {
			if k.sendWin += inc; k.sendWin > h2eMaxID {
				return connError(http2.ErrCodeFlowControl, "connection window above 2^31-1")
			}
		} else if s := k.streams[id]; s != nil {
			if s.sendWin += inc; s.sendWin > h2eMaxID {
				l.reset(k, s, http2.ErrCodeFlowControl, http2.StreamError{StreamID: id, Code: http2.ErrCodeFlowControl})
				return nil
			}
		}
		if len(k.sending) > 0 {
			l.pump(k)
		}
	case http2.FramePushPromise:
		return connError(http2.ErrCodeProtocol, "PUSH_PROMISE, though the client disabled push")
	}
	// PRIORITY and frames of unknown types are ignored (RFC 9113 4.1, 5.5)
	return nil
}

// unpad strips a DATA or HEADERS frame's padding.
func unpad(flags http2.Flags, payload []byte) ([]byte, error) {
	if !flags.Has(http2.FlagDataPadded) { // the same bit as FlagHeadersPadded
		return payload, nil
	}
	if len(payload) == 0 || int(payload[0]) >= len(payload) {
		return nil, connError(http2.ErrCodeProtocol, "padding longer than the frame")
	}
	return payload[1 : len(payload)-int(payload[0])], nil
}

// headerBlock decodes a whole header block of stream id, which every block must be to
// keep the table in step, and takes the response's status from it; endStream: its
// HEADERS ended the stream.
func (l *h2eLoop) headerBlock(k *h2eLink, id uint32, block []byte, endStream bool) error {
	status, bad, err := k.dec.decode(block)
	if err != nil {
		return connError(http2.ErrCodeCompression, "response header block: %v", err)
	}
	s := k.streams[id]
	if s == nil {
		return nil // a stream we reset
	}
	if !s.headed { // else trailers
		if status <= 0 {
			l.reset(k, s, http2.ErrCodeProtocol, fmt.Errorf("HTTP/2 response without a valid :status %q", bad))
			return nil
		}
		if status >= 200 { // 1xx: informational, the response is still to come
			s.headed, s.out.Status, s.out.FirstByte = true, status, l.readAt
		}
	}
	if endStream {
		l.complete(k, s)
	}
	return nil
}

// complete records the response that ended s's stream.
func (l *h2eLoop) complete(k *h2eLink, s *h2eSlot) {
	if len(s.body) > 0 {
		// the server answered before taking the whole body, which would go nowhere
		k.out = appendRSTStream(k.out, s.id, http2.ErrCodeCancel)
		l.markDirty(k)
	}
	l.end(k, s, nil)
}

// settings applies the server's settings and acknowledges them.
func (l *h2eLoop) settings(k *h2eLink, payload []byte) error {
	for b := payload; len(b) >= 6; b = b[6:] {
		v := binary.BigEndian.Uint32(b[2:])
		switch http2.SettingID(binary.BigEndian.Uint16(b)) {
		case http2.SettingHeaderTableSize:
			k.enc.SetMaxDynamicTableSizeLimit(v)
			k.steady = nil // what the table holds may change
		case http2.SettingInitialWindowSize:
			if v > h2eMaxID {
				return connError(http2.ErrCodeFlowControl, "initial window size %d above 2^31-1", v)
			}
			delta := int64(v) - k.initSendWin
			k.initSendWin = int64(v)
			for _, s := range k.streams {
				s.sendWin += delta
			}
		case http2.SettingMaxFrameSize:
			if v < 16384 || v > 1<<24-1 {
				return connError(http2.ErrCodeProtocol, "max frame size %d out of range", v)
			}
			k.maxFrame = int(v)
		case http2.SettingMaxConcurrentStreams:
			k.maxStreams = v
		}
	}
	k.out = appendFrameHeader(k.out, 0, http2.FrameSettings, http2.FlagSettingsAck, 0)
	l.markDirty(k)
	k.settled = true
	if len(k.sending) > 0 {
		l.pump(k)
	}
	l.promote(k.g)
	return nil
}

// goAway: the server takes no stream above last. Those it took finish on k; the others
// never reached it, so their requests move to a new connection, once: a request the
// next connection turns away too is recorded as failed.
func (l *h2eLoop) goAway(k *h2eLink, last uint32, code http2.ErrCode) {
	g := k.g
	var gone []*h2eSlot
	for id, s := range k.streams {
		if id > last {
			gone = append(gone, s)
		}
	}
	slices.SortFunc(gone, func(a, b *h2eSlot) int { return cmp.Compare(a.id, b.id) })
	k.goAway = true
	var moved, failed []*h2eSlot
	for _, s := range gone {
		l.detach(k, s)
		if s.moved {
			failed = append(failed, s)
			continue
		}
		s.moved, s.out, s.headed = true, Outcome{}, false
		moved = append(moved, s)
	}
	// they were sent before anything now waiting
	g.waiting = append(moved, g.waiting...)
	l.retire(k)
	l.promote(g)
	for _, s := range failed {
		l.record(s, fmt.Errorf("HTTP/2 GOAWAY (%v) before the server took the request", code))
	}
	for _, s := range failed {
		l.next(s, s.t.done)
	}
}

func appendFrameHeader(b []byte, length int, typ http2.FrameType, flags http2.Flags, id uint32) []byte {
	return append(b, byte(length>>16), byte(length>>8), byte(length), byte(typ), byte(flags),
		byte(id>>24), byte(id>>16), byte(id>>8), byte(id))
}

func appendSetting(b []byte, id http2.SettingID, v uint32) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(id))
	return binary.BigEndian.AppendUint32(b, v)
}

func appendWindowUpdate(b []byte, id, inc uint32) []byte {
	b = appendFrameHeader(b, 4, http2.FrameWindowUpdate, 0, id)
	return binary.BigEndian.AppendUint32(b, inc)
}

func appendRSTStream(b []byte, id uint32, code http2.ErrCode) []byte {
	b = appendFrameHeader(b, 4, http2.FrameRSTStream, 0, id)
	return binary.BigEndian.AppendUint32(b, uint32(code))
}

// appendHeaders appends a header block as HEADERS and CONTINUATION frames.
func appendHeaders(b []byte, id uint32, block []byte, endStream bool, maxFrame int) []byte {
	first := block[:min(len(block), maxFrame)]
	rest := block[len(first):]
	var flags http2.Flags
	if endStream {
		flags |= http2.FlagHeadersEndStream
	}
	if len(rest) == 0 {
		flags |= http2.FlagHeadersEndHeaders
	}
	b = appendFrameHeader(b, len(first), http2.FrameHeaders, flags, id)
	b = append(b, first...)
	for len(rest) > 0 {
		chunk := rest[:min(len(rest), maxFrame)]
		rest = rest[len(chunk):]
		flags = 0
		if len(rest) == 0 {
			flags = http2.FlagContinuationEndHeaders
		}
		b = appendFrameHeader(b, len(chunk), http2.FrameContinuation, flags, id)
		b = append(b, chunk...)
	}
	return b
}
