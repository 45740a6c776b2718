package load

import (
	"context"
	"runtime"
	"syscall"
	"time"
)

// The Go runtime wakes sleeping goroutines with millisecond resolution when it is idle
// (epoll timeouts are in ms), which would put up to 1 ms of send lag on every open-model
// request at moderate rates. The scheduler goroutine therefore runs on its own OS thread
// with a 1 µs timer slack and sleeps with nanosleep(2).

const (
	prSetTimerSlack = 29                   // PR_SET_TIMERSLACK
	sleepChunk      = 5 * time.Millisecond // longest sleep between checks of the context
	spinMargin      = 50 * time.Microsecond
	longWait        = 20 * spinMargin
)

// preciseClock sleeps with microsecond precision; it must be used from the goroutine
// that created it, which it pins to a dedicated thread for the rest of its life.
type preciseClock struct{}

func newPreciseClock() *preciseClock {
	runtime.LockOSThread() // never unlocked: the thread (and its timer slack) ends with the goroutine
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, prSetTimerSlack, 1000, 0)
	return &preciseClock{}
}

// sleepUntil waits for t; false if ctx ended first. It sleeps in short nanosleeps (the
// runtime's timers may fire a millisecond or more late on a busy machine), checking ctx
// between them. After a long wait (low rates) it spins through the last spinMargin,
// since waking a sleeping thread takes tens of microseconds on a busy machine; spinning
// costs at most spinMargin/longWait of a core.
func (c *preciseClock) sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	long := d >= longWait
	if long {
		d -= spinMargin
	}
	for d > 0 {
		if ctx.Err() != nil {
			return false
		}
		ts := syscall.NsecToTimespec(int64(min(d, sleepChunk)))
		for syscall.Nanosleep(&ts, &ts) == syscall.EINTR {
		}
		d = time.Until(t)
		if long {
			d -= spinMargin
		}
	}
	if long {
		for time.Now().Before(t) {
		}
	}
	return ctx.Err() == nil
}
