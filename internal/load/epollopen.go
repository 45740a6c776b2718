package load

import (
	"bufio"
	"context"
	"errors"
	"os"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// The open model through goroutines costs a handoff per send and per response; with
// GOMAXPROCS=1 a send due while the processor runs a response's goroutine waits for it,
// which put the send lag p99 near 1-2 ms at 10 000 req/s. runOpenEpoll is wrk2's design
// instead: one loop owns the schedule (a timerfd in its epoll set; timerfds get no timer
// slack), writes each request at its intended time on an idle connection, and reads the
// responses itself. It parks until shortly before each send and spins the rest (see
// wake.go). Only the built-in plaintext client with keep-alive takes it, as in the
// closed model.
//
// New connections are dialed on the loop, which parks in the dial while the runtime
// polls the network. Dialing on other goroutines was tried: their completions need the
// runtime's poller, which a spinning loop on a single processor starves, and the sends
// waiting for them dialed again, by the thousand.

// spinPollMax bounds what one empty poll counts towards Health.SpinWait.
const spinPollMax = 20 * time.Microsecond

// openEpollRuns counts runs of the open model's epoll loop, so tests can tell which path
// ran.
var openEpollRuns atomic.Int64

type openLoop struct {
	*epollLoop
	ctx     context.Context // ends the schedule
	wake    *wakeEstimate
	idle    []*epollConn // not busy, normally connected; most recently used last
	cold    []*epollConn // not busy and never connected, or closed
	pending []int64      // intended offsets waiting for a connection, oldest first
	head    int          // pending[head:] are waiting
	busy    int
	events  []unix.EpollEvent
}

// runOpenEpoll runs the open model when it can; false means it did not start and the
// goroutine path must run.
func (e *engine) runOpenEpoll(ctx context.Context, p *Prepared) bool {
	hr, ok := p.Encoded.(*http1Request)
	if e.cfg.Client != nil || e.cfg.DisableKeepAlive || !ok || hr.tls != nil || len(hr.wire) > epollMaxRequest {
		return false
	}
	set, err := newEpollSet(epollTick)
	if err != nil || set.rc == nil {
		if set != nil {
			set.Close()
		}
		return false // without the runtime's poller a blocking wait would hold the processor
	}
	defer set.Close()
	sched, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return false
	}
	set.sched = sched // closed by set.Close
	if set.add(sched, tagSched) != nil {
		return false
	}
	o := &openLoop{
		epollLoop: &epollLoop{e: e, hr: hr, set: set, dial: ClientOptions{Dial: e.cfg.Dial}.dial()},
		ctx:       ctx,
		wake:      newWakeEstimate(e.cfg.Open.SpinWindow),
	}
	o.next = o.after
	o.onDial = e.noteDial
	for range e.cfg.Open.Connections {
		o.cold = append(o.cold, o.newConn())
	}
	// The first connection decides: if it gives no file descriptor, use goroutines.
	first := o.cold[0]
	if err := o.connect(first); err != nil && errors.Is(err, errNoFD) {
		return false
	}
	if first.open {
		first.fresh = true
		o.cold, o.idle = o.cold[1:], append(o.idle, first)
	}
	openEpollRuns.Add(1)
	o.run()
	e.spinWindow = o.wake.Window()
	return true
}

func (o *openLoop) newConn() *epollConn {
	c := &epollConn{idx: len(o.conns), fd: -1, buf: make([]byte, 16<<10)}
	c.br = bufio.NewReaderSize(&c.rd, 16<<10)
	o.conns = append(o.conns, c)
	return c
}

// advance returns the next intended send, counted as runOpen counts it; false when the
// schedule is over.
func (o *openLoop) advance() (time.Duration, bool) {
	e := o.e
	off, ok := e.sched.Next()
	if !ok || (e.cfg.Duration > 0 && off >= e.cfg.Duration) || !e.claim() {
		return 0, false
	}
	if off >= e.cfg.Warmup {
		e.scheduled.Add(1)
	}
	return off, true
}

func (o *openLoop) run() {
	e := o.e
	o.events = make([]unix.EpollEvent, 256)
	off, more := o.advance()
	var armedFor time.Time // when the schedule's timer fires; zero: not armed
	lastCheck := time.Now()
	for more || o.busy > 0 || o.head < len(o.pending) {
		if more && o.ctx.Err() != nil {
			more = false // as runOpen: the intended send was counted, not sent
		}
		now := time.Now()
		for more && !now.Before(e.start.Add(off)) {
			cur := off
			off, more = o.advance()
			o.fire(cur)
			now = time.Now()
		}
		due := e.start.Add(off)
		var n int
		parked := false
		if more && due.Sub(now) <= o.wake.Window() {
			// close to the send: look for responses without parking
			n = o.set.poll(o.events)
			// an empty poll takes about a microsecond; a long one was the thread being
			// preempted, which is not CPU this process spent
			if d := time.Since(now); n == 0 && d < spinPollMax {
				e.spin += d
			}
		} else {
			if more {
				// wake up the learnt wake-up latency early, and spin the rest
				at := due.Add(-o.wake.Window())
				if at != armedFor {
					if !o.arm(at) {
						continue // that moment passed while deciding
					}
					armedFor = at
				}
			}
			var err error
			n, err = o.set.wait(o.events)
			if err != nil && err != unix.EINTR {
				o.abort(err)
				return
			}
			parked = true
		}
		if !armedFor.IsZero() && timerFired(o.events[:n]) {
			if parked {
				o.wake.observe(time.Since(armedFor))
			}
			armedFor = time.Time{}
		}
		o.handle(o.events[:n])
		if now := time.Now(); now.Sub(lastCheck) >= epollTick || e.hard.Err() != nil {
			lastCheck = now
			o.expire(now)
		}
	}
	for _, c := range o.conns {
		o.disconnect(c)
	}
}

