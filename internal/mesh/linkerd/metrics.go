package linkerd

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	"github.com/meshmark/meshmark/internal/mesh/meshprobe"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/topology"
)

// Metrics is one scrape of a proxy's /metrics, parsed.
type Metrics struct {
	Families map[string]*dto.MetricFamily
	Time     time.Time
}

// ParseMetrics reads the Prometheus text format linkerd2-proxy serves.
func ParseMetrics(r io.Reader) (Metrics, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return Metrics{}, fmt.Errorf("linkerd2-proxy metrics: %w", err)
	}
	return Metrics{Families: fams, Time: time.Now()}, nil
}

func labelsOf(m *dto.Metric) map[string]string {
	out := make(map[string]string, len(m.GetLabel()))
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

func valueOf(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Untyped != nil:
		return m.GetUntyped().GetValue()
	}
	return 0
}

// Sum adds the samples of family name whose labels include every pair of match.
func (ms Metrics) Sum(name string, match map[string]string) uint64 {
	return ms.SumWhere(name, func(ls map[string]string) bool {
		for k, v := range match {
			if ls[k] != v {
				return false
			}
		}
		return true
	})
}

// SumWhere adds the samples of family name whose labels satisfy keep.
func (ms Metrics) SumWhere(name string, keep func(map[string]string) bool) uint64 {
	f := ms.Families[name]
	if f == nil {
		return 0
	}
	var n float64
	for _, m := range f.GetMetric() {
		if keep(labelsOf(m)) {
			n += valueOf(m)
		}
	}
	return uint64(n)
}

// proxyPort says whether a target port is the proxy's own (admin, tap): the proxy
// counts requests to its admin server as inbound too, and the check's own scrapes
// must not pass for application traffic.
func proxyPort(port string) bool {
	return port == fmt.Sprint(AdminPort) || port == fmt.Sprint(ControlPort)
}

// inbound counts inbound requests to application ports whose tls label is tls ("" for
// any), the kubelet's probes left out.
func (ms Metrics) inbound(tls string) uint64 {
	return ms.SumWhere("request_total", func(ls map[string]string) bool {
		return ls["direction"] == "inbound" && !proxyPort(ls["target_port"]) && !kubeletProbe(ls) && (tls == "" || ls["tls"] == tls)
	})
}

// kubeletProbe says whether a series is the requests of Linkerd's default probe route:
// the kubelet's liveness and readiness probes, which the default policy admits in
// plaintext on the application's port even under all-authenticated. On a cluster they
// arrive every few seconds whatever the mesh carries, so they prove no traffic and are
// no plaintext the mesh should have refused (a real cluster's burst counted 1–2 of
// them per pod). A route of the user's own is route_kind HTTPRoute, not default.
func kubeletProbe(ls map[string]string) bool {
	return ls["route_kind"] == "default" && ls["route_name"] == "probe"
}

// Traffic is what the enrollment check reads from one proxy: HTTP requests by direction
// and transport security (request_total, the proxy's per-request counter).
type Traffic struct {
	InboundMTLS, InboundPlaintext, Outbound, OutboundMTLS uint64
	// Denied counts inbound requests or connections policy refused.
	Denied uint64
}

// TrafficOf extracts the enrollment counters.
func TrafficOf(ms Metrics) Traffic {
	return Traffic{
		InboundMTLS:      ms.inbound("true"),
		InboundPlaintext: ms.inbound("no_identity"),
		Outbound:         ms.Sum("request_total", map[string]string{"direction": "outbound"}),
		OutboundMTLS:     ms.Sum("request_total", map[string]string{"direction": "outbound", "tls": "true"}),
		Denied:           ms.Sum("inbound_http_authz_deny_total", nil) + ms.Sum("inbound_tcp_authz_deny_total", nil),
	}
}

