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

// holdCPUIdle applies the study's cpuIdle for as long as the run lasts and says what
// was applied, for the run's provenance. A machine that cannot poll (no such device,
// not root) runs with the kernel's idle governor, and the provenance says why.
func holdCPUIdle(mode study.CPUIdle) (applied string, release func()) {
	if mode == study.CPUIdleOS {
		return "os (the kernel's idle governor, as the study asks)", func() {}
	}
	f, err := holdCPULatency(0)
	if err != nil {
		return fmt.Sprintf("os (polling was asked for, but %v)", err), func() {}
	}
	return "poll (0 µs CPU-latency request held on " + cpuLatencyQoS + ")", func() { f.Close() }
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

// cpuLatencyInForce reads the CPU-latency bound the kernel enforces now: the smallest
// request held by any process, or its default when none is.
func cpuLatencyInForce() (int32, error) {
	b, err := os.ReadFile(cpuLatencyQoS)
	if err != nil {
		return 0, err
	}
	if len(b) < 4 {
		return 0, fmt.Errorf("%s: read %d bytes, want 4", cpuLatencyQoS, len(b))
	}
	return int32(binary.NativeEndian.Uint32(b)), nil
}
