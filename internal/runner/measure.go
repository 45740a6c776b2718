package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/meshmark/meshmark/internal/load"
	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/sampler"
	"github.com/meshmark/meshmark/internal/study"
)

// Observer receives live data for export (the Prometheus endpoint).
type Observer interface {
	Interval(mesh, experiment string, repeat int, iv load.Interval)
	Round(mesh, experiment string, repeat int, round sampler.Round)
}

// Evidence is what a platform measured over one load run: the load's result, and what
// it read of the system under test around it. measureOn turns it into the stored
// trial, the same way for every platform.
type Evidence struct {
	Result *load.Result
	// Err is the load's own error, with what the platform knows of its cause.
	Err error
	// Via says, in an error, what drove the load when it was more than one generator
	// process (", through 2 load generators"); Ended says how a generator that stopped
	// early ended.
	Via, Ended string
	// Faults are the processes or containers of the system under test that ended
	// during the run.
	Faults []results.Fault
	// Proxies is what each of the mesh's proxies counted over the run: none where the
	// mesh has no proxy whose counters are read.
	Proxies []mesh.ProxyDelta
	// Resources and Network are the samples that cover the measured window.
	Resources []results.ResourceSample
	Network   []results.NetSample
	// Warnings flag the trial, each said and kept in its params.
	Warnings []Warning
	// Behind is why the generator fell behind, beyond what the engine saw itself.
	Behind []string
	// Served is what each version of the app's services served over the run, when
	// ServedRead; ServedUnread says why it was not read, when that is to be said for
	// this trial.
	Served       map[Version]int64
	ServedRead   bool
	ServedUnread string
}

// Version is a version of one of the graph's services.
type Version struct{ Service, Version string }

// Warning is a shortfall of what a platform read over a trial: the trial carries Flag,
// and its params the message under Key.
type Warning struct{ Flag, Key, Msg string }

// Drive drives one load run on a platform's generators, passing their progress on, and
// reads around it what the platform reads of the system under test.
type Drive func(ctx context.Context, spec load.Spec, progress func(load.Progress)) Evidence

// MeasuredWindow is the part of a load run that is measured: after its warm-up, for as
// long as the engine measured.
func MeasuredWindow(res *load.Result, warmup time.Duration) (start, end time.Time) {
	start = res.Start.Add(warmup)
	return start, start.Add(res.Elapsed)
}

// measureOn drives one load run of trial t on a platform (drive) and stores it as a
// trial, with its flags, evidence and faults. A cancelled run stores nothing partial.
func (r *runner) measureOn(ctx context.Context, t *study.Trial, drive Drive, spec load.Spec, params results.TrialParams) (*load.Result, error) {
	e := t.Experiment
	specParams(&params, e, spec)
	label := fmt.Sprintf("%s %s", e.Name, describe(params))
	r.progress.begin(t, label, spec.Duration)
	ev := drive(ctx, spec, func(p load.Progress) {
		r.progress.update(p)
		if r.opts.Observe != nil {
			r.opts.Observe.Interval(t.Mesh.Name, e.Name, t.Repeat, p.Interval)
		}
	})
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	res, err := ev.Result, ev.Err
	if err == nil {
		err = noSuccess(res)
	}
	if err != nil {
		if len(ev.Faults) > 0 {
			return nil, &faultError{label: label, mesh: t.Mesh.Name, faults: ev.Faults}
		}
		return nil, fmt.Errorf("%s on %s, repeat %d%s: %w%s", label, t.Mesh.Name, t.Repeat+1, ev.Via, err, ev.Ended)
	}
	trial := &results.Trial{
		Repeat:        t.Repeat,
		Mesh:          t.Mesh.Name,
		Experiment:    e.Name,
		Kind:          string(e.Kind),
		Params:        params,
		WarmupTrimmed: spec.Warmup,
		Result:        convert(res, spec.Warmup),
	}
	trial.Start, trial.End = MeasuredWindow(res, spec.Warmup)
	trial.Result.Resources, trial.Result.Network = ev.Resources, ev.Network
	for _, w := range ev.Warnings {
		trial.Params.Extra[w.Key] = w.Msg
		trial.Result.Flags = append(trial.Result.Flags, w.Flag)
		r.progress.note(fmt.Sprintf("warning: %s in %s on %s; this trial is flagged", w.Msg, label, t.Mesh.Name))
	}
	r.proxyEvidence(trial, ev.Proxies, r.graph.Entrypoint().Service, res, label)
	if len(ev.Behind) > 0 {
		res.Health.Bottleneck = true
	}
	if res.Health.Bottleneck {
		who := "the load generator"
		if ev.Via != "" {
			who = "a load generator"
		}
		trial.Result.Generator.Behind = true
		trial.Result.Flags = append(trial.Result.Flags, results.FlagGeneratorBehind)
		r.progress.note(fmt.Sprintf("warning: %s fell behind in %s on %s (%s); this trial is flagged",
			who, label, t.Mesh.Name, strings.Join(append(ev.Behind, res.Health.Why...), "; ")))
	}
	if ev.ServedUnread != "" {
		r.progress.note(fmt.Sprintf("warning: %s on %s: request mix not checked: %s", label, t.Mesh.Name, ev.ServedUnread))
	}
	if ev.ServedRead {
		trial.Result.Mix = r.mixOf(ev.Served)
		if msg := mixSkew(trial.Result.Mix); msg != "" {
			trial.Result.Flags = append(trial.Result.Flags, results.FlagMixSkewed)
			r.progress.note(fmt.Sprintf("warning: request mix off by more than %.0f points in %s on %s: %s; this trial is flagged",
				100*mixTolerance, label, t.Mesh.Name, msg))
		}
	}
	r.flagSaturated(trial, label)
	if len(ev.Faults) > 0 {
		trial.Result.Flags = append(trial.Result.Flags, results.FlagFault)
		trial.Result.Faults = ev.Faults
	}
	if err := r.opts.Store.AddTrial(ctx, r.run.ID, trial); err != nil {
		return nil, err
	}
	r.run.Trials = append(r.run.Trials, *trial)
	r.progress.end(res)
	if len(ev.Faults) > 0 {
		return nil, &faultError{label: fmt.Sprintf("%s (repeat %d)", label, t.Repeat+1), mesh: t.Mesh.Name, faults: ev.Faults}
	}
	return res, nil
}

