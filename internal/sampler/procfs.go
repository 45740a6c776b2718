package sampler

import (
	"errors"
	"strconv"
	"syscall"
	"unsafe"
)

// clockTicksPerSecond is USER_HZ, the unit of the CPU times in /proc/<pid>/stat. It is
// fixed at 100 by the kernel ABI on every architecture Go supports on Linux, and Go
// cannot call sysconf(_SC_CLK_TCK) without cgo.
const clockTicksPerSecond = 100

var pageSize = uint64(syscall.Getpagesize())

// errGone means the process (or thread) exited between listing and reading.
var errGone = errors.New("process gone")

// procReader reads small /proc files into a reused buffer. It opens files with raw
// openat(2) on a reused NUL-terminated path so that a sampling round allocates nothing
// for reading: os.Open would allocate a *File and a path string per file.
type procReader struct {
	path   []byte
	buf    []byte
	dirBuf []byte
}

func newProcReader() *procReader {
	return &procReader{path: make([]byte, 0, 128), buf: make([]byte, 8192), dirBuf: make([]byte, 8192)}
}

// setPath builds "/proc/<pid>/<sub>" (and "/task/<tid>/<sub>" when tid > 0) followed by NUL.
func (r *procReader) setPath(pid, tid int, sub string) {
	p := append(r.path[:0], "/proc/"...)
	p = strconv.AppendInt(p, int64(pid), 10)
	if tid > 0 {
		p = append(p, "/task/"...)
		p = strconv.AppendInt(p, int64(tid), 10)
	}
	if sub != "" {
		p = append(p, '/')
		p = append(p, sub...)
	}
	r.path = append(p, 0)
}

func (r *procReader) open(flags int) (int, error) {
	fd, _, errno := syscall.Syscall6(syscall.SYS_OPENAT, atFDCWDArg,
		uintptr(unsafe.Pointer(&r.path[0])), uintptr(flags|syscall.O_CLOEXEC), 0, 0, 0)
	if errno != 0 {
		if errno == syscall.ENOENT || errno == syscall.ESRCH {
			return -1, errGone
		}
		return -1, &pathError{path: string(r.path[:len(r.path)-1]), err: errno}
	}
	return int(fd), nil
}

// atFDCWDArg is AT_FDCWD (-100) as a syscall argument.
var atFDCWDArg = func() uintptr { v := -100; return uintptr(v) }()

type pathError struct {
	path string
	err  error
}

func (e *pathError) Error() string { return e.path + ": " + e.err.Error() }
func (e *pathError) Unwrap() error { return e.err }

// read returns the whole content of /proc/<pid>[/task/<tid>]/<sub>. The slice is valid
// until the next call.
func (r *procReader) read(pid, tid int, sub string) ([]byte, error) {
	r.setPath(pid, tid, sub)
	fd, err := r.open(syscall.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer syscall.Close(fd)
	n := 0
	for {
		if n == len(r.buf) {
			r.buf = append(r.buf, make([]byte, len(r.buf))...)
		}
		m, err := syscall.Read(fd, r.buf[n:])
		if err != nil {
			if err == syscall.ESRCH {
				return nil, errGone
			}
			return nil, &pathError{path: string(r.path[:len(r.path)-1]), err: err}
		}
		if m == 0 {
			return r.buf[:n], nil
		}
		n += m
	}
}

// eachTask calls fn with the id of every live thread of pid, listing /proc/<pid>/task
// with getdents64 into a reused buffer.
func (r *procReader) eachTask(pid int, fn func(tid int)) error {
	r.setPath(pid, 0, "task")
	fd, err := r.open(syscall.O_RDONLY | syscall.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	for {
		n, err := syscall.Getdents(fd, r.dirBuf)
		if err != nil {
			return &pathError{path: "/proc/" + strconv.Itoa(pid) + "/task", err: err}
		}
		if n <= 0 {
			return nil
		}
		for off := 0; off < n; {
			// struct linux_dirent64 { u64 d_ino; s64 d_off; u16 d_reclen; u8 d_type; char d_name[]; }
			reclen := int(r.dirBuf[off+16]) | int(r.dirBuf[off+17])<<8
			name := r.dirBuf[off+19 : off+reclen]
			if tid, ok := parseUintPrefix(name); ok && tid > 0 {
				fn(int(tid))
			}
			off += reclen
		}
	}
}

// procStat holds the fields of /proc/<pid>/stat the sampler uses.
type procStat struct {
	utime, stime, cutime, cstime uint64 // clock ticks
	threads                      uint64
	startTime                    uint64 // clock ticks after boot; identifies a PID's incarnation
	rssPages                     uint64
}

// parseStat parses /proc/<pid>/stat. The command name may contain spaces and
// parentheses, so fields are counted from the last ')'.
func parseStat(b []byte) (procStat, bool) {
	var s procStat
	end := -1
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] == ')' {
			end = i
			break
		}
	}
	if end < 0 {
		return s, false
	}
	field := 2 // the ')' closes field 2 (comm)
	i := end + 1
	for i < len(b) && field < 24 {
		for i < len(b) && b[i] == ' ' {
			i++
		}
		if i >= len(b) || b[i] == '\n' {
			break
		}
		field++
		j := i
		for j < len(b) && b[j] != ' ' && b[j] != '\n' {
			j++
		}
		switch field {
		case 14, 15, 16, 17, 20, 22, 24:
			v, ok := parseUintPrefix(b[i:j])
			if !ok {
				// cutime/cstime are signed in the kernel but never negative in practice.
				v = 0
			}
			switch field {
			case 14:
				s.utime = v
			case 15:
				s.stime = v
			case 16:
				s.cutime = v
			case 17:
				s.cstime = v
			case 20:
				s.threads = v
			case 22:
				s.startTime = v
			case 24:
				s.rssPages = v
			}
		}
		i = j
	}
	return s, field >= 24
}

