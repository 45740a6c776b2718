// Package sampler owns resource accounting: it samples CPU time, memory (RSS, PSS),
// threads, context switches and pod network bytes of every process meshmark starts,
// from /proc, at a fixed interval, and summarises them per role, pod, node and mesh
// over a steady window (vCPU, vCPU per 1000 rps, CPU µs per request, MiB per pod).
package sampler

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/meshmark/meshmark/internal/substrate"
)

// Target is one process to sample and what it is for.
type Target struct {
	PID       int
	Role      substrate.Role
	Pod       string // pod (network namespace) the process runs in; empty for host processes
	Node      string
	Mesh      string // the mesh under test, by the name the study gives it
	Component string // e.g. "envoy", "app", "ztunnel"
}

// ProcSample is one process at one instant. CPU times are cumulative since the process
// started; Sampler reports the raw counters and Summarize turns them into rates.
type ProcSample struct {
	Target
	// StartTicks is the process start time after boot in clock ticks; with PID it
	// identifies one incarnation, so a reused PID is not mistaken for the old process.
	StartTicks uint64
	// User and System include every thread, live or exited; ChildUser and ChildSystem
	// are reaped children (e.g. a workload's shell-outs).
	User, System, ChildUser, ChildSystem time.Duration
	RSSBytes                             uint64
	// PSSBytes is 0 when /proc/<pid>/smaps_rollup is unavailable (kernels < 4.14).
	PSSBytes uint64
	Threads  uint64
	// Context switches summed over the live threads (exited threads' counts are not
	// visible in /proc).
	VoluntaryCtxSwitches, InvoluntaryCtxSwitches uint64
	// At is when the figures were taken, where that is not the round's time: a
	// container's on a cluster, whose kubelet refreshes its readings every few seconds.
	At time.Time
}

// CPU returns all CPU time the process and its reaped children used.
func (p ProcSample) CPU() time.Duration { return p.User + p.System + p.ChildUser + p.ChildSystem }

// NetSample is one interface of one pod's network namespace at one instant.
type NetSample struct {
	Pod, Node, Mesh string
	Interface       string
	RxBytes         uint64
	TxBytes         uint64
	RxPackets       uint64
	TxPackets       uint64
	RxDropped       uint64
	TxDropped       uint64
}

// Round is everything sampled at one instant.
type Round struct {
	Time  time.Time
	Procs []ProcSample
	Nets  []NetSample
}

// DefaultInterval is the time between two rounds unless a Config says otherwise: the
// cadence every resource figure of a run is sampled at, on a cluster too.
const DefaultInterval = time.Second

// Config configures a Sampler.
type Config struct {
	// Interval between rounds; DefaultInterval when zero.
	Interval time.Duration
	// Targets returns the processes to sample now; it is called every round so
	// processes started later are picked up.
	Targets func() []Target
	// SkipPSS avoids reading smaps_rollup, which makes the kernel walk every mapping
	// of the process; RSS is still read.
	SkipPSS bool
	// OnRound, when set, receives each round as it is taken (e.g. for live metrics).
	// It runs on the sampling goroutine; the Round is shared with Rounds() and must
	// not be modified.
	OnRound func(Round)
}

// Sampler samples targets from /proc. Use New, then Run (or SampleOnce).
type Sampler struct {
	cfg Config
	// sampling serialises rounds: the reader's buffers and the name table are reused
	// from round to round, so two rounds at once would corrupt each other.
	sampling sync.Mutex
	reader   *procReader
	names    map[string]string // interned interface names

	mu     sync.Mutex
	rounds []Round
}

// New returns a Sampler for cfg.
func New(cfg Config) *Sampler {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	return &Sampler{cfg: cfg, reader: newProcReader(), names: map[string]string{}}
}

// Run samples every Interval until ctx is done, then returns nil. A round is taken
// immediately so that short runs have a starting point.
func (s *Sampler) Run(ctx context.Context) error {
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		if err := s.SampleOnce(time.Now()); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			// A last round closes the final interval.
			return s.SampleOnce(time.Now())
		case <-t.C:
		}
	}
}

