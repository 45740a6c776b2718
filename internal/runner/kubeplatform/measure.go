package kubeplatform

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/meshmark/meshmark/internal/load"
	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/runner"
	"github.com/meshmark/meshmark/internal/sampler"
	"github.com/meshmark/meshmark/internal/study"
	"github.com/meshmark/meshmark/internal/substrate/kube"
)

// kubeLoad is what a cluster brings to the runner's RunLoad: requests go to the entry
// service by its cluster DNS name, or to the ingress gateway in front of it, from the
// generator pods, which have nodes of their own to spin on.
func (r *run) kubeLoad(ctx context.Context, d *kubeDeployment, t *study.Trial) runner.Load {
	entry := r.Graph().Entrypoint()
	return runner.Load{
		Target: func(e *study.Experiment, path string) string {
			if e != nil && e.Path == study.PathIngress && d.ingress != nil {
				return fmt.Sprintf("http://%s:%d%s", serviceHost(d.ingress.service, d.app.Namespace), d.ingress.port, path)
			}
			return fmt.Sprintf("http://%s:%d%s", serviceHost(kube.ServiceName(entry.Service), d.app.Namespace), entry.Port, path)
		},
		Measure: func(spec load.Spec, params results.TrialParams) (*load.Result, error) {
			if params.Extra == nil {
				params.Extra = map[string]string{}
			}
			params.Extra["generators"], params.Extra["substrate"] = strconv.Itoa(len(d.forwards.Generators)), "kubernetes"
			return r.MeasureOn(ctx, t, r.driveOnCluster(d, t), spec, params)
		},
	}
}

// flagResourcesIncomplete marks a trial on a cluster some of whose containers' resources
// could not be read (a node's kubelet did not answer): its resource figures leave those
// out rather than count them as zero. The trial's params say which, under
// "resource_warning".
const flagResourcesIncomplete = "resources-incomplete"

// flagResourcesCoarse marks a trial on a cluster shorter than its kubelets' refresh
// period: some containers' CPU is averaged over readings beyond the trial's bounds. The
// trial's params say which, under "resource_coarse".
const flagResourcesCoarse = "resources-coarse"

// driveOnCluster is a cluster's runner.Drive for trial t on d: every generator of the
// deployment, their results merged exactly; the CPU and memory of every container of
// the mesh's and the app's namespaces, read from the kubelets over the run at the local
// sampler's cadence; what each of the mesh's proxies and the app's pods counted, read
// before and after the run; and the containers of the system under test that ended.
func (r *run) driveOnCluster(d *kubeDeployment, t *study.Trial) runner.Drive {
	return func(ctx context.Context, spec load.Spec, progress func(load.Progress)) runner.Evidence {
		// What the pods served is read outside the proxies' window, so that the reads are
		// not among the requests the proxies count.
		servedBefore := r.kubeServed(ctx, d, t.Mesh.Name)
		faults := r.containerFaults(ctx, d, true)
		before := d.readProxies(ctx)
		var liveResources func([]kube.ContainerSample)
		if r.Options().Observe != nil {
			liveResources = func(read []kube.ContainerSample) {
				r.Options().Observe.Round(t.Mesh.Name, t.Experiment.Name, t.Repeat, containerRound(read, t.Mesh.Name))
			}
		}
		resources := d.cluster.SampleResources(ctx, d.resources, sampler.DefaultInterval, liveResources)
		res, _, err := d.pool.Run(ctx, spec, progress)
		readings := resources.Stop()
		if ctx.Err() != nil {
			return runner.Evidence{Err: ctx.Err()}
		}
		ended := r.containerFaults(ctx, d, false)
		if len(ended) == 0 && (err != nil || res.Errors.Total() > 0) && !injectsErrors(r.Graph()) {
			// Failed requests the workload does not inject may be a container that ended
			// late in the trial: its kubelet notices within a second or two (its pod
			// lifecycle relist) and only then reports the restart, which the next trial's
			// opening reading would otherwise take for its own.
			for deadline := time.Now().Add(restartNoticeWait); len(ended) == 0 && time.Now().Before(deadline) && ctx.Err() == nil; {
				time.Sleep(500 * time.Millisecond)
				ended = r.containerFaults(ctx, d, false)
			}
		}
		ev := runner.Evidence{Result: res, Err: err, Faults: append(faults, ended...),
			Via: fmt.Sprintf(", through %d load generators", len(d.forwards.Generators))}
		if err != nil {
			if ferr := d.forwards.Err(); ferr != nil {
				ev.Err = errors.Join(err, ferr)
			}
			return ev
		}
		after := d.readProxies(ctx)
		servedAfter := r.kubeServed(ctx, d, t.Mesh.Name)
		if len(d.proxies) > 0 {
			ev.Proxies = mesh.DiffCounters(before, after)
		}
		start, end := runner.MeasuredWindow(res, spec.Warmup)
		var coarse string
		ev.Resources, coarse = containerResources(readings.Samples, t.Mesh.Name, start, end)
		if msg := resourceWarning(readings, len(ev.Resources)); msg != "" {
			ev.Warnings = append(ev.Warnings, runner.Warning{Flag: flagResourcesIncomplete, Key: "resource_warning", Msg: msg})
		}
		if coarse != "" && len(ev.Resources) > 0 {
			ev.Warnings = append(ev.Warnings, runner.Warning{Flag: flagResourcesCoarse, Key: "resource_coarse", Msg: coarse})
		}
		if servedBefore != nil && servedAfter != nil {
			ev.Served, ev.ServedRead = servedByVersion(servedBefore, servedAfter), true
		}
		return ev
	}
}

