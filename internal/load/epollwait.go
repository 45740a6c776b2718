package load

import (
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// How the epoll loops wait. A blocking epoll_wait made as an ordinary syscall leaves the
// processor in the syscall state; with GOMAXPROCS=1 (a generator pinned to one core)
// sysmon then retakes it from every wait longer than its 20 µs tick and keeps polling at
// that tick: strace showed one nanosleep of sysmon per request, each a context switch on
// the generator's only core. So a loop's epoll descriptor is itself registered with the
// runtime's poller, and wait parks the loop like any goroutine reading a socket: the
// processor goes idle (and sysmon to sleep), and the runtime's epoll wakes it when the
// loop's set has events.
//
// Parking has its own price, paid on every sleep: a trip through the scheduler, and a
// nested epoll (each socket event also wakes the runtime's set). A loop that is busy
// sleeps very often (the closed model at full speed sleeps every few requests, whenever
// it has caught up with the target), so waitBusy instead blocks in a raw epoll_wait, as
// wrk does: the thread sleeps in the kernel, keeping its processor, which the runtime
// takes for a running goroutine and does not retake. Two rules keep that from starving
// the process's other goroutines: the loop yields its processor at every tick; and a
// loop whose sockets stayed silent for a whole tick is not busy, so it parks as above
// until they speak again. Side by side against nginx (closed model, 16 connections,
// pinned to one core; scripts/bench-load.sh), this took the loop's CPU time per request
// from wrk's to about a tenth under it.
//
// One case pays for it: at GOMAXPROCS=1, a target served by goroutines of the same
// process (as in tests) answers only when the loop yields or parks, a tick at a time.
// meshmark's targets are other processes.
//
// Everything else the loop does on its own descriptors cannot block (sockets and
// timerfds are non-blocking), so it uses raw syscalls, which skip the scheduler's
// bookkeeping and do not wake sysmon either.

// Event tags for the timerfds in a loop's set; connections are tagged by their index.
const (
	tagTick  = -1 // periodic: deadlines and the end of the run are checked every tick
	tagSched = -2 // one-shot: the open model's next intended send
)

type epollSet struct {
	fd    int
	file  *os.File        // owns fd; nil when the runtime's poller would not take it
	rc    syscall.RawConn // waits on fd through the runtime's poller
	tick  int             // timerfd, or -1
	sched int             // the open loop's one-shot timerfd, or -1

	// wait's callback for rc, and what it reads and fills in
	ready  func(uintptr) bool
	events []unix.EpollEvent
	n      int
	err    error

	// quiet: waitBusy's last wait returned no socket event, so the next one parks
	quiet bool
}

// newEpollSet creates an epoll set with a timerfd ticking every tick.
func newEpollSet(tick time.Duration) (*epollSet, error) {
	fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	s := &epollSet{fd: fd, tick: -1, sched: -1}
	if t, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC); err == nil {
		spec := unix.ItimerSpec{Value: unix.NsecToTimespec(int64(tick)), Interval: unix.NsecToTimespec(int64(tick))}
		if unix.TimerfdSettime(t, 0, &spec, nil) != nil || s.add(t, tagTick) != nil {
			unix.Close(t)
		} else {
			s.tick = t
		}
	}
	// os.NewFile registers a non-blocking descriptor with the runtime's poller.
	if s.tick >= 0 && unix.SetNonblock(fd, true) == nil {
		f := os.NewFile(uintptr(fd), "epoll")
		if rc, err := f.SyscallConn(); err == nil {
			s.file, s.rc = f, rc
		} else {
			f.Close()
			return nil, err
		}
	}
	return s, nil
}

func (s *epollSet) add(fd int, tag int32) error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP, Fd: tag}
	return unix.EpollCtl(s.fd, unix.EPOLL_CTL_ADD, fd, &ev)
}

// watchWrite adds (or removes) writability to what fd reports, for a loop whose output
// the socket could not take at once.
func (s *epollSet) watchWrite(fd int, tag int32, on bool) error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP, Fd: tag}
	if on {
		ev.Events |= unix.EPOLLOUT
	}
	return unix.EpollCtl(s.fd, unix.EPOLL_CTL_MOD, fd, &ev)
}

