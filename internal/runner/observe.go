package runner

import (
	"github.com/meshmark/meshmark/internal/load"
	"github.com/meshmark/meshmark/internal/metrics"
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
	mi, err := metrics.FromLoadInterval(o.Service, iv)
	if err != nil {
		return // an undecodable interval histogram only costs the live view one point
	}
	o.Recorder.ObserveInterval(metrics.RunLabels{Mesh: mesh, Experiment: experiment, Repeat: repeat}, mi)
}

// Round implements Observer.
func (o MetricsObserver) Round(mesh, experiment string, repeat int, round sampler.Round) {
	o.Recorder.ObserveRound(metrics.RunLabels{Mesh: mesh, Experiment: experiment, Repeat: repeat}, round)
}