// SampleOnce takes one round at time now and stores it. Processes that exited are
// skipped silently; other read errors are returned.
func (s *Sampler) SampleOnce(now time.Time) error {
	s.sampling.Lock()
	defer s.sampling.Unlock()
	var targets []Target
	if s.cfg.Targets != nil {
		targets = s.cfg.Targets()
	}
	r := Round{Time: now, Procs: make([]ProcSample, 0, len(targets))}
	var netPIDs []Target // one process per pod reads that pod's net/dev
	for _, t := range targets {
		ps, err := s.sampleProc(t)
		if errors.Is(err, errGone) {
			continue
		}
		if err != nil {
			return err
		}
		r.Procs = append(r.Procs, ps)
		if t.Pod != "" && !hasPod(netPIDs, t.Pod) {
			netPIDs = append(netPIDs, t)
		}
	}
	for _, t := range netPIDs {
		b, err := s.reader.read(t.PID, 0, "net/dev")
		if errors.Is(err, errGone) {
			continue
		}
		if err != nil {
			return err
		}
		parseNetDev(b, func(name []byte, c netDevCounters) {
			r.Nets = append(r.Nets, NetSample{
				Pod: t.Pod, Node: t.Node, Mesh: t.Mesh, Interface: s.intern(name),
				RxBytes: c.rxBytes, TxBytes: c.txBytes, RxPackets: c.rxPackets, TxPackets: c.txPackets,
				RxDropped: c.rxDropped, TxDropped: c.txDropped,
			})
		})
	}
	s.mu.Lock()
	s.rounds = append(s.rounds, r)
	s.mu.Unlock()
	if s.cfg.OnRound != nil {
		s.cfg.OnRound(r)
	}
	return nil
}

func hasPod(ts []Target, pod string) bool {
	for _, t := range ts {
		if t.Pod == pod {
			return true
		}
	}
	return false
}

func (s *Sampler) intern(b []byte) string {
	if v, ok := s.names[string(b)]; ok {
		return v
	}
	v := string(b)
	s.names[v] = v
	return v
}

const tick = time.Second / clockTicksPerSecond

func (s *Sampler) sampleProc(t Target) (ProcSample, error) {
	ps := ProcSample{Target: t}
	b, err := s.reader.read(t.PID, 0, "stat")
	if err != nil {
		return ps, err
	}
	st, ok := parseStat(b)
	if !ok {
		return ps, errGone // a zombie's stat can be truncated; treat as exited
	}
	ps.StartTicks = st.startTime
	ps.User = time.Duration(st.utime) * tick
	ps.System = time.Duration(st.stime) * tick
	ps.ChildUser = time.Duration(st.cutime) * tick
	ps.ChildSystem = time.Duration(st.cstime) * tick
	ps.Threads = st.threads
	ps.RSSBytes = st.rssPages * pageSize
	if !s.cfg.SkipPSS {
		b, err := s.reader.read(t.PID, 0, "smaps_rollup")
		switch {
		case errors.Is(err, errGone):
			return ps, err
		case err == nil:
			if kb, ok := fieldValue(b, "Pss:"); ok {
				ps.PSSBytes = kb * 1024
			}
		}
		// Other errors (old kernel, EACCES on a kernel thread) leave PSS at 0.
	}
	var vol, invol uint64
	var readErr error
	err = s.reader.eachTask(t.PID, func(tid int) {
		b, err := s.reader.read(t.PID, tid, "status")
		if err != nil {
			if !errors.Is(err, errGone) && readErr == nil {
				readErr = err
			}
			return
		}
		v, _ := fieldValue(b, "voluntary_ctxt_switches:")
		n, _ := fieldValue(b, "nonvoluntary_ctxt_switches:")
		vol += v
		invol += n
	})
	if err != nil {
		return ps, err
	}
	if readErr != nil {
		return ps, readErr
	}
	ps.VoluntaryCtxSwitches, ps.InvoluntaryCtxSwitches = vol, invol
	return ps, nil
}

// Rounds returns a copy of every round taken so far.
func (s *Sampler) Rounds() []Round {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Round(nil), s.rounds...)
}

// TargetsFromSubstrate returns a Targets func listing every process the substrate has
// started, labelled with its role, pod, the pod's node (via nodeOf, which may be nil)
// and mesh. Processes whose Spec().Name is set get it as Component.
func TargetsFromSubstrate(sub substrate.Substrate, mesh string, nodeOf func(pod string) string) func() []Target {
	return func() []Target {
		procs := sub.Processes()
		out := make([]Target, 0, len(procs))
		for _, p := range procs {
			spec := p.Spec()
			t := Target{PID: p.PID(), Role: spec.Role, Pod: p.Pod(), Mesh: mesh, Component: spec.Name}
			if nodeOf != nil {
				t.Node = nodeOf(t.Pod)
			}
			out = append(out, t)
		}
		return out
	}
}
