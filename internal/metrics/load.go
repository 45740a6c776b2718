package metrics

import (
	"fmt"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"

	"github.com/meshmark/meshmark/internal/load"
)

// LatencyFromHDR lists the non-empty value ranges of an HDR histogram recorded in unit
// (the load engine records microseconds) as latency counts, each at the highest value
// of its range so that Prometheus "le" buckets never under-report a latency.
func LatencyFromHDR(h *hdrhistogram.Histogram, unit time.Duration) []LatencyCount {
	if h == nil {
		return nil
	}
	var out []LatencyCount
	for _, b := range h.Distribution() {
		if b.Count > 0 {
			out = append(out, LatencyCount{Value: time.Duration(b.To) * unit, Count: uint64(b.Count)})
		}
	}
	return out
}

// FromLoadInterval converts one interval of the load engine's result into the
// Interval ObserveInterval takes, for the given service label.
func FromLoadInterval(service string, iv load.Interval) (Interval, error) {
	out := Interval{Service: service, Duration: iv.Length, RequestedRate: iv.RequestedRate,
		Completed: uint64(max(iv.Completed, 0)), Errors: map[string]uint64{}}
	for kind, n := range map[string]int64{"refused": iv.Errors.Refused, "reset": iv.Errors.Reset,
		"timeout": iv.Errors.Timeout, "non2xx": iv.Errors.Non2xx, "other": iv.Errors.Other, "lookup": iv.Errors.Lookup} {
		if n > 0 {
			out.Errors[kind] = uint64(n)
		}
	}
	if iv.Latency != "" {
		h, err := load.DecodeHistogram(iv.Latency)
		if err != nil {
			return out, fmt.Errorf("interval at %s: latency histogram: %w", iv.Start, err)
		}
		out.Latency = LatencyFromHDR(h, time.Microsecond)
	}
	return out, nil
}
