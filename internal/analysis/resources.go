package analysis

import (
	"sort"
	"time"

	"github.com/meshmark/meshmark/internal/sampler"

	"github.com/meshmark/meshmark/internal/results"
)

// ResourceUsage is what one component role cost at one measuring point of one mesh,
// summed over its processes (every sidecar of the mesh, say) and averaged over the
// repeats.
type ResourceUsage struct {
	Key
	Label     string `json:"label"`
	Component string `json:"component"`
	Role      string `json:"role"`
	// Processes is the number of distinct (pod, node) processes sampled.
	Processes int `json:"processes"`
	// CPUCores is CPU seconds (user+sys) used per wall second, from the first and last
	// sample of each process in each trial.
	CPUCores float64 `json:"cpu_cores"`
	// CPUCoresPeak is the highest rate between two consecutive samples, summed over
	// processes at their own peaks (an upper bound of the simultaneous peak).
	CPUCoresPeak float64 `json:"cpu_cores_peak"`
	RSSMean      float64 `json:"rss_bytes_mean"`
	RSSPeak      int64   `json:"rss_bytes_peak"`
	PSSPeak      int64   `json:"pss_bytes_peak"`
	// CoresPer1000RPS relates CPU to the load served, as the Istio docs quote it.
	CoresPer1000RPS float64 `json:"cores_per_1000_rps"`
}

type procKey struct{ component, role, pod, node string }

// Resources summarises the resource samples of every group.
func Resources(groups []*Group) []ResourceUsage {
	var out []ResourceUsage
	for _, g := range groups {
		type acc struct {
			procs            map[string]bool
			cores, peak, rss float64
			rssPeak, pssPeak int64
			trials           int
			component, role  string
		}
		by := map[[2]string]*acc{}
		var order [][2]string
		for _, t := range g.Trials {
			perProc := map[procKey][]results.ResourceSample{}
			for _, s := range t.Result.Resources {
				k := procKey{s.Component, s.Role, s.Pod, s.Node}
				perProc[k] = append(perProc[k], s)
			}
			trialSums := map[[2]string]*acc{}
			for k, ss := range perProc {
				sort.Slice(ss, func(i, j int) bool { return ss[i].T.Before(ss[j].T) })
				ck := [2]string{k.component, k.role}
				a := trialSums[ck]
				if a == nil {
					a = &acc{procs: map[string]bool{}}
					trialSums[ck] = a
				}
				a.procs[k.pod+"@"+k.node] = true
				var rssSum float64
				var rssPeak, pssPeak int64
				for _, s := range ss {
					rssSum += float64(s.RSSBytes)
					rssPeak, pssPeak = max(rssPeak, s.RSSBytes), max(pssPeak, s.PSSBytes)
				}
				a.rss += rssSum / float64(len(ss))
				a.rssPeak += rssPeak
				a.pssPeak += pssPeak
				if len(ss) >= 2 {
					first, last := ss[0], ss[len(ss)-1]
					if secs := last.T.Sub(first.T).Seconds(); secs > 0 {
						a.cores += (last.CPUUserSeconds + last.CPUSysSeconds - first.CPUUserSeconds - first.CPUSysSeconds) / secs
					}
					var peak float64
					times := make([]time.Time, len(ss))
					for i, s := range ss {
						times[i] = s.T
					}
					window := sampler.PeakWindow(times)
					for i := 1; i < len(ss); i++ {
						if gap := ss[i].T.Sub(ss[i-1].T); gap > 0 && gap >= window {
							secs := gap.Seconds()
							rate := (ss[i].CPUUserSeconds + ss[i].CPUSysSeconds - ss[i-1].CPUUserSeconds - ss[i-1].CPUSysSeconds) / secs
							peak = max(peak, rate)
						}
					}
					a.peak += peak
				}
			}
			for ck, a := range trialSums {
				tot := by[ck]
				if tot == nil {
					tot = &acc{procs: map[string]bool{}, component: ck[0], role: ck[1]}
					by[ck] = tot
					order = append(order, ck)
				}
				for p := range a.procs {
					tot.procs[p] = true
				}
				tot.cores += a.cores
				tot.rss += a.rss
				tot.peak = max(tot.peak, a.peak)
				tot.rssPeak, tot.pssPeak = max(tot.rssPeak, a.rssPeak), max(tot.pssPeak, a.pssPeak)
				tot.trials++
			}
		}
		sort.SliceStable(order, func(i, j int) bool {
			if order[i][1] != order[j][1] {
				return order[i][1] < order[j][1]
			}
			return order[i][0] < order[j][0]
		})
		for _, ck := range order {
			a := by[ck]
			n := float64(a.trials)
			u := ResourceUsage{Key: g.Key, Label: g.Label, Component: a.component, Role: a.role, Processes: len(a.procs),
				CPUCores: a.cores / n, CPUCoresPeak: a.peak, RSSMean: a.rss / n, RSSPeak: a.rssPeak, PSSPeak: a.pssPeak}
			if g.Throughput > 0 {
				u.CoresPer1000RPS = u.CPUCores / (g.Throughput / 1000)
			}
			out = append(out, u)
		}
	}
	return out
}