// parseUintPrefix parses the leading decimal digits of b.
func parseUintPrefix(b []byte) (uint64, bool) {
	var v uint64
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			break
		}
		v = v*10 + uint64(c-'0')
		n++
	}
	return v, n > 0
}

// fieldValue finds "key" at the start of a line in b and returns the number after it
// (skipping spaces and tabs), e.g. fieldValue(status, "voluntary_ctxt_switches:").
func fieldValue(b []byte, key string) (uint64, bool) {
	for i := 0; i+len(key) <= len(b); {
		if string(b[i:i+len(key)]) == key {
			j := i + len(key)
			for j < len(b) && (b[j] == ' ' || b[j] == '\t') {
				j++
			}
			return parseUintPrefix(b[j:])
		}
		nl := indexByte(b[i:], '\n')
		if nl < 0 {
			break
		}
		i += nl + 1
	}
	return 0, false
}

func indexByte(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}

// netDevCounters are one interface's line of /proc/<pid>/net/dev.
type netDevCounters struct {
	rxBytes, rxPackets, rxErrors, rxDropped uint64
	txBytes, txPackets, txErrors, txDropped uint64
}

// parseNetDev calls fn for every interface in /proc/<pid>/net/dev. The name slice is
// only valid during the call.
func parseNetDev(b []byte, fn func(name []byte, c netDevCounters)) {
	for len(b) > 0 {
		nl := indexByte(b, '\n')
		line := b
		if nl >= 0 {
			line, b = b[:nl], b[nl+1:]
		} else {
			b = nil
		}
		colon := indexByte(line, ':')
		if colon < 0 {
			continue // the two header lines have no colon... the second has '|' only
		}
		name := trimSpaces(line[:colon])
		if len(name) == 0 || indexByte(name, '|') >= 0 {
			continue
		}
		var vals [16]uint64
		rest := line[colon+1:]
		k := 0
		for k < len(vals) {
			for len(rest) > 0 && rest[0] == ' ' {
				rest = rest[1:]
			}
			if len(rest) == 0 {
				break
			}
			v, ok := parseUintPrefix(rest)
			if !ok {
				break
			}
			vals[k] = v
			k++
			for len(rest) > 0 && rest[0] != ' ' {
				rest = rest[1:]
			}
		}
		if k < 16 {
			continue
		}
		fn(name, netDevCounters{
			rxBytes: vals[0], rxPackets: vals[1], rxErrors: vals[2], rxDropped: vals[3],
			txBytes: vals[8], txPackets: vals[9], txErrors: vals[10], txDropped: vals[11],
		})
	}
}

func trimSpaces(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}
