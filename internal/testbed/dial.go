package testbed

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// dialTCPInNetNS connects to dst from inside the namespace nsFD. Only socket() and the
// non-blocking connect() run on a thread inside the namespace (a socket belongs to the
// namespace it was created in); waiting for the handshake happens on the ordinary
// netpoller. Keeping the thread locked during the wait would cost a thread handoff per
// dial (measured: 3-4x a plain dial on a busy machine).
func dialTCPInNetNS(ctx context.Context, nsFD int, dst netip.AddrPort) (net.Conn, error) {
	return dialTCPInNetNSAs(ctx, nsFD, dst, -1)
}

// dialTCPInNetNSAs is dialTCPInNetNS with the socket created under effective uid uid
// (-1: as we are). Netfilter's owner match reads the uid a socket was created with, so
// the connection is treated exactly like one a process running as uid opened. Only
// the thread's effective uid changes (a raw setresuid, not Go's all-threads one), and
// it is restored before the thread leaves the namespace: the saved uid stays 0, so
// root's capabilities come back with it.
func dialTCPInNetNSAs(ctx context.Context, nsFD int, dst netip.AddrPort, uid int) (net.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var family int
	var sa unix.Sockaddr
	if ip := dst.Addr().Unmap(); ip.Is4() {
		family, sa = unix.AF_INET, &unix.SockaddrInet4{Port: int(dst.Port()), Addr: ip.As4()}
	} else {
		family, sa = unix.AF_INET6, &unix.SockaddrInet6{Port: int(dst.Port()), Addr: ip.As16()}
	}
	fd := -1
	err := inNetNS(nsFD, func() error {
		if uid >= 0 {
			if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), uintptr(uid), ^uintptr(0)); e != 0 {
				return os.NewSyscallError("setresuid", e)
			}
		}
		s, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
		if uid >= 0 {
			if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), 0, ^uintptr(0)); e != 0 {
				// The thread cannot become root again; inNetNS's setns back fails
				// too, and the thread dies locked rather than serve anyone else.
				if err == nil {
					unix.Close(s)
				}
				return os.NewSyscallError("setresuid back to root", e)
			}
		}
		if err != nil {
			return os.NewSyscallError("socket", err)
		}
		if err := unix.Connect(s, sa); err != nil && !errors.Is(err, unix.EINPROGRESS) {
			unix.Close(s)
			return os.NewSyscallError("connect", err)
		}
		fd = s
		return nil
	})
	if err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return nil, err
	}
	// A non-blocking descriptor becomes pollable, so deadlines work on it.
	f := os.NewFile(uintptr(fd), "tcp:"+dst.String())
	defer f.Close() // FileConn keeps its own duplicate
	if deadline, ok := ctx.Deadline(); ok {
		f.SetWriteDeadline(deadline)
	}
	stop := context.AfterFunc(ctx, func() { f.SetWriteDeadline(time.Unix(1, 0)) })
	defer stop()
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	var connErr error
	werr := rc.Write(func(s uintptr) bool {
		soErr, err := unix.GetsockoptInt(int(s), unix.SOL_SOCKET, unix.SO_ERROR)
		if err != nil {
			connErr = os.NewSyscallError("getsockopt", err)
			return true
		}
		switch e := unix.Errno(soErr); e {
		case unix.EINPROGRESS, unix.EALREADY, unix.EINTR:
			return false
		case 0:
			// Writable with no error may still be "not yet connected" on the first call.
			_, err := unix.Getpeername(int(s))
			return err == nil
		default:
			connErr = os.NewSyscallError("connect", e)
			return true
		}
	})
	if werr != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if _, ok := ctx.Deadline(); ok && errors.Is(werr, os.ErrDeadlineExceeded) {
			// The poller's timer fired a moment before the context's own.
			return nil, context.DeadlineExceeded
		}
		return nil, fmt.Errorf("connect: %w", werr)
	}
	if connErr != nil {
		return nil, connErr
	}
	return net.FileConn(f)
}
