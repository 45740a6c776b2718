package sampler

import (
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/meshmark/meshmark/internal/substrate"
)

// Dimension is what a Group aggregates over.
type Dimension string

const (
	ByRole      Dimension = "role"
	ByPod       Dimension = "pod"
	ByNode      Dimension = "node"
	ByMesh      Dimension = "mesh"
	ByComponent Dimension = "component"
)

// SummaryOptions choose the steady window and the load it carried.
type SummaryOptions struct {
	// Start and End bound the steady window explicitly. When zero, the window is the
	// sampled span minus WarmUp at the start and Tail at the end.
	Start, End   time.Time
	WarmUp, Tail time.Duration
	// Requests completed during the window and the achieved rate; when zero the
	// per-request and per-rate figures are left at 0.
	Requests    uint64
	AchievedRPS float64
	// LoadGenCores is how many cores the load generator may use (1 when zero); it is
	// flagged when its average CPU, less LoadGenWaitVCPU, exceeds 80% of them.
	LoadGenCores float64
	// LoadGenWaitVCPU is CPU the load generator spent waiting rather than working (an
	// open model spinning before sends to keep their times), in cores: a generator
	// that spins is busy but not short of CPU.
	LoadGenWaitVCPU float64
}

// Group is the resource use of one role, pod, node, mesh or component over the window.
type Group struct {
	By                Dimension
	Key               string
	Mesh              string // the group's mesh, or "" when its processes span several
	Processes         int    // distinct process incarnations seen in the window
	CPUSeconds        float64
	AvgVCPU, PeakVCPU float64 // PeakVCPU is the busiest sampling interval
	VCPUPer1000RPS    float64
	CPUMicrosPerReq   float64
	// Memory: the group's sum over its processes, averaged over rounds and at its peak.
	AvgRSSMiB, PeakRSSMiB  float64
	AvgPSSMiB, PeakPSSMiB  float64
	Threads                uint64 // at the last round of the window
	VoluntaryCtxSwPerSec   float64
	InvoluntaryCtxSwPerSec float64
}

// Interface is the traffic through one pod interface over the window.
type Interface struct {
	Pod, Node, Mesh, Interface   string
	RxBytes, TxBytes             uint64
	RxBytesPerSec, TxBytesPerSec float64
	RxDropped, TxDropped         uint64
}

// LoadGen reports the load generator's CPU so a run whose generator was short of CPU can
// be flagged (methodology rule 6).
type LoadGen struct {
	Present           bool
	AvgVCPU, PeakVCPU float64
	Cores             float64
	// Saturated is true when the average exceeded 80% of Cores.
	Saturated bool
}

// Summary is the steady-window digest of a run's samples.
type Summary struct {
	Start, End time.Time
	Rounds     int
	Groups     []Group
	Interfaces []Interface
	LoadGen    LoadGen
}

// Group returns the group with the given dimension and key, or nil.
func (s *Summary) Group(by Dimension, key string) *Group {
	for i := range s.Groups {
		if s.Groups[i].By == by && s.Groups[i].Key == key {
			return &s.Groups[i]
		}
	}
	return nil
}

// LoadGenSaturationShare is the share of its cores above which the load generator is
// flagged as a possible bottleneck.
const LoadGenSaturationShare = 0.8

// PeakWindow is the shortest gap between two samples that a peak CPU rate may be taken
// over: half the median gap. CPU time moves in 10 ms ticks, so over a gap of a few
// milliseconds (a closing sample taken right after a regular one) one tick would read as
// several cores.
func PeakWindow(times []time.Time) time.Duration {
	if len(times) < 2 {
		return 0
	}
	gaps := make([]time.Duration, 0, len(times)-1)
	for i := 1; i < len(times); i++ {
		gaps = append(gaps, times[i].Sub(times[i-1]))
	}
	slices.Sort(gaps)
	return gaps[len(gaps)/2] / 2
}

type procKey struct {
	pid   int
	start uint64
}

