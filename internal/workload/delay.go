package workload

import (
	"math/rand/v2"
	"runtime"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Sample draws one delay. r nil means the process-wide generator (safe for concurrent
// use); tests pass a seeded one.
func (d *Delay) Sample(r *rand.Rand) time.Duration {
	float64n, norm, exp := rand.Float64, rand.NormFloat64, rand.ExpFloat64
	if r != nil {
		float64n, norm, exp = r.Float64, r.NormFloat64, r.ExpFloat64
	}
	var v float64
	switch d.Distribution {
	case Normal:
		v = float64(d.Mean) + norm()*float64(d.Stddev)
	case Exponential:
		v = exp() * float64(d.Mean)
	case Uniform:
		v = float64(d.Min) + float64n()*float64(d.Max-d.Min)
	default:
		return d.Mean
	}
	if v < float64(d.Min) {
		v = float64(d.Min)
	}
	if d.Max > 0 && v > float64(d.Max) {
		v = float64(d.Max)
	}
	return time.Duration(v)
}

// burnSink keeps the compiler from removing the busy loop.
var burnSink atomic.Uint64

// BurnCPU keeps the calling goroutine busy until its thread has used d of CPU time.
// Counting CPU time rather than wall time makes "cpu: 1ms" cost 1ms of CPU even when
// the machine is busy and the thread is preempted.
func BurnCPU(d time.Duration) {
	if d <= 0 {
		return
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	start, ok := threadCPU()
	if !ok {
		burnWall(d)
		return
	}
	x := burnSink.Load() | 1
	for {
		for i := 0; i < 2000; i++ { // a few microseconds between clock reads
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
		}
		now, _ := threadCPU()
		if now-start >= d {
			break
		}
	}
	burnSink.Store(x)
}

func burnWall(d time.Duration) {
	x := burnSink.Load() | 1
	for end := time.Now().Add(d); time.Now().Before(end); {
		for i := 0; i < 2000; i++ {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
		}
	}
	burnSink.Store(x)
}

func threadCPU() (time.Duration, bool) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0, false
	}
	return time.Duration(ts.Nano()), true
}
