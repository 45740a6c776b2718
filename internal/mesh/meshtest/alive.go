package meshtest

import (
	"errors"
	"syscall"
)

// alive says whether a process exists (a stopped proxy has been reaped).
func alive(pid int) bool {
	return !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}