func (s *epollSet) del(fd int) {
	unix.EpollCtl(s.fd, unix.EPOLL_CTL_DEL, fd, nil)
}

func (s *epollSet) Close() {
	if s.tick >= 0 {
		unix.Close(s.tick)
	}
	if s.sched >= 0 {
		unix.Close(s.sched)
	}
	if s.file != nil {
		s.file.Close()
	} else {
		unix.Close(s.fd)
	}
}

// wait returns at least one event, waiting at most about one tick. Timerfd events are
// consumed here but still returned, tagged.
func (s *epollSet) wait(events []unix.EpollEvent) (int, error) {
	if s.rc == nil {
		n, err := unix.EpollWait(s.fd, events, int(epollTick/time.Millisecond))
		s.drainTimers(events[:max(n, 0)])
		return n, err
	}
	if s.ready == nil {
		// made once: a closure made per call would escape to the heap on every wait
		s.ready = func(uintptr) bool {
			s.n, s.err = rawEpollWait(s.fd, s.events)
			return s.n > 0 || (s.err != nil && s.err != unix.EINTR)
		}
	}
	s.events = events
	rerr := s.rc.Read(s.ready)
	n, err := s.n, s.err
	s.events = nil
	if err == nil && rerr != nil {
		// the runtime's poller refused the descriptor after all: block in epoll_wait
		s.rc = nil
		return s.wait(events)
	}
	s.drainTimers(events[:n])
	return n, err
}

// waitBusy is wait for a loop that expects events at once: it blocks in a raw
// epoll_wait (at most until the next tick), holding the processor, unless its last wait
// saw no socket event, in which case it parks through the runtime's poller. The caller
// yields the processor at every tick (runtime.Gosched), so that other goroutines run.
func (s *epollSet) waitBusy(events []unix.EpollEvent) (n int, err error) {
	if s.rc == nil || s.quiet || s.tick < 0 {
		n, err = s.wait(events)
	} else {
		n, err = rawEpollWaitFor(s.fd, events, epollTick)
		if err == unix.EINTR {
			n, err = 0, nil // a signal, such as the runtime's preemption request
		}
		s.drainTimers(events[:n])
	}
	s.quiet = err == nil && onlyTimers(events[:n])
	return n, err
}

// onlyTimers says whether events hold no socket's event.
func onlyTimers(events []unix.EpollEvent) bool {
	for i := range events {
		if events[i].Fd >= 0 {
			return false
		}
	}
	return true
}

// poll returns the events ready now, without waiting.
func (s *epollSet) poll(events []unix.EpollEvent) int {
	n, err := rawEpollWait(s.fd, events)
	if err != nil {
		return 0
	}
	s.drainTimers(events[:n])
	return n
}

// drainTimers reads the timerfds among events, so that they wait for their next expiry.
func (s *epollSet) drainTimers(events []unix.EpollEvent) {
	for i := range events {
		if events[i].Fd < 0 {
			var b [8]byte
			fd := s.tick
			if events[i].Fd == tagSched {
				fd = s.sched
			}
			rawRead(fd, b[:])
		}
	}
}

func rawEpollWait(epfd int, events []unix.EpollEvent) (int, error) {
	return rawEpollWaitFor(epfd, events, 0)
}

// rawEpollWaitFor is epoll_wait with a timeout (whole milliseconds), as a raw syscall: the
// runtime does not see the thread block, so its processor stays with the caller.
func rawEpollWaitFor(epfd int, events []unix.EpollEvent, timeout time.Duration) (int, error) {
	r, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(epfd), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), uintptr(timeout/time.Millisecond), 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// rawRead and rawWrite are read(2) and write(2) on non-blocking descriptors.
func rawRead(fd int, b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	r, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

func rawWrite(fd int, b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	r, _, e := unix.RawSyscall(unix.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}