// restartNoticeWait is how long a trial with failed requests waits for a container that
// ended in it to be reported started again.
const restartNoticeWait = 3 * time.Second

// containerFaults reads the containers of d's system under test and returns, as
// faults, what of it ended since the last reading: a container its kubelet started
// again, or a pod gone. before says the reading opens a trial, so that anything ended
// did so before it began (At is then the reading's time). The first reading, at the
// bring-up, has nothing to compare with; one that fails says so (once a deployment)
// and leaves the last in place, so that the next compares with it.
func (r *run) containerFaults(ctx context.Context, d *kubeDeployment, before bool) []results.Fault {
	now, err := d.cluster.ContainerRuns(ctx, d.resources)
	if err != nil {
		if !d.runsUnread {
			r.Note(fmt.Sprintf("warning: %s: could not tell whether a container of the system under test ended: %v", d.mesh.Name, err))
			d.runsUnread = true
		}
		return nil
	}
	last := d.runs
	d.runs = now
	if !last.Taken() {
		return nil
	}
	var out []results.Fault
	for _, rs := range d.cluster.RestartsBetween(ctx, last, now) {
		f := results.Fault{Pod: rs.Pod, Process: rs.Container, Role: string(rs.Role), At: rs.At, Exit: rs.Exit, LogTail: rs.LogTail}
		if before {
			f.At, f.Before = now.At, true
		}
		out = append(out, f)
	}
	return out
}

// kubeServed reads what every workload pod of the deployment has served, for the
// request-mix check, or nil when they cannot all be read; the first time they cannot, it
// says why, and the bring-up's later trials are not checked.
func (r *run) kubeServed(ctx context.Context, d *kubeDeployment, meshName string) []kube.PodServed {
	if d.mixUnread != "" {
		return nil
	}
	served, err := d.cluster.Served(ctx, d.app)
	if err != nil {
		d.mixUnread = err.Error()
		r.Note(fmt.Sprintf("warning: %s: the request mix is not checked on this bring-up: %v", meshName, err))
		return nil
	}
	return served
}

func describeGenerators(gs []kube.Generator) string {
	var out []string
	for _, g := range gs {
		out = append(out, g.Pod+" on "+g.Node)
	}
	return strings.Join(out, ", ")
}

// containerRound is one round of a cluster's container readings as the live metrics
// take a sampler's: each container a component (its PID 0, its CPU all user time, as
// the kubelet does not split it, its working set as its memory), with the time its
// kubelet took the reading.
func containerRound(read []kube.ContainerSample, meshName string) sampler.Round {
	round := sampler.Round{Time: time.Now()}
	for _, c := range read {
		round.Procs = append(round.Procs, sampler.ProcSample{
			Target: sampler.Target{Role: c.Role, Pod: c.Pod, Node: c.Node, Mesh: meshName, Component: c.Container},
			User:   time.Duration(c.CPUSeconds * float64(time.Second)), RSSBytes: c.WorkingSetBytes, At: c.T,
		})
	}
	return round
}