// driveLocal is the local testbed's Drive for trial t on d: its one generator
// process, the sampler over every process and interface of the testbed, the proxies'
// counters, what each pod served, and a watch on the system under test's processes.
func (r *runner) driveLocal(d *deployment, t *study.Trial) Drive {
	return func(ctx context.Context, spec load.Spec, progress func(load.Progress)) Evidence {
		watch := watchProcesses(d.sut)
		before := readCounters(ctx, d)
		servedBefore, servedErr := r.served(ctx, d)
		smp := sampler.New(sampler.Config{
			Interval: time.Second,
			Targets:  r.targets(d),
			OnRound: func(round sampler.Round) {
				if r.opts.Observe != nil {
					r.opts.Observe.Round(t.Mesh.Name, t.Experiment.Name, t.Repeat, round)
				}
			},
		})
		sctx, stopSampler := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); _ = smp.Run(sctx) }()

		res, _, err := d.gen.Run(ctx, spec, progress)
		stopSampler() // Run takes a last round as it stops, closing the window
		wg.Wait()
		if ctx.Err() != nil {
			watch.finish()
			return Evidence{Err: ctx.Err()}
		}
		after := readCounters(ctx, d)
		servedAfter, err2 := r.served(ctx, d)
		if servedErr == nil {
			servedErr = err2
		}
		ev := Evidence{Result: res, Err: err, Faults: watch.finish(), Proxies: mesh.DiffCounters(before, after)}
		if err != nil {
			ev.Ended = d.generatorEnd()
			return ev
		}
		start, end := MeasuredWindow(res, spec.Warmup)
		steady := steadyRounds(smp.Rounds(), start, end)
		ev.Resources, ev.Network = resourceSamples(steady), netSamples(steady)
		sum, serr := sampler.Summarize(smp.Rounds(), sampler.SummaryOptions{
			Start: start, End: end,
			Requests: uint64(res.Completed), AchievedRPS: res.AchievedRate,
			LoadGenCores: 1, LoadGenWaitVCPU: spinShare(res),
		})
		if serr == nil && sum.LoadGen.Saturated {
			ev.Behind = append(ev.Behind, fmt.Sprintf("its process used %.2f of its core", sum.LoadGen.AvgVCPU))
		}
		if servedErr != nil {
			ev.ServedUnread = servedErr.Error()
		} else {
			ev.Served, ev.ServedRead = servedByVersion(d, servedBefore, servedAfter), true
		}
		return ev
	}
}

