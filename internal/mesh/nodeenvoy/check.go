package nodeenvoy

import (
	"context"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	"github.com/meshmark/meshmark/internal/mesh/meshprobe"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/telemetry"
	"github.com/meshmark/meshmark/internal/topology"
)

// adminAddr is where a node Envoy's admin listens inside its node's namespace.
var adminAddr = fmt.Sprintf("127.0.0.1:%d", AdminPort)

func adminReady(ctx context.Context, sub substrate.Substrate, node topology.Pod) error {
	r, err := mesh.ProbeHTTP(ctx, sub, node, adminAddr, "", "/ready")
	if err != nil {
		return err
	}
	if r.Status != 200 {
		return fmt.Errorf("envoy admin /ready: HTTP %d %s", r.Status, strings.TrimSpace(r.Body))
	}
	return nil
}

// InboundOf reads, from a node Envoy's counters, the requests it forwarded to each
// service: the upstream_rq_total of the service's clusters (outbound|port|version|fqdn),
// retries included.
func InboundOf(app *topology.App, counters map[string]uint64) map[string]uint64 {
	out := map[string]uint64{}
	suffix := "." + app.Namespace + ".svc.cluster.local.upstream_rq_total"
	for _, s := range app.Services {
		out[s.Name] = 0
	}
	for k, v := range counters {
		if !strings.HasPrefix(k, "cluster.outbound|") || !strings.HasSuffix(k, suffix) {
			continue
		}
		parts := strings.Split(strings.TrimSuffix(k, suffix), "|")
		if len(parts) != 4 {
			continue
		}
		if _, known := out[parts[3]]; known {
			out[parts[3]] += v
		}
	}
	return out
}

// readNode reads one node's counters: its Envoy's (l7) or its steering rules'.
func (p *Profile) readNode(ctx context.Context, sub substrate.Substrate, app *topology.App, node topology.Pod) meshkube.ProxyCounters {
	ctx, cancel := context.WithTimeout(ctx, meshprobe.ProbeTimeout)
	defer cancel()
	if !p.l7 {
		pc := meshkube.ProxyCounters{Component: "netfilter", Pod: node.Name, Time: time.Now(), Unit: meshkube.UnitConnections}
		out, err := sub.Exec(ctx, node, nil, "iptables-save", "-c", "-t", "nat")
		if err != nil {
			pc.Err = fmt.Errorf("iptables-save: %w: %s", err, strings.TrimSpace(string(out)))
			return pc
		}
		pc.Inbound = map[string]uint64{}
		for _, s := range app.Services {
			pc.Inbound[s.Name] = 0
		}
		for svc, n := range ParseRuleCounters(string(out)) {
			pc.Inbound[svc] = n
		}
		return pc
	}
	c := telemetry.NewClient(adminAddr, func(ctx context.Context, network, addr string) (net.Conn, error) {
		return sub.DialContext(ctx, node, network, addr)
	})
	snap, err := c.Snapshot(ctx)
	pc := meshkube.ProxyCounters{Component: "envoy", Pod: node.Name, Time: snap.Time, Err: err, Unit: meshkube.UnitRequests}
	if err == nil {
		pc.Version, pc.Counters, pc.Gauges = snap.Version, snap.Counters, snap.Gauges
		pc.Inbound = InboundOf(app, snap.Counters)
	}
	return pc
}

// ReadCounters reads every node proxy (mesh.Telemetry): per service, the requests the
// node's Envoy forwarded (l7: on), or the connections its steering rules passed to
// the node's service translation (l7: off). Pod is the node's name.
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

// probesPerService is how many requests each pod sends to each service: enough that
// every version with a positive weight is likely hit.
func probesPerService(s topology.Service) int {
	n := 0
	for _, v := range s.Versions {
		n += len(v.Endpoints)
	}
	return max(4, 3*n)
}

// Check proves that every pod's service traffic crosses its node's proxy: from each
// pod in turn (one at a time, so a node's counters move only for that pod), it sends
// requests on fresh connections to every service's VIP and requires the node's
// counters for that service to have grown by at least the number answered. A pod
// that still translates VIPs itself, or a node that does not steer, fails here.
func (p *Profile) Check(ctx context.Context, sub substrate.Substrate, app *topology.App) (mesh.Enrollment, error) {
	e := mesh.Enrollment{Mesh: Name, MTLS: mesh.MTLSOff, Pass: true, CheckedAt: time.Now().UTC()}
	p.mu.Lock()
	nodes := map[string]topology.Pod{}
	for name, n := range p.nodes {
		nodes[name] = n.node
	}
	p.mu.Unlock()
	what := "its node's Envoy"
	if !p.l7 {
		what = "its node's service translation"
	}
	ready := map[string]bool{}
	for name, n := range nodes {
		if !p.l7 {
			ready[name] = true
			continue
		}
		if err := adminReady(ctx, sub, n); err != nil {
			e.Fail("node %s: Envoy not ready: %v", name, err)
			continue
		}
		ready[name] = true
	}
	for _, pod := range app.Pods() {
		if ctx.Err() != nil {
			return e, ctx.Err()
		}
		row := mesh.PodEnrollment{Pod: pod.Name, Service: pod.Service, Meshed: true, MTLSObserved: "plaintext"}
		node, ok := nodes[pod.Node]
		if !ok {
			e.Fail("pod %s: no node proxy on its node %s (Install has not run?)", pod.Name, pod.Node)
			e.Pods = append(e.Pods, row)
			continue
		}
		// The proxy that carries the pod is its node's; without l7 there is none.
		row.Sidecar = p.l7 && ready[pod.Node]
		row.Notes = append(row.Notes, "carried by "+what+" on "+pod.Node)
		before := p.readNode(ctx, sub, app, node)
		if before.Err != nil {
			e.Fail("node %s: counters unreadable: %v", pod.Node, before.Err)
			e.Pods = append(e.Pods, row)
			continue
		}
		answered := map[string]uint64{}
		for _, s := range app.Services {
			if !s.VIP.IsValid() || (!p.l7 && s.Name == pod.Service) {
				continue // without l7 a pod translates its own service itself (PodRules)
			}
			n := probesPerService(s)
			failures := 0
			var lastErr string
			for range n {
				r, err := mesh.ProbeHTTP(ctx, sub, pod, mesh.Addr(s.VIP, s.Port), fmt.Sprintf("%s:%d", s.Name, s.Port), "/")
				switch {
				case err != nil:
					failures++
					lastErr = err.Error()
				case r.ProxyGenerated:
					failures++
					lastErr = fmt.Sprintf("HTTP %d from the proxy: %.120s", r.Status, r.Body)
				default:
					answered[s.Name]++
				}
			}
			if failures > 0 {
				e.Fail("pod %s -> service %s: %d of %d probes failed (last: %s)", pod.Name, s.Name, failures, n, lastErr)
			}
		}
		after := p.readNode(ctx, sub, app, node)
		if after.Err != nil {
			e.Fail("node %s: counters unreadable after probing: %v", pod.Node, after.Err)
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
				e.Fail("pod %s -> service %s: %d requests answered but %s on %s counted %d %s: the traffic bypassed the node proxy",
					pod.Name, s.Name, answered[s.Name], what, pod.Node, got, after.Unit)
			}
		}
		e.Pods = append(e.Pods, row)
	}
	sort.Strings(e.Failures)
	return e, nil
}
