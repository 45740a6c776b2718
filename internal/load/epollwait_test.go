package load

import (
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestWaitBusyParksAQuietLoop: waitBusy holds the processor in a raw epoll_wait only
// while the loop's sockets keep speaking. Once a wait brought nothing but the tick, the
// next one parks through the runtime's poller, so that with GOMAXPROCS=1 the process's
// other goroutines run while the loop waits; and a socket event ends the quiet.
func TestWaitBusyParksAQuietLoop(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	const tick = 300 * time.Millisecond
	set, err := newEpollSet(tick)
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close()
	if set.rc == nil || set.tick < 0 {
		t.Skip("the runtime's poller did not take the epoll descriptor")
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	if err := set.add(fds[0], 0); err != nil {
		t.Fatal(err)
	}
	events := make([]unix.EpollEvent, 4)

	// A socket with data: the raw wait returns it at once and the loop is not quiet.
	if _, err := unix.Write(fds[1], []byte("x")); err != nil {
		t.Fatal(err)
	}
	if n, err := set.waitBusy(events); err != nil || n != 1 || events[0].Fd != 0 || set.quiet {
		t.Fatalf("with a readable socket: %d events (%v), err %v, quiet %v", n, events[:max(n, 0)], err, set.quiet)
	}
	var b [8]byte
	unix.Read(fds[0], b[:])

	// Nothing but the tick: the loop turns quiet. A raw wait holds the only processor
	// until it returns, or until sysmon preempts the loop after 10 ms.
	for !set.quiet {
		if _, err := set.waitBusy(events); err != nil {
			t.Fatal(err)
		}
	}

	// Quiet: the wait parks, so this goroutine keeps running beside it, many times
	// over, until the socket speaks; the wait returns that event, and the quiet ends.
	type result struct {
		n   int
		err error
		at  time.Time
	}
	done := make(chan result, 1)
	go func() {
		n, err := set.waitBusy(events)
		done <- result{n, err, time.Now()}
	}()
	start := time.Now()
	turns := 0
	for time.Since(start) < tick/3 {
		time.Sleep(time.Millisecond)
		turns++
	}
	select {
	case r := <-done:
		t.Fatalf("the quiet loop's wait returned after %v with %d events, err %v, before anything came", r.at.Sub(start), r.n, r.err)
	default:
	}
	if turns < 20 {
		t.Errorf("beside the quiet loop's wait this goroutine ran %d times in %v; the wait held the processor", turns, tick/3)
	}
	if _, err := unix.Write(fds[1], []byte("x")); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.n < 1 {
		t.Fatalf("after the socket spoke: %d events, err %v", r.n, r.err)
	}
	if onlyTimers(events[:r.n]) || set.quiet {
		t.Errorf("the socket's event was not among %v, or the loop stayed quiet (%v)", events[:r.n], set.quiet)
	}
}
