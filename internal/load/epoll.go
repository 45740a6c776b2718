package load

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The closed model at full speed is where the generator's own CPU cost decides the
// result. Goroutine-per-connection costs a read(2) that returns EAGAIN, a park and a
// wake-up per request; runClosedEpoll instead drives every connection from one
// goroutine with its own level-triggered epoll set, as wrk does: one write, one read
// and a share of one epoll_wait per request.

const (
	epollMaxRequest = 16 << 10 // larger requests take the goroutine path
	epollMaxBuffer  = 64 << 20 // a response that does not fit is an error
	epollTick       = 10 * time.Millisecond
)

type epollConn struct {
	idx     int
	open    bool
	fd      int // our own descriptor of the socket
	buf     []byte
	n       int
	rd      bytes.Reader
	br      *bufio.Reader
	t       timing
	out     Outcome
	busy    bool // a request is in flight
	used    bool // the connection carried a response
	retried bool
	fresh   bool // connected before its first request started
}

// epollRuns counts the runs runClosedEpoll drove, so tests can tell which path ran.
var epollRuns atomic.Int64

// runClosedEpoll runs the closed model when it can (built-in client, plaintext,
// keep-alive, no rate limit, connections with file descriptors); false means it did not
// start and the goroutine path must run. TLS is out: the loop writes the request's
// bytes and parses what the socket returns.
func (e *engine) runClosedEpoll(ctx context.Context, p *Prepared) bool {
	hr, ok := p.Encoded.(*http1Request)
	if e.cfg.Client != nil || e.cfg.DisableKeepAlive || e.cfg.Closed.Rate > 0 || !ok || hr.tls != nil || len(hr.wire) > epollMaxRequest {
		return false
	}
	set, err := newEpollSet(epollTick)
	if err != nil {
		return false
	}
	defer set.Close()
	l := &epollLoop{e: e, hr: hr, set: set, dial: ClientOptions{Dial: e.cfg.Dial}.dial()}
	l.next = func(c *epollConn) { l.start(ctx, c) }
	l.conns = make([]*epollConn, e.cfg.Closed.Connections)
	for i := range l.conns {
		l.conns[i] = &epollConn{idx: i, fd: -1, buf: make([]byte, 16<<10)}
		l.conns[i].br = bufio.NewReaderSize(&l.conns[i].rd, 16<<10)
	}
	// The first connection decides: if it gives no file descriptor, use goroutines.
	first := l.conns[0]
	if err := l.connect(first); err != nil && errors.Is(err, errNoFD) {
		return false
	}
	first.fresh = first.open
	epollRuns.Add(1)
	l.run(ctx)
	return true
}

var errNoFD = errors.New("connection has no file descriptor")

type epollLoop struct {
	e      *engine
	hr     *http1Request
	set    *epollSet
	dial   DialFunc
	conns  []*epollConn
	active int
	// next is called after a request on c was recorded, to go on with c.
	next func(c *epollConn)
	// onDial, if set, is told of every dial: where sends wait for it (the open model).
	onDial func(began, ended time.Time)
}

func (l *epollLoop) connect(c *epollConn) error {
	ctx, cancel := context.WithTimeout(l.e.hard, l.e.cfg.Timeout)
	began := time.Now()
	fd, err := dialFD(ctx, l.dial, l.hr.addr)
	cancel()
	if l.onDial != nil {
		l.onDial(began, time.Now())
	}
	if err != nil {
		return err
	}
	if err := l.set.add(fd, int32(c.idx)); err != nil {
		unix.Close(fd)
		return err
	}
	c.open, c.fd, c.n, c.used = true, fd, 0, false
	c.out.Dialed = true
	return nil
}

// dialFD dials addr and returns a non-blocking descriptor of the socket for an epoll
// loop; errNoFD if the connection has none.
func dialFD(ctx context.Context, dial DialFunc, addr string) (int, error) {
	conn, err := dial(ctx, "tcp", addr)
	if err != nil {
		return -1, err
	}
	sc, ok := conn.(syscall.Conn)
	if !ok {
		conn.Close()
		return -1, errNoFD
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		conn.Close()
		return -1, errNoFD
	}
	// Take the socket out of the runtime's poller (closing the Conn deregisters it;
	// the duplicate keeps the socket open): otherwise every packet would also wake the
	// runtime's epoll, often a whole thread blocked in it.
	fd, dupErr := -1, error(nil)
	raw.Control(func(f uintptr) { fd, dupErr = unix.Dup(int(f)) })
	conn.Close()
	if dupErr != nil {
		return -1, dupErr
	}
	unix.CloseOnExec(fd)
	return fd, nil
}

func (l *epollLoop) disconnect(c *epollConn) {
	if !c.open {
		return
	}
	l.set.del(c.fd)
	unix.Close(c.fd)
	c.open, c.fd, c.n = false, -1, 0
}

// start sends the next request on c, or retires c when the run is over.
func (l *epollLoop) start(ctx context.Context, c *epollConn) {
	for {
		if ctx.Err() != nil || !l.e.claim() {
			l.disconnect(c)
			l.active--
			return
		}
		now := time.Now() // intended when the connection is free, as it is now
		c.t = l.e.beginAt(now, now)
		c.out, c.busy, c.retried = Outcome{Dialed: c.fresh}, true, false
		c.fresh = false
		if l.send(c) {
			return
		}
		// dial or write failed: recorded; the loop goes on with the next request
	}
}