// Sub is t minus an earlier reading (a restarted proxy's later reading stands alone).
func (t Traffic) Sub(b Traffic) Traffic {
	d := func(a, b uint64) uint64 {
		if a < b {
			return a
		}
		return a - b
	}
	return Traffic{
		InboundMTLS: d(t.InboundMTLS, b.InboundMTLS), InboundPlaintext: d(t.InboundPlaintext, b.InboundPlaintext),
		Outbound: d(t.Outbound, b.Outbound), OutboundMTLS: d(t.OutboundMTLS, b.OutboundMTLS), Denied: d(t.Denied, b.Denied),
	}
}

// scrape fetches a proxy's /metrics through its pod.
func scrape(ctx context.Context, sub substrate.Substrate, pod topology.Pod) (Metrics, error) {
	ctx, cancel := context.WithTimeout(ctx, meshprobe.ProbeTimeout)
	defer cancel()
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
			return sub.DialContext(ctx, pod, network, a)
		},
		DisableKeepAlives: true,
	}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+adminAddr+"/metrics", nil)
	if err != nil {
		return Metrics{}, err
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return Metrics{}, fmt.Errorf("pod %s: linkerd2-proxy /metrics: %w", pod.Name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return Metrics{}, fmt.Errorf("pod %s: linkerd2-proxy /metrics: HTTP %d", pod.Name, resp.StatusCode)
	}
	return ParseMetrics(io.LimitReader(resp.Body, 32<<20))
}

func readTraffic(ctx context.Context, sub substrate.Substrate, pod topology.Pod) (Traffic, error) {
	ms, err := scrape(ctx, sub, pod)
	if err != nil {
		return Traffic{}, err
	}
	return TrafficOf(ms), nil
}

// keptFamilies are the metric families stored with a trial: request and response
// counts, connection counts, transport bytes, authorization decisions, identity and
// control-plane health, process resources (where the build exports them). Per-label
// series are flattened as name{k=v,...}.
var keptFamilies = []string{
	"request_total", "response_total", "tcp_open_total", "tcp_close_total",
	"tcp_read_bytes_total", "tcp_write_bytes_total", "tcp_open_connections",
	"inbound_http_authz_allow_total", "inbound_http_authz_deny_total",
	"inbound_tcp_authz_allow_total", "inbound_tcp_authz_deny_total",
	// The control plane as the proxy sees it: a dead control plane shows as failed
	// responses and no ready endpoint, while the data plane keeps serving.
	"control_request_total", "control_response_total",
	"control_destination_balancer_endpoints", "control_policy_balancer_endpoints",
	"control_identity_cert_refreshes_total", "control_identity_cert_expiration_timestamp_seconds",
	"process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds",
}

// flatten turns kept families into counter and gauge maps.
func flatten(ms Metrics) (counters, gauges map[string]uint64) {
	counters, gauges = map[string]uint64{}, map[string]uint64{}
	for _, name := range keptFamilies {
		f := ms.Families[name]
		if f == nil {
			continue
		}
		for _, m := range f.GetMetric() {
			key, v := mesh.SeriesKey(name, labelsOf(m)), valueOf(m)
			if name == "process_cpu_seconds_total" {
				key, v = "process_cpu_microseconds_total", v*1e6
			}
			if f.GetType() == dto.MetricType_GAUGE {
				gauges[key] += uint64(v)
			} else {
				counters[key] += uint64(v)
			}
		}
	}
	return counters, gauges
}

