package mesh

import (
	"context"
	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	"sort"
	"strings"
	"time"

	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/topology"
)

// Telemetry is implemented by profiles whose proxies count the traffic they carry. The
// runner reads every proxy before and after each trial: the difference is stored with
// the trial, and it must account for every answered request at the entry service, or
// the trial is flagged as having bypassed the mesh.
type Telemetry interface {
	// ReadCounters reads every proxy of the deployed app now. A proxy that cannot be
	// read is returned with Err set, not dropped.
	ReadCounters(ctx context.Context, sub substrate.Substrate, app *topology.App) []meshkube.ProxyCounters
}

// ProxyDelta is what one proxy counted over a trial.
type ProxyDelta struct {
	Component string            `json:"component"`
	Pod       string            `json:"pod"`
	Version   string            `json:"version,omitempty"`
	From      time.Time         `json:"from"`
	To        time.Time         `json:"to"`
	Err       string            `json:"error,omitempty"`
	Unit      string            `json:"unit,omitempty"`
	Inbound   map[string]uint64 `json:"inbound,omitempty"`
	// InboundMTLS and InboundPlaintext split Inbound by the wire, in WireUnit, where
	// the proxy tells it (meshkube.ProxyCounters).
	InboundMTLS      map[string]uint64 `json:"inbound_mtls,omitempty"`
	InboundPlaintext map[string]uint64 `json:"inbound_plaintext,omitempty"`
	WireUnit         string            `json:"wire_unit,omitempty"`
	// InboundBytes is what an L4 proxy received into each service over the trial
	// (meshkube.ProxyCounters).
	InboundBytes map[string]uint64 `json:"inbound_bytes,omitempty"`
	Counters     map[string]uint64 `json:"counters,omitempty"`
	// Resets lists counters that went backwards: the proxy restarted during the trial,
	// and the after value is kept.
	Resets []string          `json:"resets,omitempty"`
	Gauges map[string]uint64 `json:"gauges,omitempty"`
}

// DiffCounters pairs proxies by component and pod and subtracts before from after.
// Counters that did not change are left out.
func DiffCounters(before, after []meshkube.ProxyCounters) []ProxyDelta {
	type key struct{ c, p string }
	prev := map[key]meshkube.ProxyCounters{}
	for _, b := range before {
		prev[key{b.Component, b.Pod}] = b
	}
	out := make([]ProxyDelta, 0, len(after))
	for _, a := range after {
		d := ProxyDelta{Component: a.Component, Pod: a.Pod, Version: a.Version, To: a.Time, Unit: a.Unit, Gauges: a.Gauges}
		b, ok := prev[key{a.Component, a.Pod}]
		switch {
		case a.Err != nil:
			d.Err = a.Err.Error()
		case !ok:
			d.Err = "not read before the trial"
		case b.Err != nil:
			d.Err = "before the trial: " + b.Err.Error()
		}
		if d.Err != "" {
			out = append(out, d)
			continue
		}
		d.From = b.Time
		var resets []string
		// Inbound keeps services that saw nothing: a zero there is the evidence of a
		// bypass, not an absence of data.
		d.Inbound = subtract(b.Inbound, a.Inbound, nil, true)
		if a.WireUnit != "" && a.WireUnit == b.WireUnit {
			d.WireUnit = a.WireUnit
			d.InboundMTLS = subtract(b.InboundMTLS, a.InboundMTLS, nil, true)
			d.InboundPlaintext = subtract(b.InboundPlaintext, a.InboundPlaintext, nil, true)
		}
		if a.InboundBytes != nil {
			d.InboundBytes = subtract(b.InboundBytes, a.InboundBytes, nil, true)
		}
		d.Counters = subtract(b.Counters, a.Counters, &resets, false)
		sort.Strings(resets)
		d.Resets = resets
		out = append(out, d)
	}
	return out
}

func subtract(before, after map[string]uint64, resets *[]string, keepZero bool) map[string]uint64 {
	out := map[string]uint64{}
	for k, a := range after {
		b := before[k]
		switch {
		case a < b:
			out[k] = a
			if resets != nil {
				*resets = append(*resets, k)
			}
		case a > b || keepZero:
			out[k] = a - b
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// InboundByUnit sums what proxies counted into service over a trial, per unit
// (UnitRequests, UnitConnections): a mesh may have proxies of both kinds on one path,
// such as ambient's ztunnels (connections) and its waypoint (requests). A unit is
// absent when no proxy of that kind counted the service.
func InboundByUnit(deltas []ProxyDelta, service string) map[string]uint64 {
	out := map[string]uint64{}
	for _, d := range deltas {
		if d.Err != "" {
			continue
		}
		if v, has := d.Inbound[service]; has {
			out[d.Unit] += v
		}
	}
	return out
}

// InboundBytes sums the bytes L4 proxies received into service over a trial; ok is
// false when no proxy counted bytes for it.
func InboundBytes(deltas []ProxyDelta, service string) (n uint64, ok bool) {
	for _, d := range deltas {
		if d.Err != "" {
			continue
		}
		if v, has := d.InboundBytes[service]; has {
			n += v
			ok = true
		}
	}
	return n, ok
}

// InboundTotal sums what proxies counted into service over a trial, and says in which
// unit; ok is false when no proxy counted that service at all. With proxies of two
// units it is the sum of both under the last one's unit: use InboundByUnit there.
func InboundTotal(deltas []ProxyDelta, service string) (n uint64, unit string, ok bool) {
	for _, d := range deltas {
		if d.Err != "" {
			continue
		}
		if v, has := d.Inbound[service]; has {
			n += v
			unit = d.Unit
			ok = true
		}
	}
	return n, unit, ok
}

// SeriesKey names one Prometheus series as a counter or gauge of ProxyCounters:
// name{k=v,...}, its labels sorted, or name alone without labels.
func SeriesKey(name string, labels map[string]string) string {
	if len(labels) == 0 {
		return name
	}
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + labels[k]
	}
	return name + "{" + strings.Join(parts, ",") + "}"
}