// arm sets the schedule's timer to fire at t; false if t is not in the future.
func (o *openLoop) arm(t time.Time) bool {
	// relative, since Go's monotonic clock has its own origin
	d := time.Until(t)
	if d <= 0 {
		return false
	}
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(int64(d))}
	// an error cannot happen with valid arguments; the loop's tick would still wake it,
	// late, and the lag would show
	_ = unix.TimerfdSettime(o.set.sched, 0, &spec, nil)
	return true
}

func timerFired(events []unix.EpollEvent) bool {
	for i := range events {
		if events[i].Fd == tagSched {
			return true
		}
	}
	return false
}

// fire sends the request intended at off: on the most recently used idle connection,
// else on a new one while under MaxInFlight, else it waits (late) or is dropped, as in
// runOpen.
func (o *openLoop) fire(off time.Duration) {
	e := o.e
	e.lastIntended.Store(int64(off))
	if e.hard.Err() != nil {
		e.dropped.Add(1)
		return
	}
	if len(o.idle) == 0 && o.busy > 0 {
		// catching up on sends due while the loop was busy: responses that came in
		// meanwhile free connections, where dialing would stall the loop further
		o.collect()
	}
	var c *epollConn
	switch {
	case len(o.idle) > 0:
		c, o.idle = o.idle[len(o.idle)-1], o.idle[:len(o.idle)-1]
	case len(o.cold) > 0:
		c, o.cold = o.cold[len(o.cold)-1], o.cold[:len(o.cold)-1]
	case len(o.conns) < e.cfg.Open.MaxInFlight:
		c = o.newConn()
	case len(o.pending)-o.head < openQueueSize:
		o.pending = append(o.pending, int64(off))
		e.late.Add(1)
		return
	default:
		e.dropped.Add(1)
		return
	}
	o.dispatch(c, off)
}

// dispatch sends the request intended at off on c; while sends fail at once (recorded),
// c goes on with the waiting ones.
func (o *openLoop) dispatch(c *epollConn, off time.Duration) {
	for {
		c.t = o.e.begin(o.e.start.Add(off))
		c.out, c.busy, c.retried = Outcome{Dialed: c.fresh}, true, false
		c.fresh = false
		if o.send(c) {
			o.busy++
			return
		}
		var ok bool
		if off, ok = o.popPending(); !ok {
			o.park(c)
			return
		}
	}
}

// after goes on with c once its request was recorded.
func (o *openLoop) after(c *epollConn) {
	o.busy--
	if off, ok := o.popPending(); ok {
		o.dispatch(c, off)
		return
	}
	o.park(c)
}

func (o *openLoop) park(c *epollConn) {
	if c.open {
		o.idle = append(o.idle, c)
	} else {
		o.cold = append(o.cold, c)
	}
}

// popPending returns the oldest waiting send; once the run is cut off they are dropped,
// as runOpen drops them.
func (o *openLoop) popPending() (time.Duration, bool) {
	if o.head == len(o.pending) {
		return 0, false
	}
	if o.e.hard.Err() != nil {
		o.dropPending()
		return 0, false
	}
	off := o.pending[o.head]
	o.head++
	o.e.dequeued.Add(1)
	if o.head == len(o.pending) {
		o.pending, o.head = o.pending[:0], 0
	}
	return time.Duration(off), true
}

// expire fails requests past their deadline, and all of them once the run is cut off.
func (o *openLoop) expire(now time.Time) {
	cut := o.e.hard.Err() != nil
	for _, c := range o.conns {
		if c.busy && (cut || !now.Before(c.t.sent.Add(o.e.cfg.Timeout))) {
			o.fail(c, os.ErrDeadlineExceeded)
			o.after(c)
		}
	}
	if cut {
		o.popPending() // drops them all
	}
}

// abort ends the loop after a failure of the loop itself: what is in flight fails.
func (o *openLoop) abort(err error) {
	for _, c := range o.conns {
		if c.busy {
			o.fail(c, err)
		}
		o.disconnect(c)
	}
	o.dropPending()
}

// dropPending drops every send waiting for a connection.
func (o *openLoop) dropPending() {
	n := int64(len(o.pending) - o.head)
	o.e.dropped.Add(n)
	o.e.dequeued.Add(n)
	o.pending, o.head = o.pending[:0], 0
}

// handle reads the connections that events report ready.
func (o *openLoop) handle(events []unix.EpollEvent) {
	for i := range events {
		if events[i].Fd < 0 {
			continue // timers: the loop's head handles them
		}
		if c := o.conns[events[i].Fd]; c.open {
			o.readable(c)
		}
	}
}

// collect reads the responses that arrived, without waiting.
func (o *openLoop) collect() {
	o.handle(o.events[:o.set.poll(o.events)])
}
