package load

import (
	"context"
	"encoding/binary"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// The Go runtime's timers wake sleeping goroutines with millisecond resolution when the
// process is idle (its epoll waits take milliseconds), which would put up to 1 ms of
// send lag on every open-model request at moderate rates. Sleeping in a syscall instead
// would hold the processor, and with GOMAXPROCS=1 starve the goroutines that read the
// responses. The open model's clock therefore waits on a Linux timerfd through the
// network poller: nanosecond timers, and the processor stays free while it waits.

const (
	spinMargin = 150 * time.Microsecond
	longWait   = 20 * spinMargin
)

// preciseClock sleeps with microsecond precision. One goroutine uses it at a time.
type preciseClock struct {
	tfd   *os.File // nil: timerfd unavailable, fall back to the runtime's timers
	timer *time.Timer
	buf   [8]byte
	stop  func() bool
}

func newPreciseClock(ctx context.Context) *preciseClock {
	c := &preciseClock{timer: time.NewTimer(time.Hour)}
	c.timer.Stop()
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return c
	}
	c.tfd = os.NewFile(uintptr(fd), "timerfd")
	tfd := c.tfd
	c.stop = context.AfterFunc(ctx, func() { tfd.SetReadDeadline(time.Unix(1, 0)) })
	return c
}

// Close releases the timerfd.
func (c *preciseClock) Close() {
	if c.stop != nil {
		c.stop()
	}
	if c.tfd != nil {
		c.tfd.Close()
	}
}

// sleepUntil waits for t; false if ctx ended first. After a long wait (low rates) it
// spins through the last spinMargin, since waking a parked goroutine takes up to about
// 100 µs (idle CPUs sleep deeply); spinning costs at most spinMargin/longWait of a core.
func (c *preciseClock) sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	long := d >= longWait
	if long {
		d -= spinMargin
	}
	if d > 0 {
		if c.tfd == nil {
			if !sleepUntil(ctx, c.timer, time.Now().Add(d)) {
				return false
			}
		} else if !c.wait(d) {
			return false
		}
	}
	if long {
		for time.Now().Before(t) {
		}
	}
	return ctx.Err() == nil
}

// wait arms the timerfd for d and reads it; false when the context's deadline fired.
func (c *preciseClock) wait(d time.Duration) bool {
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(int64(d))}
	if err := unix.TimerfdSettime(int(c.tfd.Fd()), 0, &spec, nil); err != nil {
		time.Sleep(d)
		return true
	}
	for {
		_, err := c.tfd.Read(c.buf[:])
		if err == nil {
			_ = binary.NativeEndian.Uint64(c.buf[:]) // expirations; one is all we armed
			return true
		}
		if os.IsTimeout(err) {
			return false
		}
		if err != unix.EAGAIN && err != unix.EINTR {
			time.Sleep(d)
			return true
		}
	}
}