// Summarize derives the steady-window Summary from rounds (in time order).
func Summarize(rounds []Round, opt SummaryOptions) (Summary, error) {
	if len(rounds) < 2 {
		return Summary{}, fmt.Errorf("sampler: need at least 2 rounds to summarise, have %d", len(rounds))
	}
	start, end := opt.Start, opt.End
	if start.IsZero() {
		start = rounds[0].Time.Add(opt.WarmUp)
	}
	if end.IsZero() {
		end = rounds[len(rounds)-1].Time.Add(-opt.Tail)
	}
	var win []Round
	for _, r := range rounds {
		if !r.Time.Before(start) && !r.Time.After(end) {
			win = append(win, r)
		}
	}
	if len(win) < 2 {
		return Summary{}, fmt.Errorf("sampler: steady window %s..%s holds %d rounds, need at least 2 (sampled %s..%s)",
			start.Format(time.RFC3339), end.Format(time.RFC3339), len(win),
			rounds[0].Time.Format(time.RFC3339), rounds[len(rounds)-1].Time.Format(time.RFC3339))
	}
	span := win[len(win)-1].Time.Sub(win[0].Time).Seconds()
	times := make([]time.Time, len(win))
	for i, r := range win {
		times[i] = r.Time
	}
	peakWindow := PeakWindow(times)
	sum := Summary{Start: win[0].Time, End: win[len(win)-1].Time, Rounds: len(win)}

	type acc struct {
		g                Group
		meshes           map[string]bool
		procs            map[procKey]bool
		cpuPerInterval   []float64 // seconds of CPU in interval i
		rssSum, pssSum   float64
		rssPeak, pssPeak float64
		vol, invol       float64
		thread           uint64
	}
	groups := map[[2]string]*acc{}
	get := func(by Dimension, key string) *acc {
		k := [2]string{string(by), key}
		a := groups[k]
		if a == nil {
			a = &acc{g: Group{By: by, Key: key}, meshes: map[string]bool{}, procs: map[procKey]bool{},
				cpuPerInterval: make([]float64, len(win)-1)}
			groups[k] = a
		}
		return a
	}
	keysOf := func(t Target) [5]struct {
		by  Dimension
		key string
	} {
		return [5]struct {
			by  Dimension
			key string
		}{{ByRole, string(t.Role)}, {ByPod, t.Pod}, {ByNode, t.Node}, {ByMesh, t.Mesh}, {ByComponent, t.Component}}
	}

	// Memory and thread counts per round.
	for ri, r := range win {
		roundRSS := map[*acc]float64{}
		roundPSS := map[*acc]float64{}
		for _, p := range r.Procs {
			for _, k := range keysOf(p.Target) {
				if k.key == "" {
					continue
				}
				a := get(k.by, k.key)
				a.meshes[p.Mesh] = true
				a.procs[procKey{p.PID, p.StartTicks}] = true
				roundRSS[a] += float64(p.RSSBytes)
				roundPSS[a] += float64(p.PSSBytes)
				if ri == len(win)-1 {
					a.thread += p.Threads
				}
			}
		}
		for a, v := range roundRSS {
			a.rssSum += v
			a.rssPeak = max(a.rssPeak, v)
		}
		for a, v := range roundPSS {
			a.pssSum += v
			a.pssPeak = max(a.pssPeak, v)
		}
	}
	// CPU and context switches per interval, from consecutive samples of the same
	// process incarnation; a process first seen mid-window counts from its first sample.
	for i := 1; i < len(win); i++ {
		prev := map[procKey]ProcSample{}
		for _, p := range win[i-1].Procs {
			prev[procKey{p.PID, p.StartTicks}] = p
		}
		for _, p := range win[i].Procs {
			q, ok := prev[procKey{p.PID, p.StartTicks}]
			if !ok {
				continue
			}
			cpu := (p.CPU() - q.CPU()).Seconds()
			if cpu < 0 {
				cpu = 0 // children's time can only grow; guard against a misread
			}
			vol := float64(p.VoluntaryCtxSwitches) - float64(q.VoluntaryCtxSwitches)
			invol := float64(p.InvoluntaryCtxSwitches) - float64(q.InvoluntaryCtxSwitches)
			for _, k := range keysOf(p.Target) {
				if k.key == "" {
					continue
				}
				a := get(k.by, k.key)
				a.cpuPerInterval[i-1] += cpu
				// A thread exiting lowers the live-thread sum; don't count that as negative work.
				a.vol += max(vol, 0)
				a.invol += max(invol, 0)
			}
		}
	}
	const mib = 1 << 20
	for _, a := range groups {
		g := a.g
		g.Processes = len(a.procs)
		if len(a.meshes) == 1 {
			for m := range a.meshes {
				g.Mesh = m
			}
		}
		for i, c := range a.cpuPerInterval {
			g.CPUSeconds += c
			if d := win[i+1].Time.Sub(win[i].Time); d > 0 && d >= peakWindow {
				g.PeakVCPU = max(g.PeakVCPU, c/d.Seconds())
			}
		}
		g.AvgVCPU = g.CPUSeconds / span
		if opt.AchievedRPS > 0 {
			g.VCPUPer1000RPS = g.AvgVCPU / opt.AchievedRPS * 1000
		}
		if opt.Requests > 0 {
			g.CPUMicrosPerReq = g.CPUSeconds * 1e6 / float64(opt.Requests)
		}
		n := float64(len(win))
		g.AvgRSSMiB, g.PeakRSSMiB = a.rssSum/n/mib, a.rssPeak/mib
		g.AvgPSSMiB, g.PeakPSSMiB = a.pssSum/n/mib, a.pssPeak/mib
		g.Threads = a.thread
		g.VoluntaryCtxSwPerSec = a.vol / span
		g.InvoluntaryCtxSwPerSec = a.invol / span
		sum.Groups = append(sum.Groups, g)
	}
	sort.Slice(sum.Groups, func(i, j int) bool {
		if sum.Groups[i].By != sum.Groups[j].By {
			return sum.Groups[i].By < sum.Groups[j].By
		}
		return sum.Groups[i].Key < sum.Groups[j].Key
	})

	type ifKey struct{ pod, name string }
	first := map[ifKey]NetSample{}
	last := map[ifKey]NetSample{}
	for _, n := range win[0].Nets {
		first[ifKey{n.Pod, n.Interface}] = n
	}
	for _, r := range win[1:] {
		for _, n := range r.Nets {
			k := ifKey{n.Pod, n.Interface}
			if _, ok := first[k]; !ok {
				first[k] = n // interface (or pod) appeared mid-window
			}
			last[k] = n
		}
	}
	for k, l := range last {
		f := first[k]
		it := Interface{Pod: l.Pod, Node: l.Node, Mesh: l.Mesh, Interface: l.Interface,
			RxBytes: sub0(l.RxBytes, f.RxBytes), TxBytes: sub0(l.TxBytes, f.TxBytes),
			RxDropped: sub0(l.RxDropped, f.RxDropped), TxDropped: sub0(l.TxDropped, f.TxDropped)}
		it.RxBytesPerSec = float64(it.RxBytes) / span
		it.TxBytesPerSec = float64(it.TxBytes) / span
		sum.Interfaces = append(sum.Interfaces, it)
	}
	sort.Slice(sum.Interfaces, func(i, j int) bool {
		a, b := sum.Interfaces[i], sum.Interfaces[j]
		if a.Pod != b.Pod {
			return a.Pod < b.Pod
		}
		return a.Interface < b.Interface
	})

	if g := sum.Group(ByRole, string(substrate.RoleLoadGen)); g != nil {
		cores := opt.LoadGenCores
		if cores <= 0 {
			cores = 1
		}
		sum.LoadGen = LoadGen{Present: true, AvgVCPU: g.AvgVCPU, PeakVCPU: g.PeakVCPU, Cores: cores,
			Saturated: g.AvgVCPU-opt.LoadGenWaitVCPU > LoadGenSaturationShare*cores}
	}
	return sum, nil
}

// sub0 is a-b for counters, 0 if the counter went backwards (interface recreated).
func sub0(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}