// flagSaturated flags a trial whose target could not keep up, which its result holds
// the evidence of, and says so.
func (r *runner) flagSaturated(trial *results.Trial, label string) {
	if !trial.Result.Saturated() {
		return
	}
	trial.Result.Flags = append(trial.Result.Flags, results.FlagTargetSaturated)
	r.progress.note(fmt.Sprintf("target saturated in %s on %s (repeat %d): %s; this trial is flagged",
		label, trial.Mesh, trial.Repeat+1, trial.Result.Saturation))
}

// spinShare is the share of a core the load generator spent spinning before sends,
// averaged over the run (warm-up included, as the spinning is counted).
func spinShare(res *load.Result) float64 {
	span := time.Since(res.Start)
	if res.Health.SpinWait <= 0 || span <= 0 {
		return 0
	}
	return min(res.Health.SpinWait.Seconds()/span.Seconds(), 1)
}

func describe(p results.TrialParams) string {
	switch {
	case p.Users > 0:
		return fmt.Sprintf("%d users", p.Users)
	case p.RequestedRate > 0 && p.Connections > 0:
		return fmt.Sprintf("%.0f req/s, %d conns", p.RequestedRate, p.Connections)
	case p.RequestedRate > 0:
		return fmt.Sprintf("%.0f req/s", p.RequestedRate)
	default:
		return fmt.Sprintf("%d conns closed", p.Connections)
	}
}

// noSuccess refuses a trial in which no measured request succeeded: it measured no
// latency of the system, only that it did not serve, and a run that stored it as a
// result would report 0% errors where every send was dropped (the target's name not
// resolving, on a cluster whose DNS did not answer). It says what became of the sends.
func noSuccess(res *load.Result) error {
	if res.Completed > res.Errors.Total() {
		return nil
	}
	e := res.Errors
	var kinds []string
	for _, k := range []struct {
		name string
		n    int64
	}{{"lookup", e.Lookup}, {"refused", e.Refused}, {"reset", e.Reset}, {"timeout", e.Timeout}, {"non-2xx", e.Non2xx}, {"other", e.Other}} {
		if k.n > 0 {
			kinds = append(kinds, fmt.Sprintf("%s %d", k.name, k.n))
		}
	}
	msg := fmt.Sprintf("no request succeeded: %d measured, all failed", res.Completed)
	if len(kinds) > 0 {
		msg += " (" + strings.Join(kinds, ", ") + ")"
	}
	if len(res.StatusCodes) > 0 {
		var codes []string
		for _, c := range slices.Sorted(maps.Keys(res.StatusCodes)) {
			codes = append(codes, fmt.Sprintf("%d×%d", c, res.StatusCodes[c]))
		}
		msg += "; answers " + strings.Join(codes, " ")
	}
	if h := res.Health; h.Dropped > 0 || h.Aborted > 0 {
		msg += fmt.Sprintf("; %d sends dropped (never sent), %d cut off by the end of the run", h.Dropped, h.Aborted)
	}
	if len(res.ErrorSamples) > 0 {
		msg += "; e.g. " + res.ErrorSamples[0]
	}
	if e.Lookup > 0 {
		msg += "; the target's name did not resolve: is the cluster's DNS answering?"
	}
	return errors.New(msg + "; the trial is not stored")
}