// containerResources keeps, of each container's kubelet readings, those taken within
// the measured window, and stores them as the local substrate stores a process's: the
// container's name is the component, the kubelet's CPU time all user time (it does not
// split it), its working set the memory. A kubelet may refresh its figures only every
// 10-15 s (those of `meshmark cluster up` refresh every second, as
// TestResourcesOnRealNodesMatchTheWork saw): readings bracketing the window, as the
// local sampler's rounds are kept, would average the CPU over up to two refresh periods
// outside the trial (the warm-up, the idle time after it), so the CPU of a trial is the
// counters' difference between its first and last readings inside it. A container with
// fewer than two readings inside (a trial shorter than the refresh period) keeps the
// two that bracket the window, and coarse says so: that trial's CPU is averaged over
// more than the trial.
func containerResources(samples []kube.ContainerSample, meshName string, start, end time.Time) (out []results.ResourceSample, coarse string) {
	type key struct{ namespace, pod, container string }
	series := map[key][]kube.ContainerSample{}
	var order []key
	for _, s := range samples {
		k := key{s.Namespace, s.Pod, s.Container}
		if series[k] == nil {
			order = append(order, k)
		}
		series[k] = append(series[k], s)
	}
	var short []string
	var refresh []time.Duration
	widest := time.Duration(0)
	for _, k := range order {
		ss := series[k]
		slices.SortFunc(ss, func(a, b kube.ContainerSample) int { return a.T.Compare(b.T) })
		for i := 1; i < len(ss); i++ {
			refresh = append(refresh, ss[i].T.Sub(ss[i-1].T))
		}
		first, last := -1, -1
		for i, s := range ss {
			if !s.T.Before(start) && !s.T.After(end) {
				if first < 0 {
					first = i
				}
				last = i
			}
		}
		if first < 0 || last == first {
			// Fewer than two readings inside: the ones that bracket the window.
			first, last = 0, len(ss)-1
			for i, s := range ss {
				if !s.T.After(start) {
					first = i
				}
			}
			for i := len(ss) - 1; i >= first; i-- {
				if !ss[i].T.Before(end) {
					last = i
				}
			}
			short = append(short, k.pod+"/"+k.container)
			widest = max(widest, ss[last].T.Sub(ss[first].T))
		}
		for _, s := range ss[first : last+1] {
			out = append(out, results.ResourceSample{
				Component: s.Container, Role: string(s.Role), Pod: s.Pod, Node: s.Node, Mesh: meshName, T: s.T,
				CPUUserSeconds: s.CPUSeconds, RSSBytes: int64(s.WorkingSetBytes),
			})
		}
	}
	if len(short) > 0 {
		slices.Sort(short)
		if len(short) > 3 {
			short = append(short[:3], fmt.Sprintf("and %d more", len(short)-3))
		}
		every := "every few seconds"
		if len(refresh) > 0 {
			slices.Sort(refresh)
			every = "about every " + refresh[len(refresh)/2].Round(100*time.Millisecond).String()
		}
		coarse = fmt.Sprintf("CPU averaged over more than the trial: the kubelets refresh their readings %s, and %s had fewer than two readings within this %s trial, so their CPU is taken over readings %s apart; measure for at least two refresh periods",
			every, strings.Join(short, ", "), end.Sub(start).Round(100*time.Millisecond), widest.Round(100*time.Millisecond))
	}
	return out, coarse
}

// resourceWarning says what the trial's resources lack: nodes whose kubelet could not be
// read, rounds in which the pods could not be listed, or nothing read at all.
func resourceWarning(rd kube.ResourceReadings, stored int) string {
	var why []string
	for _, u := range rd.Unread {
		why = append(why, u.String())
	}
	if rd.ListErr != "" {
		why = append(why, rd.ListErr)
	}
	if stored == 0 && len(why) == 0 {
		why = append(why, "no container's resources were read")
	}
	if len(why) == 0 {
		return ""
	}
	return "resources incomplete: " + strings.Join(why, "; ")
}

// servedByVersion is what each version served over a trial, from its pods as
// kube.Served reads them: only pods read both before and after count (a pod restarted
// in between would count from 0).
func servedByVersion(before, after []kube.PodServed) map[runner.Version]int64 {
	during := servedDuring(before, after)
	byVersion := map[runner.Version]int64{}
	for _, p := range after {
		if n, ok := during[p.Pod]; ok {
			byVersion[runner.Version{Service: p.Service, Version: p.Version}] += n
		}
	}
	return byVersion
}
