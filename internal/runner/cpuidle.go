package runner

import (
	"encoding/binary"
	"fmt"
	"os"

	"github.com/meshmark/meshmark/internal/study"
)

// cpuLatencyQoS is the kernel's CPU-latency PM QoS interface: a process that writes a
// latency in microseconds and keeps the descriptor open bounds how deep idle CPUs may
// sleep; 0 leaves them only the polling state. Closing it, which the kernel does for
// a process however it ends, withdraws the request.
const cpuLatencyQoS = "/dev/cpu_dma_latency"

// cpuIdleFor decides how idle CPUs wait during the trials of a local run, and says so
// for the run's provenance: with the study's cpuIdle poll and a machine that takes the
// request (root, the device present: tried once here), every trial holds it while its
// load runs (holdCPUIdle); otherwise the kernel's idle governor decides, and the
// provenance says why. Polling burns the idle CPUs' time, so it is held only while a
// trial measures, not while deployments come and go.
func cpuIdleFor(mode study.CPUIdle) (applied string, poll bool) {
	if mode == study.CPUIdleOS {
		return "os (the kernel's idle governor, as the study asks)", false
	}
	f, err := holdCPULatency(0)
	if err != nil {
		return fmt.Sprintf("os (polling was asked for, but %v)", err), false
	}
	f.Close()
	return "poll while trials measure (0 µs CPU-latency request on " + cpuLatencyQoS + ")", true
}

// holdCPUIdle makes idle CPUs poll until release is called, when the run decided so
// (cpuIdleFor); a request the kernel refuses now is noted, and the trial runs anyway.
func (r *runner) holdCPUIdle() (release func()) {
	if !r.cpuIdlePoll {
		return func() {}
	}
	f, err := holdCPULatency(0)
	if err != nil {
		r.progress.note(fmt.Sprintf("warning: idle CPUs could not be made to poll for this trial: %v", err))
		return func() {}
	}
	return func() { f.Close() }
}

// holdCPULatency files a CPU-latency request of us microseconds; it stands until the
// returned file is closed. Go opens files close-on-exec, so no process the testbed
// starts inherits the request and keeps it past the run.
func holdCPULatency(us int32) (*os.File, error) {
	f, err := os.OpenFile(cpuLatencyQoS, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], uint32(us))
	if _, err := f.Write(b[:]); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", cpuLatencyQoS, err)
	}
	return f, nil
}
