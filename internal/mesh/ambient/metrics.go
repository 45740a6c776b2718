package ambient

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	"github.com/meshmark/meshmark/internal/mesh/meshprobe"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/telemetry"
	"github.com/meshmark/meshmark/internal/topology"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// ztunnel's connection metrics (Istio's standard TCP metrics, one series per reporter,
// source and destination workload and security policy).
const (
	metricOpened   = "istio_tcp_connections_opened_total"
	metricClosed   = "istio_tcp_connections_closed_total"
	metricSent     = "istio_tcp_sent_bytes_total"
	metricReceived = "istio_tcp_received_bytes_total"
)

// Series is one counter sample with its labels.
type Series struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// ScrapeMetrics reads a ztunnel's Prometheus endpoint from inside its node namespace.
func ScrapeMetrics(ctx context.Context, sub substrate.Substrate, node topology.Pod) ([]Series, error) {
	ctx, cancel := context.WithTimeout(ctx, meshprobe.ProbeTimeout)
	defer cancel()
	tr := &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		return sub.DialContext(ctx, node, network, addr)
	}}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s:%d/metrics", node.IP, MetricsPort), nil)
	if err != nil {
		return nil, err
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return nil, fmt.Errorf("ztunnel metrics on %s: %w", node.Name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("ztunnel metrics on %s: HTTP %d", node.Name, resp.StatusCode)
	}
	return ParseMetrics(io.LimitReader(resp.Body, 16<<20))
}

// ParseMetrics parses Prometheus (or OpenMetrics-compatible) text into counter and
// gauge samples.
func ParseMetrics(r io.Reader) ([]Series, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parse ztunnel metrics: %w", err)
	}
	var out []Series
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			s := Series{Name: name, Labels: map[string]string{}}
			for _, l := range m.GetLabel() {
				s.Labels[l.GetName()] = l.GetValue()
			}
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				s.Value = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				s.Value = m.GetGauge().GetValue()
			case dto.MetricType_UNTYPED:
				// ztunnel writes OpenMetrics-style TYPE lines without the _total suffix
				// its samples carry, so the text parser sees the samples as untyped.
				s.Value = m.GetUntyped().GetValue()
			default:
				continue
			}
			out = append(out, s)
		}
	}
	return out, nil
}

// Sum adds the samples of name whose labels include every pair in match.
func Sum(series []Series, name string, match map[string]string) float64 {
	var n float64
	for _, s := range series {
		if s.Name != name {
			continue
		}
		ok := true
		for k, v := range match {
			if s.Labels[k] != v {
				ok = false
				break
			}
		}
		if ok {
			n += s.Value
		}
	}
	return n
}

// ReadCounters snapshots every node's ztunnel (mesh.Telemetry): inbound connections per
// destination service (counted by the destination's ztunnel), and connection and byte
// totals per reporter; with a waypoint, also the waypoint's requests per service
// (ztunnel still counts what reaches a pod without it: callers from outside the mesh).
func (p *Profile) ReadCounters(ctx context.Context, sub substrate.Substrate, app *topology.App) []meshkube.ProxyCounters {
	p.mu.Lock()
	nodes := make([]*nodeProxy, 0, len(p.nodes))
	for _, n := range p.nodes {
		nodes = append(nodes, n)
	}
	wp := p.waypoint
	p.mu.Unlock()
	sortNodes(nodes)
	out := make([]meshkube.ProxyCounters, len(nodes))
	for i, n := range nodes {
		series, err := ScrapeMetrics(ctx, sub, n.pod)
		pc := meshkube.ProxyCounters{Unit: meshkube.UnitConnections}
		if err == nil {
			services := make([]string, len(app.Services))
			for j, s := range app.Services {
				services[j] = s.Name
			}
			pc = countersOf(series, services, "")
		}
		pc.Component, pc.Pod, pc.Time, pc.Err = Component, n.node, time.Now(), err
		out[i] = pc
	}
	if wp != nil {
		out = append(out, readWaypoint(ctx, sub, app, wp))
	}
	return out
}

// Component names ztunnel among a trial's counters.
const Component = "ztunnel"

// countersOf is what a trial keeps of one ztunnel's series: inbound connections per
// service, counted by the destination's ztunnel (of namespace's workloads only, unless
// namespace is empty: on a shared cluster another namespace may have a service of the
// same name), and connection and byte totals per reporter.
func countersOf(series []Series, services []string, namespace string) meshkube.ProxyCounters {
	pc := meshkube.ProxyCounters{Unit: meshkube.UnitConnections, Inbound: map[string]uint64{}, Counters: map[string]uint64{},
		WireUnit: meshkube.UnitConnections, InboundMTLS: map[string]uint64{}, InboundPlaintext: map[string]uint64{},
		InboundBytes: map[string]uint64{}}
	for _, s := range services {
		match := map[string]string{"reporter": "destination", "destination_canonical_service": s}
		if namespace != "" {
			match["destination_workload_namespace"] = namespace
		}
		// ztunnel adds to its byte counters as the bytes flow, not when a connection
		// closes, so a connection kept open through a trial shows the trial's bytes.
		pc.InboundBytes[s] = uint64(Sum(series, metricReceived, match))
		all := uint64(Sum(series, metricOpened, match))
		match["connection_security_policy"] = "mutual_tls"
		mtls := min(uint64(Sum(series, metricOpened, match)), all)
		pc.Inbound[s], pc.InboundMTLS[s], pc.InboundPlaintext[s] = all, mtls, all-mtls
	}
	for _, m := range []string{metricOpened, metricClosed, metricSent, metricReceived} {
		for _, r := range []string{"source", "destination"} {
			pc.Counters[strings.TrimPrefix(m, "istio_")+"{reporter="+r+"}"] = uint64(Sum(series, m, map[string]string{"reporter": r}))
		}
	}
	return pc
}

// readKubeMetrics reads one ztunnel's /metrics on a cluster (meshkube.ProxyEndpoint) as
// ReadCounters reads a local one, counting the app's namespace only.
func readKubeMetrics(body io.Reader, of meshkube.ProxyScrape) (meshkube.ProxyCounters, error) {
	series, err := ParseMetrics(body)
	if err != nil {
		return meshkube.ProxyCounters{}, err
	}
	return countersOf(series, of.Services, of.Namespace), nil
}

// readWaypoint snapshots the waypoint Envoy's admin: requests per service.
func readWaypoint(ctx context.Context, sub substrate.Substrate, app *topology.App, wp *waypointProxy) meshkube.ProxyCounters {
	c := telemetry.NewClient(fmt.Sprintf("127.0.0.1:%d", WaypointAdminPort), func(ctx context.Context, network, addr string) (net.Conn, error) {
		return sub.DialContext(ctx, wp.pod, network, addr)
	})
	sctx, cancel := context.WithTimeout(ctx, meshprobe.ProbeTimeout)
	defer cancel()
	snap, err := c.Snapshot(sctx)
	pc := meshkube.ProxyCounters{Component: WaypointComponent, Pod: wp.pod.Name, Time: snap.Time, Err: err, Unit: meshkube.UnitRequests}
	if err != nil {
		pc.Time = time.Now()
		return pc
	}
	pc.Version, pc.Counters, pc.Gauges = snap.Version, snap.Counters, snap.Gauges
	pc.Inbound = map[string]uint64{}
	for _, s := range app.Services {
		pc.Inbound[s.Name] = snap.Counters["http."+waypointStatPrefix(s.Name)+".downstream_rq_total"]
	}
	return pc
}
