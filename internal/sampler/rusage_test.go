package sampler

import (
	"syscall"
	"time"
)

type syscall_Rusage = syscall.Rusage

// getrusage reads this whole process's CPU time: the benchmark's sampling goroutine
// dominates it, so the delta over a benchmark is the sampler's real CPU cost.
func getrusage(r *syscall.Rusage) { _ = syscall.Getrusage(syscall.RUSAGE_SELF, r) }

func rusageCPU(r *syscall.Rusage) time.Duration {
	return time.Duration(r.Utime.Nano() + r.Stime.Nano())
}
