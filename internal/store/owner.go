package store

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// owner identifies the process that is writing a run. The pid alone is not enough:
// pids are reused and the machine may have rebooted since, so the kernel boot id and
// the process start time (in clock ticks since boot) are stored beside it.
type owner struct {
	pid   int
	host  string
	boot  string
	start int64
}

func currentOwner() owner {
	host, _ := os.Hostname()
	start, _, _ := procStat(os.Getpid())
	return owner{pid: os.Getpid(), host: host, boot: bootID(), start: start}
}

func bootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// procStat returns the start time and state letter of pid from /proc/<pid>/stat.
func procStat(pid int) (start int64, state byte, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// The command name is in parentheses and may itself contain spaces and ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, errors.New("malformed stat")
	}
	fields := strings.Fields(string(b[i+1:]))
	// fields[0] is field 3 (state); starttime is field 22.
	if len(fields) < 20 {
		return 0, 0, errors.New("short stat")
	}
	start, err = strconv.ParseInt(fields[19], 10, 64)
	return start, fields[0][0], err
}

// alive reports whether the owner may still be writing. When it cannot tell (another
// host shares the database file) it answers true, so a live run is never marked
// incomplete by mistake.
func (o owner) alive(self owner) bool {
	if o.pid <= 0 {
		return false
	}
	if o.host != self.host {
		return true
	}
	if o.boot != "" && self.boot != "" && o.boot != self.boot {
		return false
	}
	start, state, err := procStat(o.pid)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return false
		}
		return !errors.Is(syscall.Kill(o.pid, 0), syscall.ESRCH)
	}
	if state == 'Z' || state == 'X' {
		return false
	}
	return o.start == 0 || start == o.start
}
