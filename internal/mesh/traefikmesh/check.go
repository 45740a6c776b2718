package traefikmesh

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	"github.com/meshmark/meshmark/internal/mesh/meshprobe"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/topology"
)

// metricsAddr is where a node proxy serves /metrics and /ping inside its node.
var metricsAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(MetricsPort))

var (
	sampleLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? ([^ ]+)`)
	labelPair  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)
)

// Metrics are what one Traefik exposes: per router, the requests it handled, and
// every unlabelled counter or gauge.
type Metrics struct {
	RouterRequests map[string]uint64 // by router name without "@file"
	Values         map[string]uint64
}

// ParseMetrics reads Traefik's Prometheus text exposition. Only what the profile uses
// is kept: traefik_router_requests_total summed per router, and the unlabelled
// samples (process and Go runtime figures). A malformed line is an error naming it.
func ParseMetrics(text string) (Metrics, error) {
	m := Metrics{RouterRequests: map[string]uint64{}, Values: map[string]uint64{}}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 64*1024), 4*1024*1024)
	line := 0
	for sc.Scan() {
		line++
		l := sc.Text()
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		s := sampleLine.FindStringSubmatch(l)
		if s == nil {
			return m, fmt.Errorf("traefik metrics line %d: not a sample: %.80q", line, l)
		}
		v, err := strconv.ParseFloat(s[4], 64)
		if err != nil {
			return m, fmt.Errorf("traefik metrics line %d: value %q: %v", line, s[4], err)
		}
		if v < 0 {
			continue
		}
		switch {
		case s[1] == "traefik_router_requests_total":
			for _, lp := range labelPair.FindAllStringSubmatch(s[3], -1) {
				if lp[1] == "router" {
					m.RouterRequests[strings.TrimSuffix(lp[2], "@file")] += uint64(v)
				}
			}
		case s[2] == "":
			m.Values[s[1]] = uint64(v)
		}
	}
	if err := sc.Err(); err != nil {
		return m, fmt.Errorf("traefik metrics line %d: %w", line+1, err)
	}
	return m, nil
}

// readNode reads one node proxy's metrics.
func (p *Profile) readNode(ctx context.Context, sub substrate.Substrate, app *topology.App, node topology.Pod) meshkube.ProxyCounters {
	ctx, cancel := context.WithTimeout(ctx, meshprobe.ProbeTimeout)
	defer cancel()
	p.mu.Lock()
	version := p.version
	p.mu.Unlock()
	pc := meshkube.ProxyCounters{Component: "traefik", Pod: node.Name, Version: version, Time: time.Now(), Unit: meshkube.UnitRequests}
	r, err := fetch(ctx, sub, node, "/metrics")
	if err != nil {
		pc.Err = err
		return pc
	}
	m, err := ParseMetrics(r)
	if err != nil {
		pc.Err = err
		return pc
	}
	pc.Inbound = map[string]uint64{}
	for _, s := range app.Services {
		pc.Inbound[s.Name] = m.RouterRequests[s.Name]
	}
	pc.Counters, pc.Gauges = map[string]uint64{}, map[string]uint64{}
	for k, v := range m.Values {
		if strings.HasSuffix(k, "_total") {
			pc.Counters[k] = v
		} else {
			pc.Gauges[k] = v
		}
	}
	return pc
}

// fetch GETs a path of the node proxy's metrics entry point, as much as it sends.
func fetch(ctx context.Context, sub substrate.Substrate, node topology.Pod, path string) (string, error) {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return sub.DialContext(ctx, node, network, addr)
		},
		DisableKeepAlives: true,
	}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+metricsAddr+path, nil)
	if err != nil {
		return "", err
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return "", fmt.Errorf("traefik %s on %s: %w", path, node.Name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return "", fmt.Errorf("traefik %s on %s: %w", path, node.Name, err)
	}
	if resp.StatusCode != 200 {
		return "", fmt.Errorf("traefik %s on %s: HTTP %d", path, node.Name, resp.StatusCode)
	}
	return string(body), nil
}

// ReadCounters reads every node proxy (mesh.Telemetry): per service, the requests its
// router handled on that node. Pod is the node's name.
func (p *Profile) ReadCounters(ctx context.Context, sub substrate.Substrate, app *topology.App) []meshkube.ProxyCounters {
	p.mu.Lock()
	nodes := make([]topology.Pod, 0, len(p.nodes))
	for _, n := range p.nodes {
		nodes = append(nodes, n.node)
	}
	p.mu.Unlock()
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].Name < nodes[j].Name })
	out := make([]meshkube.ProxyCounters, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = p.readNode(ctx, sub, app, n)
		}()
	}
	wg.Wait()
	return out
}

func probesPerService(s topology.Service) int {
	n := 0
	for _, v := range s.Versions {
		n += len(v.Endpoints)
	}
	return max(4, 3*n)
}

// Check proves that every pod's calls by mesh name cross its own node's Traefik: from
// each pod in turn it calls every service at the address the workload is given
// (CalleeAddress) and requires that node's router counter for the service to grow by
// at least the number answered. A pod whose mesh address leads anywhere but its node's
// proxy fails here.
func (p *Profile) Check(ctx context.Context, sub substrate.Substrate, app *topology.App) (mesh.Enrollment, error) {
	e := mesh.Enrollment{Mesh: Name, MTLS: mesh.MTLSOff, Pass: true, CheckedAt: time.Now().UTC()}
	p.mu.Lock()
	nodes := map[string]topology.Pod{}
	for name, n := range p.nodes {
		nodes[name] = n.node
	}
	p.mu.Unlock()
	for _, pod := range app.Pods() {
		if ctx.Err() != nil {
			return e, ctx.Err()
		}
		row := mesh.PodEnrollment{Pod: pod.Name, Service: pod.Service, Meshed: true, MTLSObserved: "plaintext"}
		node, ok := nodes[pod.Node]
		if !ok {
			e.Fail("pod %s: no Traefik on its node %s (Install has not run?)", pod.Name, pod.Node)
			e.Pods = append(e.Pods, row)
			continue
		}
		row.Notes = append(row.Notes, "calls services by mesh name through Traefik on "+pod.Node)
		before := p.readNode(ctx, sub, app, node)
		if before.Err != nil {
			e.Fail("node %s: Traefik metrics unreadable: %v", pod.Node, before.Err)
			e.Pods = append(e.Pods, row)
			continue
		}
		row.Sidecar = true // its node's proxy answered
		answered := map[string]uint64{}
		for _, s := range app.Services {
			authority, dial, ok := p.CalleeAddress(pod, s.Name)
			if !ok {
				e.Fail("pod %s: no mesh address for service %s", pod.Name, s.Name)
				continue
			}
			n := probesPerService(s)
			failures := 0
			var lastErr string
			for range n {
				r, err := mesh.ProbeHTTP(ctx, sub, pod, dial, authority, "/")
				switch {
				case err != nil:
					failures++
					lastErr = err.Error()
				case r.Status >= 500 || r.Status == 404:
					failures++
					lastErr = fmt.Sprintf("HTTP %d: %.120s", r.Status, r.Body)
				default:
					answered[s.Name]++
				}
			}
			if failures > 0 {
				e.Fail("pod %s -> %s: %d of %d probes failed (last: %s)", pod.Name, authority, failures, n, lastErr)
			}
		}
		after := p.readNode(ctx, sub, app, node)
		if after.Err != nil {
			e.Fail("node %s: Traefik metrics unreadable after probing: %v", pod.Node, after.Err)
			e.Pods = append(e.Pods, row)
			continue
		}
		for _, s := range app.Services {
			got := after.Inbound[s.Name] - min(after.Inbound[s.Name], before.Inbound[s.Name])
			row.OutboundRequests += got
			if answered[s.Name] > 0 {
				row.Answered = true
			}
			if got < answered[s.Name] {
				e.Fail("pod %s -> service %s: %d requests answered but Traefik on %s counted %d: the calls bypassed the node proxy",
					pod.Name, s.Name, answered[s.Name], pod.Node, got)
			}
		}
		e.Pods = append(e.Pods, row)
	}
	sort.Strings(e.Failures)
	return e, nil
}
