package podcmd

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// Pause waits until ctx ends (SIGTERM or SIGINT), reaping every child that exits
// meanwhile: the first process of a pod sandbox, which holds its namespaces and, as
// its PID 1, inherits and must reap the pod's orphans, as Kubernetes' pause does.
func Pause(ctx context.Context, args []string, _, stderr io.Writer) error {
	fs := flags("pause", stderr)
	if err := parse(fs, args); err != nil {
		return err
	}
	children := make(chan os.Signal, 1)
	signal.Notify(children, syscall.SIGCHLD)
	defer signal.Stop(children)
	reap() // orphans that ended before the handler was installed
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-children:
			reap()
		}
	}
}

// reap collects every child that has exited, without waiting for the others.
func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
	}
}