// convert turns the engine's result into the stored model, dropping warm-up intervals.
func convert(res *load.Result, warmup time.Duration) results.TrialResult {
	out := results.TrialResult{
		Requests:        res.Completed,
		Errors:          res.Errors.Total(),
		Latency:         res.Latency.Histogram,
		ServiceTime:     res.Service.Histogram,
		AnsweredLatency: res.Answered.Histogram,
		FailedLatency:   res.Failed.Histogram,
		Window:          &results.WindowCount{Completed: res.CompletedInWindow, Succeeded: res.SucceededInWindow, After: res.CompletedAfterWindow},
		Saturation:      convertSaturation(res.Saturation),
		StatusCodes:     res.StatusCodes,
		ErrorsByKind: map[string]int64{
			"refused": res.Errors.Refused, "reset": res.Errors.Reset, "timeout": res.Errors.Timeout,
			"non2xx": res.Errors.Non2xx, "other": res.Errors.Other, "lookup": res.Errors.Lookup,
		},
		Generator: results.GeneratorHealth{
			SendLag:        res.Health.SendLag.Histogram,
			SendLagP99:     res.Health.SendLag.Quantile(99).Microseconds(),
			LateSends:      res.Health.Late,
			DroppedSends:   res.Health.Dropped,
			PeakInFlight:   res.Health.PeakInFlight,
			CPUUserSeconds: res.Health.CPUUser.Seconds(),
			CPUSysSeconds:  res.Health.CPUSystem.Seconds(),
			SpinSeconds:    res.Health.SpinWait.Seconds(),
			SpinWindowUS:   res.Health.SpinWindow.Microseconds(),
		},
	}
	for k, v := range out.ErrorsByKind {
		if v == 0 {
			delete(out.ErrorsByKind, k)
		}
	}
	for _, iv := range res.Intervals {
		if iv.Start < warmup {
			continue
		}
		h, err := load.DecodeHistogram(iv.Latency)
		if err != nil {
			h = nil
		}
		out.Intervals = append(out.Intervals, results.Interval{
			Start:         res.Start.Add(iv.Start),
			Duration:      iv.Length,
			RequestedRate: iv.RequestedRate,
			AchievedRate:  iv.AchievedRate,
			Count:         iv.Completed,
			Errors:        iv.Errors.Total(),
			P50:           iv.LatencyP50.Microseconds(),
			P99:           iv.LatencyP99.Microseconds(),
			Histogram:     h,
		})
	}
	return out
}

// convertSaturation is the stored form of the engine's evidence on the target.
func convertSaturation(s *load.Saturation) *results.Saturation {
	if s == nil {
		return nil
	}
	return &results.Saturation{Saturated: s.Saturated, BacklogFrom: s.BacklogFrom, BacklogTo: s.BacklogTo, BacklogLow: s.BacklogLow, WaitingLow: s.WaitingLow,
		Shed: s.Shed, Completed: s.Completed,
		IntendedRate: s.IntendedRate, CompletedRate: s.CompletedRate,
		LatencyFromUS: s.LatencyFrom.Microseconds(), LatencyToUS: s.LatencyTo.Microseconds(),
		ConnectStallUS: s.ConnectStall.Microseconds(), ConnectLongestUS: s.ConnectLongest.Microseconds()}
}

// targets lists what the sampler reads: every process of the testbed, the load
// generator's process among them (substrate.RoleLoadGen), apart from meshmark itself.
func (r *runner) targets(d *deployment) func() []sampler.Target {
	nodeOf := map[string]string{}
	for _, p := range d.app.Pods() {
		nodeOf[p.Name] = p.Node
	}
	return sampler.TargetsFromSubstrate(d.tb, d.mesh.Name, func(pod string) string { return nodeOf[pod] })
}

func resourceSamples(rounds []sampler.Round) []results.ResourceSample {
	var out []results.ResourceSample
	for _, rd := range rounds {
		for _, p := range rd.Procs {
			out = append(out, results.ResourceSample{
				Component:      p.Component,
				Role:           string(p.Role),
				Pod:            p.Pod,
				Node:           p.Node,
				Mesh:           p.Mesh,
				T:              rd.Time,
				CPUUserSeconds: (p.User + p.ChildUser).Seconds(),
				CPUSysSeconds:  (p.System + p.ChildSystem).Seconds(),
				RSSBytes:       int64(p.RSSBytes),
				PSSBytes:       int64(p.PSSBytes),
				Threads:        int64(p.Threads),
				VoluntaryCtx:   int64(p.VoluntaryCtxSwitches),
				InvoluntaryCtx: int64(p.InvoluntaryCtxSwitches),
			})
		}
	}
	return out
}

// steadyRounds keeps the sampler rounds that bracket the measured window: the last one
// at or before its start through the first one at or after its end. Counters are
// cumulative, so differences over these rounds cover the window and leave the warm-up out.
func steadyRounds(rounds []sampler.Round, start, end time.Time) []sampler.Round {
	first, last := 0, len(rounds)-1
	for i, rd := range rounds {
		if !rd.Time.After(start) {
			first = i
		}
	}
	for i := len(rounds) - 1; i >= first; i-- {
		if !rounds[i].Time.Before(end) {
			last = i
		}
	}
	if last < first {
		return nil
	}
	return rounds[first : last+1]
}