// ReadCounters scrapes every proxy (mesh.Telemetry): inbound HTTP requests for the
// pod's service, and the kept families.
func (p *Profile) ReadCounters(ctx context.Context, sub substrate.Substrate, _ *topology.App) []meshkube.ProxyCounters {
	p.mu.Lock()
	pxs := make([]*proxy, 0, len(p.proxies))
	for _, px := range p.proxies {
		pxs = append(pxs, px)
	}
	p.mu.Unlock()
	sort.Slice(pxs, func(i, j int) bool { return pxs[i].pod.Name < pxs[j].pod.Name })
	out := make([]meshkube.ProxyCounters, len(pxs))
	var wg sync.WaitGroup
	for i, px := range pxs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ms, err := scrape(ctx, sub, px.pod)
			pc := meshkube.ProxyCounters{Unit: meshkube.UnitRequests}
			if err == nil {
				pc = countersOf(ms, px.pod.Service)
			}
			pc.Component, pc.Pod, pc.Time, pc.Err = Component, px.pod.Name, ms.Time, err
			if err != nil {
				pc.Time = time.Now()
			}
			out[i] = pc
		}()
	}
	wg.Wait()
	if cp := p.controlPlaneHealth(ctx, sub); cp != nil {
		out = append(out, *cp)
	}
	return out
}

// Component names the proxy among a trial's counters.
const Component = "linkerd2-proxy"

// countersOf is what a trial keeps of one scrape: inbound HTTP requests for the pod's
// service (none for a pod of no service), and the kept families.
func countersOf(ms Metrics, service string) meshkube.ProxyCounters {
	pc := meshkube.ProxyCounters{Unit: meshkube.UnitRequests, Version: proxyVersion(ms)}
	pc.Counters, pc.Gauges = flatten(ms)
	if service != "" {
		all := ms.inbound("")
		mtls := min(ms.inbound("true"), all)
		pc.Inbound = map[string]uint64{service: all}
		pc.WireUnit = meshkube.UnitRequests
		pc.InboundMTLS, pc.InboundPlaintext = map[string]uint64{service: mtls}, map[string]uint64{service: all - mtls}
	}
	return pc
}

// readKubeMetrics reads one linkerd-proxy's /metrics on a cluster (meshkube.ProxyEndpoint)
// as ReadCounters reads a local one.
func readKubeMetrics(body io.Reader, of meshkube.ProxyScrape) (meshkube.ProxyCounters, error) {
	ms, err := ParseMetrics(body)
	if err != nil {
		return meshkube.ProxyCounters{}, err
	}
	return countersOf(ms, of.Service), nil
}

// ControlPlaneComponent names the control plane's entry among the proxy counters.
const ControlPlaneComponent = "linkerd-control-plane"

// controlPlaneHealth is an entry for the control plane beside the proxies: its three
// APIs answer a TCP connect, or Err says which does not. A control plane that died
// during a trial is stored with the trial that way, while the proxies' own
// control_response_total counts the streams it broke.
func (p *Profile) controlPlaneHealth(ctx context.Context, sub substrate.Substrate) *meshkube.ProxyCounters {
	p.mu.Lock()
	cp, pod, ip := p.cp, p.cpPod, p.cpIP
	p.mu.Unlock()
	if cp == nil {
		return nil
	}
	pc := &meshkube.ProxyCounters{Component: ControlPlaneComponent, Pod: pod.Name, Time: time.Now(), Gauges: map[string]uint64{}}
	var down []string
	for _, api := range []struct {
		name string
		port uint16
	}{{"identity", IdentityPort}, {"destination", DestinationPort}, {"policy", PolicyPort}} {
		dctx, cancel := context.WithTimeout(ctx, meshprobe.ProbeTimeout)
		c, err := sub.DialContext(dctx, pod, "tcp", netip.AddrPortFrom(ip, api.port).String())
		cancel()
		if err != nil {
			down = append(down, api.name)
			continue
		}
		c.Close()
		pc.Gauges[api.name+"_api_up"] = 1
	}
	if len(down) > 0 {
		pc.Err = fmt.Errorf("control plane (pid %d, log %s): %s API not answering", cp.PID(), cp.LogPath(), strings.Join(down, ", "))
	}
	return pc
}

// proxyVersion reads proxy_build_info's version label.
func proxyVersion(ms Metrics) string {
	if f := ms.Families["proxy_build_info"]; f != nil && len(f.GetMetric()) > 0 {
		return labelsOf(f.GetMetric()[0])["version"]
	}
	return ""
}