// send writes the request on c (connecting first if needed); false if it failed, in
// which case the failure has been recorded.
func (l *epollLoop) send(c *epollConn) bool {
	if !c.open {
		if err := l.connect(c); err != nil {
			l.fail(c, err)
			return false
		}
	}
	wire := l.hr.wire
	for len(wire) > 0 {
		n, err := rawWrite(c.fd, wire)
		if err == unix.EINTR || err == unix.EAGAIN {
			continue // a send buffer full of a small request is momentary
		}
		if err != nil {
			if l.retry(c, err) {
				return c.busy
			}
			l.fail(c, &net.OpError{Op: "write", Net: "tcp", Err: err})
			return false
		}
		wire = wire[n:]
	}
	return true
}

// retry resends on a new connection when a kept-alive one turned out closed before any
// byte of the response; true if it took care of err: then the request is either in
// flight again (c.busy) or recorded as failed.
func (l *epollLoop) retry(c *epollConn, err error) bool {
	if !c.used || c.retried || c.n > 0 || !l.hr.idempot || l.e.hard.Err() != nil || Classify(err) != KindReset {
		return false
	}
	l.disconnect(c)
	c.retried = true
	if err := l.connect(c); err != nil {
		l.fail(c, err)
		return true // recorded; the caller must not record again
	}
	l.send(c)
	return true
}

func (l *epollLoop) fail(c *epollConn, err error) {
	l.disconnect(c)
	c.busy = false
	l.e.finish(&c.t, &c.out, err)
}

func (l *epollLoop) run(ctx context.Context) {
	l.active = len(l.conns)
	for _, c := range l.conns {
		l.start(ctx, c)
	}
	events := make([]unix.EpollEvent, len(l.conns)+2)
	lastCheck := time.Now()
	for l.active > 0 {
		n, err := l.set.waitBusy(events)
		if err != nil && err != unix.EINTR {
			for _, c := range l.conns {
				if c.busy {
					l.fail(c, err)
				}
			}
			return
		}
		for i := 0; i < n; i++ {
			if events[i].Fd < 0 {
				continue // the tick: checked below
			}
			c := l.conns[events[i].Fd]
			if c.open {
				l.readable(c)
			}
		}
		if now := time.Now(); now.Sub(lastCheck) >= epollTick || l.e.hard.Err() != nil {
			lastCheck = now
			l.expire(ctx, now)
			runtime.Gosched() // waitBusy holds the processor: let the others have it
		}
	}
}

// expire fails requests past their deadline (and all of them once the run is cut off).
func (l *epollLoop) expire(ctx context.Context, now time.Time) {
	cut := l.e.hard.Err() != nil
	for _, c := range l.conns {
		if !c.busy || (!cut && now.Before(c.t.sent.Add(l.e.cfg.Timeout))) {
			continue
		}
		l.fail(c, os.ErrDeadlineExceeded)
		if cut {
			l.active--
			continue
		}
		l.start(ctx, c)
	}
}

func (l *epollLoop) readable(c *epollConn) {
	if c.n == len(c.buf) {
		if len(c.buf) >= epollMaxBuffer {
			l.fail(c, errors.New("response larger than 64 MiB"))
			l.next(c)
			return
		}
		c.buf = append(c.buf, make([]byte, len(c.buf))...)
	}
	m, err := rawRead(c.fd, c.buf[c.n:])
	if err == unix.EAGAIN || err == unix.EINTR {
		return
	}
	if !c.busy { // data or EOF on an idle connection: it is of no use any more
		l.disconnect(c)
		return
	}
	if err != nil || m == 0 {
		if err == nil {
			err = io.EOF
		} else {
			err = &net.OpError{Op: "read", Net: "tcp", Err: err}
		}
		if c.n > 0 && err == io.EOF && l.parse(c, true) {
			return // a body delimited by the end of the connection
		}
		if l.retry(c, err) {
			if !c.busy {
				l.next(c)
			}
			return
		}
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		l.fail(c, err)
		l.next(c)
		return
	}
	// One clock read serves both stamps: when the first bytes of the response came,
	// and (if these complete it) when the whole of it had come.
	now := time.Now()
	if c.n == 0 {
		c.out.FirstByte = now
	}
	c.n += m
	l.parseAt(c, false, now)
}

// parse completes the request on c if its whole response is in the buffer.
func (l *epollLoop) parse(c *epollConn, atEOF bool) bool {
	return l.parseAt(c, atEOF, time.Now())
}

// parseAt is parse for a caller that read the clock when the bytes came.
func (l *epollLoop) parseAt(c *epollConn, atEOF bool, now time.Time) bool {
	resp, used, st, err := parseBuffered(c.buf[:c.n], l.hr.noBody)
	switch {
	case st == bufferedIncomplete && !atEOF:
		return false
	case st == bufferedError:
		l.fail(c, err)
		l.next(c)
		return true
	case st == bufferedComplete:
		l.complete(c, resp, c.n-used, now)
		return true
	}
	c.rd.Reset(c.buf[:c.n])
	c.br.Reset(&c.rd)
	resp, err = ReadResponse(c.br, l.hr.noBody)
	if err == io.ErrUnexpectedEOF || err == io.EOF || (err == nil && resp.UntilClose && !atEOF) {
		return false // not all here yet
	}
	if err != nil {
		l.fail(c, err)
		l.next(c)
		return true
	}
	l.complete(c, resp, c.rd.Len()+c.br.Buffered(), now)
	return true
}

// complete records the response on c, whole in its buffer with rest bytes after it,
// and goes on with c.
func (l *epollLoop) complete(c *epollConn, resp ResponseInfo, rest int, done time.Time) {
	c.out.Status, c.out.BytesIn = resp.Status, resp.BodyBytes
	c.used, c.busy = true, false
	l.e.finishAt(&c.t, &c.out, nil, done)
	if rest > 0 || resp.Close {
		l.disconnect(c) // extra bytes we did not ask for, or the server is closing
	}
	c.n = 0
	l.next(c)
}
