package runner

import (
	"github.com/meshmark/meshmark/internal/load"
	"github.com/meshmark/meshmark/internal/metrics"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/sampler"
)

// MetricsObserver feeds the live Prometheus endpoint: one interval of load per second
// and every sampler round, so the load engine's hot path never touches Prometheus.
type MetricsObserver struct {
	Recorder *metrics.Recorder
	// Service labels the latency series; empty means "all" (the load generator sees
	// only the entrypoint's latency).
	Service string
}

// Interval implements Observer.
func (o MetricsObserver) Interval(mesh, experiment string, repeat int, iv load.Interval) {
	mi := metrics.Interval{
		Service:       o.Service,
		Duration:      iv.Length,
		RequestedRate: iv.RequestedRate,
		Completed:     uint64(iv.Completed),
		Errors:        map[string]uint64{},
	}
	for kind, n := range map[string]int64{"refused": iv.Errors.Refused, "reset": iv.Errors.Reset, "timeout": iv.Errors.Timeout, "non2xx": iv.Errors.Non2xx, "other": iv.Errors.Other} {
		if n > 0 {
			mi.Errors[kind] = uint64(n)
		}
	}
	if h, err := load.DecodeHistogram(iv.Latency); err == nil {
		for _, bar := range h.Distribution() {
			if bar.Count > 0 {
				mi.Latency = append(mi.Latency, metrics.LatencyCount{Value: results.Duration(bar.To), Count: uint64(bar.Count)})
			}
		}
	}
	o.Recorder.ObserveInterval(metrics.RunLabels{Mesh: mesh, Experiment: experiment, Repeat: repeat}, mi)
}

// Round implements Observer.
func (o MetricsObserver) Round(mesh, experiment string, repeat int, round sampler.Round) {
	o.Recorder.ObserveRound(metrics.RunLabels{Mesh: mesh, Experiment: experiment, Repeat: repeat}, round)
}