func netSamples(rounds []sampler.Round) []results.NetSample {
	var out []results.NetSample
	for _, rd := range rounds {
		for _, n := range rd.Nets {
			out = append(out, results.NetSample{Pod: n.Pod, Node: n.Node, Mesh: n.Mesh, Interface: n.Interface, T: rd.Time,
				RxBytes: int64(n.RxBytes), TxBytes: int64(n.TxBytes), RxPackets: int64(n.RxPackets), TxPackets: int64(n.TxPackets),
				RxDropped: int64(n.RxDropped), TxDropped: int64(n.TxDropped)})
		}
	}
	return out
}

// readCounters reads every proxy's own counters when the profile has any.
func readCounters(ctx context.Context, d *deployment) []meshkube.ProxyCounters {
	tm, ok := d.profile.(mesh.Telemetry)
	if !ok {
		return nil
	}
	return tm.ReadCounters(ctx, d.tb, &d.app)
}

// proxyEvidence stores with the trial what each proxy counted over it, and flags the
// trial when a proxy could not be read (each named, with why) or when the proxies at
// the entry service counted less than was answered.
func (r *runner) proxyEvidence(trial *results.Trial, deltas []mesh.ProxyDelta, entry string, res *load.Result, label string) {
	trial.Result.ProxyStats = proxyStats(deltas, trial.Mesh)
	var unread []string
	for _, pd := range deltas {
		if pd.Err != "" {
			unread = append(unread, fmt.Sprintf("%s in %s could not be read (%s)", pd.Component, pd.Pod, pd.Err))
		}
	}
	if len(unread) > 0 {
		trial.Result.Flags = append(trial.Result.Flags, results.FlagProxyUnreadable)
		r.progress.note(fmt.Sprintf("warning: %s in %s on %s; this trial is flagged", strings.Join(unread, "; "), label, trial.Mesh))
	}
	if msg := bypassed(entry, deltas, res); msg != "" {
		trial.Result.Flags = append(trial.Result.Flags, results.FlagProxyBypassed)
		r.progress.note(fmt.Sprintf("warning: %s in %s on %s; this trial is flagged", msg, label, trial.Mesh))
	}
}

// bypassed proves, from the proxies' own counters, that every measured request entered
// the application through the mesh's proxies at the entry service. The counters also
// include warm-up requests, so they may exceed the measured count, never fall short of
// it. Proxies that count connections (L4) are held to one connection at least, since
// a connection carries many requests, or, where they count bytes as they flow, to a
// byte per answered request at least: a caller that keeps its connections (an
// ingress's pool) opens none during a trial, yet every request crosses the proxy. Where
// a mesh has both (ambient's ztunnels and a waypoint, which a caller from outside the
// mesh does not pass, as in Istio), the requests must be counted by the L7 proxy or the
// connections by the L4 one.
func bypassed(entry string, deltas []mesh.ProxyDelta, res *load.Result) string {
	byUnit := mesh.InboundByUnit(deltas, entry)
	answered := res.Completed - res.Errors.Total()
	if len(byUnit) == 0 || answered <= 0 {
		return ""
	}
	requests, haveRequests := byUnit[meshkube.UnitRequests]
	conns, haveConns := byUnit[meshkube.UnitConnections]
	bytes, haveBytes := mesh.InboundBytes(deltas, entry)
	switch {
	case haveRequests && int64(requests) >= answered:
		return ""
	case haveConns && conns > 0:
		return ""
	case haveBytes && int64(bytes) >= answered:
		return ""
	case haveRequests:
		return fmt.Sprintf("the %s proxies counted %d inbound %s for %d answered", entry, requests, meshkube.UnitRequests, answered)
	case haveBytes:
		return fmt.Sprintf("the mesh's proxies counted no connection into %s, and %d bytes into it, for %d answered requests", entry, bytes, answered)
	}
	return fmt.Sprintf("the mesh's proxies counted no connection into %s for %d answered requests", entry, answered)
}

// proxyStats stores what each proxy counted over the trial.
func proxyStats(deltas []mesh.ProxyDelta, meshName string) []results.ProxyStats {
	out := make([]results.ProxyStats, 0, len(deltas))
	for _, d := range deltas {
		b, err := json.Marshal(d)
		if err != nil {
			continue
		}
		t := d.To
		if t.IsZero() {
			t = time.Now()
		}
		out = append(out, results.ProxyStats{Component: d.Component, Pod: d.Pod, Mesh: meshName, T: t, Stats: b})
	}
	return out
}
