package load

import (
	"slices"
	"time"
)

// A loop that parks until its next send wakes late: the timer interrupt, the idle CPU
// leaving its sleep state and (in a virtual machine) the hypervisor scheduling the vCPU
// again. On the project's KVM guest that is 40–60 µs at the median and over 100 µs at the
// 99th percentile, more than the whole gap between sends at 10 000 req/s. The open loop
// therefore parks only until wake-up-latency before a send and spins through the rest.
// How long that is depends on the machine, so it is learnt from the loop's own wake-ups.

const (
	// spinStart is the window before anything was learnt: generous, so the first
	// sends are on time.
	spinStart = 200 * time.Microsecond
	spinMin   = 20 * time.Microsecond
	// spinMax bounds what spinning may cost: a machine that wakes later than this
	// shows it in the send lag instead of a generator that never sleeps.
	spinMax = time.Millisecond
	// wakeSamples wake-ups are kept; the window is their high quantile, recomputed
	// every wakeRecompute of them.
	wakeSamples   = 256
	wakeRecompute = 32
)

// wakeEstimate learns how late this machine wakes a parked loop and turns it into the
// spin window: how long before a send the loop stops parking.
type wakeEstimate struct {
	fixed   bool // the window was given, not learnt
	window  time.Duration
	samples [wakeSamples]time.Duration
	sorted  [wakeSamples]time.Duration
	n       int
}

// newWakeEstimate learns the window when spin is 0, never spins when it is negative and
// uses spin as given when it is positive.
func newWakeEstimate(spin time.Duration) *wakeEstimate {
	switch {
	case spin < 0:
		return &wakeEstimate{fixed: true}
	case spin > 0:
		return &wakeEstimate{fixed: true, window: spin}
	}
	return &wakeEstimate{window: spinStart}
}

// Window is how long before a send the loop spins instead of parking.
func (w *wakeEstimate) Window() time.Duration { return w.window }

// observe records that a parked loop woke late after its timer; every wakeRecompute
// wake-ups the window becomes the 99th percentile of the last wakeSamples plus a
// quarter: the loop should be awake before the send in all but the rare case.
func (w *wakeEstimate) observe(late time.Duration) {
	if w.fixed {
		return
	}
	w.samples[w.n%wakeSamples] = max(late, 0)
	w.n++
	if w.n < wakeSamples/4 || w.n%wakeRecompute != 0 {
		return
	}
	have := w.sorted[:min(w.n, wakeSamples)]
	copy(have, w.samples[:len(have)])
	slices.Sort(have)
	p99 := have[len(have)*99/100]
	w.window = min(max(p99+p99/4, spinMin), spinMax)
}
