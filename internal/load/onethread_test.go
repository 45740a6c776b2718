package load

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// oneThreadEnv makes the test binary serve as the one-thread server instead of running
// tests: its value is the service time (a Go duration). `go test -c` and
//
//	MESHMARK_ONE_THREAD_SERVER=2ms ./load.test
//
// give the server of known capacity the saturation tests use, for trying `meshmark
// load` against it by hand; it prints its address and serves until stdin closes. With
// MESHMARK_ONE_THREAD_SERVER_SHED=N it answers 503 at once to a request that finds N
// already queued, as Envoy does past its circuit breakers' limits.
const oneThreadEnv = "MESHMARK_ONE_THREAD_SERVER"

func TestMain(m *testing.M) {
	if v := os.Getenv(oneThreadEnv); v != "" {
		service, err := time.ParseDuration(v)
		shed := 0
		if err == nil && os.Getenv(oneThreadEnv+"_SHED") != "" {
			shed, err = strconv.Atoi(os.Getenv(oneThreadEnv + "_SHED"))
		}
		if err == nil {
			err = serveOneThread(os.Getenv(oneThreadEnv+"_ADDR"), service, shed)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "one-thread server:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// serveOneThread is an HTTP/1.1 server of known capacity: one thread, no goroutines, one
// epoll loop that answers one request at a time, each service after it arrived or after
// the previous one was done, whichever is later, busy-waiting until then. That is a
// queue with one server and a fixed service time, whose capacity is 1/service (500
// req/s at 2 ms) whatever the load. Arrival is the kernel's receive time of the request
// (SO_TIMESTAMPNS) and "done" is kept on that clock rather than read after the write, so
// the time spent reading and writing, or preempted on a busy machine, does not lower
// the capacity: a server that was held up catches up. With shed > 0, a request that
// arrives to find shed requests queued ahead of it is answered 503 at once, taking no
// service time. It prints "listening ADDR" and serves until its stdin closes.
func serveOneThread(addr string, service time.Duration, shed int) error {
	runtime.GOMAXPROCS(1)
	runtime.LockOSThread()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	host, portStr, ok := strings.Cut(addr, ":")
	port, err := strconv.Atoi(portStr)
	if !ok || err != nil || host != "127.0.0.1" {
		return fmt.Errorf("address %q: want 127.0.0.1:PORT", addr)
	}
	ln, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	_ = unix.SetsockoptInt(ln, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	if err := unix.Bind(ln, &unix.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		return err
	}
	if err := unix.Listen(ln, 4096); err != nil {
		return err
	}
	sa, err := unix.Getsockname(ln)
	if err != nil {
		return err
	}
	fmt.Printf("listening 127.0.0.1:%d\n", sa.(*unix.SockaddrInet4).Port)
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return err
	}
	for _, fd := range []int{ln, 0} {
		if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}); err != nil {
			return err
		}
	}
	response := []byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	overflow := []byte("HTTP/1.1 503 Service Unavailable\r\nContent-Length: 8\r\n\r\noverflow")
	pending := map[int][]byte{}
	buf, oob := make([]byte, 64<<10), make([]byte, 128)
	events := make([]unix.EpollEvent, 256)
	var lastEnd time.Time
	for {
		n, err := unix.EpollWait(ep, events, -1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		for _, ev := range events[:n] {
			fd := int(ev.Fd)
			switch fd {
			case 0:
				if k, err := unix.Read(0, buf); k <= 0 && !errors.Is(err, unix.EAGAIN) {
					return nil // the test that started us is gone
				}
				continue
			case ln:
				for {
					c, _, err := unix.Accept4(ln, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
					if err != nil {
						break
					}
					_ = unix.SetsockoptInt(c, unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1)
					_ = unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, c, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(c)})
				}
				continue
			}
			k, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, 0)
			if errors.Is(err, unix.EAGAIN) {
				continue
			}
			if k <= 0 {
				_ = unix.Close(fd) // also leaves the epoll set
				delete(pending, fd)
				continue
			}
			data := append(pending[fd], buf[:k]...)
			for {
				i := bytes.Index(data, []byte("\r\n\r\n"))
				if i < 0 {
					break
				}
				data = data[i+4:]
				start := arrival(oob[:oobn])
				if shed > 0 && lastEnd.Sub(start) >= time.Duration(shed)*service {
					_, _ = unix.Write(fd, overflow)
					continue
				}
				if start.Before(lastEnd) {
					start = lastEnd
				}
				lastEnd = start.Add(service)
				for time.Now().Before(lastEnd) {
				}
				_, _ = unix.Write(fd, response) // tiny: fits the socket's buffer
			}
			pending[fd] = data
		}
	}
}

// arrival is the receive time a read's control message carries, or now without one.
func arrival(oob []byte) time.Time {
	msgs, _ := unix.ParseSocketControlMessage(oob)
	for _, m := range msgs {
		if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SO_TIMESTAMPNS && len(m.Data) >= 16 {
			ts := *(*unix.Timespec)(unsafe.Pointer(&m.Data[0]))
			return time.Unix(ts.Unix())
		}
	}
	return time.Now()
}

// oneThreadServer starts the test binary as a one-thread server (serveOneThread) in a
// process of its own, so that it does not share the test's threads, and returns its
// base URL; it stops when the test ends.
func oneThreadServer(t *testing.T, service time.Duration) string {
	t.Helper()
	return oneThreadServerShedding(t, service, 0)
}

// oneThreadServerShedding is oneThreadServer answering 503 past a queue of shed.
func oneThreadServerShedding(t *testing.T, service time.Duration, shed int) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), oneThreadEnv+"="+service.String(), fmt.Sprintf("%s_SHED=%d", oneThreadEnv, shed))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("one-thread server: %v", err)
	}
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "listening ")
	if !ok {
		t.Fatalf("one-thread server said %q", line)
	}
	return "http://" + addr + "/"
}
