package ambient

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/meshmark/meshmark/internal/gateway"
	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/meshprobe"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/topology"
)

func sortNodes(ns []*nodeProxy) {
	sort.Slice(ns, func(i, j int) bool { return ns[i].node < ns[j].node })
}

// Check proves enrollment from ztunnel's own metrics: every enrolled pod sends probe
// requests to every service through its interception; afterwards each pod must appear
// in its node's ztunnel as a source (outbound crossed it) and each service pod as a
// destination reached over mutual TLS (HBONE); a pod not handed to ztunnel shows up in
// neither and fails the check. Connections between pods on different nodes must be
// HBONE on port 15008 (seen in the source pod's socket table, where ztunnel opens
// them). A client outside the mesh then dials every service pod directly: accepted
// under permissive, refused under strict.
func (p *Profile) Check(ctx context.Context, sub substrate.Substrate, app *topology.App) (mesh.Enrollment, error) {
	e := mesh.Enrollment{Mesh: Name, MTLS: p.mode, Pass: true, CheckedAt: time.Now()}
	p.mu.Lock()
	enrolled := map[string]bool{}
	for name := range p.enrolled {
		enrolled[name] = true
	}
	nodes := map[string]*nodeProxy{}
	for k, v := range p.nodes {
		nodes[k] = v
	}
	wp := p.waypoint
	p.mu.Unlock()
	if len(nodes) == 0 {
		return e, fmt.Errorf("%s: not installed", Name)
	}
	meshedPods := p.MeshedPods(app)
	meshed := map[string]bool{}
	for _, pod := range meshedPods {
		meshed[pod.Name] = true
	}
	// A ztunnel that cannot be read is a failed enrollment (its pods have no proxy),
	// not a check that could not run.
	scrape := func(when string) map[string][]Series {
		out := map[string][]Series{}
		for name, n := range nodes {
			s, err := ScrapeMetrics(ctx, sub, n.pod)
			if err != nil {
				e.Fail("ztunnel on %s %s the probes: %v (log: %s)", name, when, err, n.logPath())
			}
			out[name] = s
		}
		return out
	}
	before := scrape("before")

	hbone := map[string]bool{}
	for _, from := range meshedPods {
		for _, s := range app.Services {
			for range probesPerService(s) {
				r, err := mesh.ProbeHTTP(ctx, sub, from, fmt.Sprintf("%s:%d", s.VIP, s.Port), "", "/")
				if err != nil || r.Status >= 500 {
					e.Fail("pod %s: request to %s failed: %v (HTTP %d)", from.Name, s.Name, err, r.Status)
					break
				}
			}
		}
		// Without a waypoint, one request also goes straight to a pod on another node
		// (through ztunnel as HBONE all the same), so that the cross-node check below
		// does not hang on where ztunnel's balancing happened to send the service
		// requests: a pod whose services' other-node endpoints have small shares
		// could otherwise reach none of them.
		if wp == nil {
			if to, ok := otherNodeTarget(app, from); ok {
				r, err := mesh.ProbeHTTP(ctx, sub, from, mesh.Addr(to.IP, to.Port), "", "/")
				if err != nil || r.Status >= 500 {
					e.Fail("pod %s: request to pod %s on %s failed: %v (HTTP %d)", from.Name, to.Name, to.Node, err, r.Status)
				}
			}
		}
		// Cross-node HBONE: ztunnel keeps pooled HBONE connections open for a while,
		// so the source pod's socket table shows them after the probes.
		for _, peer := range hbonePeers(ctx, sub, from) {
			hbone[from.Name+">"+peer] = true
		}
	}

	after := scrape("after")
	delta := func(node, metric string, match map[string]string) float64 {
		return Sum(after[node], metric, match) - Sum(before[node], metric, match)
	}

	for _, pod := range app.Pods() {
		pe := mesh.PodEnrollment{Pod: pod.Name, Service: pod.Service, Meshed: meshed[pod.Name]}
		if pod.Service == gateway.Service {
			e.Pods = append(e.Pods, p.checkGateway(ctx, sub, app, &e, pod))
			continue
		}
		if !pe.Meshed {
			e.Pods = append(e.Pods, pe)
			continue
		}
		pe.Sidecar = enrolled[pod.Name] // handed to its node's ztunnel
		out := delta(pod.Node, metricOpened, map[string]string{"reporter": "source", "source_workload": pod.Name})
		pe.OutboundRequests = uint64(out)
		if out == 0 {
			e.Fail("pod %s: no outbound connection crossed ztunnel on %s", pod.Name, pod.Node)
		}
		if pod.Service != "" {
			in := delta(pod.Node, metricOpened, map[string]string{"reporter": "destination", "destination_workload": pod.Name})
			inMTLS := delta(pod.Node, metricOpened, map[string]string{"reporter": "destination", "destination_workload": pod.Name, "connection_security_policy": "mutual_tls"})
			pe.InboundRequests, pe.InboundMTLS = uint64(in), uint64(inMTLS)
			pe.InboundPlaintext = uint64(in - inMTLS)
			pe.Answered = in > 0
			if inMTLS == 0 && receivesTraffic(app, pod) {
				e.Fail("pod %s: no inbound mTLS connection counted by ztunnel on %s", pod.Name, pod.Node)
			}
		}
		pe.MTLSObserved = mesh.ObservedMode(pe.InboundMTLS, pe.InboundPlaintext)
		if wp == nil {
			pe.Notes = append(pe.Notes, "counts are connections (ztunnel is L4); the version split is per connection")
		} else {
			pe.Notes = append(pe.Notes, "counts are ztunnel's connections; the waypoint applies the version split per request")
		}
		if !pe.Sidecar {
			e.Fail("pod %s: not handed to ztunnel", pod.Name)
		}
		e.Pods = append(e.Pods, pe)
	}

	// Traffic between nodes must be HBONE: every pod with a destination on another
	// node must hold an HBONE connection to one; through a waypoint, every pod holds
	// one to the waypoint, and the waypoint to every destination on another node.
	if wp != nil {
		for _, from := range meshedPods {
			if !hbone[from.Name+">"+wp.pod.IP.String()] {
				e.Fail("pod %s: no HBONE connection (port %d) to the waypoint %s", from.Name, HBONEPort, wp.pod.IP)
			}
		}
		fromWaypoint := map[string]bool{}
		for _, peer := range hbonePeers(ctx, sub, wp.pod) {
			fromWaypoint[peer] = true
		}
		for _, pod := range app.Pods() {
			if pod.Service == "" || pod.Node == wp.pod.Node || !receivesTraffic(app, pod) {
				continue
			}
			if !fromWaypoint[pod.IP.String()] {
				e.Fail("waypoint: no HBONE connection (port %d) to %s on %s", HBONEPort, pod.Name, pod.Node)
			} else {
				e.Pods = appendNote(e.Pods, pod.Name, fmt.Sprintf("HBONE from the waypoint on %s", wp.pod.Node))
			}
		}
	}
	for _, from := range meshedPods {
		if wp != nil {
			break
		}
		expected, seen := false, false
		for _, s := range app.Services {
			for _, v := range s.Versions {
				for _, to := range v.Endpoints {
					if to.Node == from.Node || !receivesTraffic(app, to) {
						continue
					}
					expected = true
					if hbone[from.Name+">"+to.IP.String()] {
						seen = true
						e.Pods = appendNote(e.Pods, from.Name, fmt.Sprintf("HBONE to %s (%s:%d) on another node", to.Name, to.IP, HBONEPort))
					}
				}
			}
		}
		if expected && !seen {
			e.Fail("pod %s: no HBONE connection (port %d) to a pod on another node", from.Name, HBONEPort)
		}
	}

	if wp != nil {
		p.checkWaypoint(ctx, sub, app, &e, wp)
	}

	// Plaintext from outside the mesh.
	if outsider, what, ok := p.outsider(sub, app); ok {
		var plaintext, controls []meshprobe.PlaintextProbe
		for _, s := range app.Services {
			if s.Name == gateway.Service {
				continue // it faces the outside by design (checkGateway)
			}
			for _, v := range s.Versions {
				for _, to := range v.Endpoints {
					addr := mesh.Addr(to.IP, to.Port)
					r, err := mesh.ProbeHTTP(ctx, sub, outsider, addr, "", "/")
					if p.mode != mesh.MTLSStrict {
						if err != nil || r.Status >= 500 {
							e.Fail("pod %s refused plaintext from %s under permissive mTLS: %v", to.Name, what, err)
						}
						continue
					}
					observed, refused := meshprobe.Refusal(r, err)
					plaintext = append(plaintext, meshprobe.PlaintextProbe{Service: s.Name, Refused: refused, Observed: observed,
						Target: fmt.Sprintf("pod %s at %s (http), from %s", to.Name, addr, what)})
					controls = append(controls, p.plaintextControl(ctx, sub, outsider, what, app, to))
				}
			}
		}
		if p.mode == mesh.MTLSStrict {
			e.JudgePlaintext(plaintext, controls)
		}
	} else if p.mode == mesh.MTLSStrict {
		e.Fail("no pod outside the mesh to test that plaintext is refused")
	}
	return e, nil
}

// plaintextControl is the positive control of the plaintext request to pod: the same
// caller opens TLS to HBONE's port at the pod's address, where ztunnel must present
// the pod's own certificate. It answers a caller without a mesh identity that far (the
// handshake is refused only after), so the caller reaches the pod and its plaintext
// refusals are the mesh's doing.
func (p *Profile) plaintextControl(ctx context.Context, sub substrate.Substrate, from topology.Pod, what string, app *topology.App, pod topology.Pod) meshprobe.PlaintextProbe {
	addr, want := mesh.Addr(pod.IP, HBONEPort), p.Identity(app, pod)
	control := meshprobe.PlaintextProbe{Service: pod.Service, Refused: true,
		Target: fmt.Sprintf("pod %s at %s (TLS to HBONE's port), from %s", pod.Name, addr, what)}
	ctx, cancel := context.WithTimeout(ctx, meshprobe.ProbeTimeout)
	defer cancel()
	raw, err := sub.DialContext(ctx, from, "tcp", addr)
	if err != nil {
		control.Observed = "not answered: " + err.Error()
		return control
	}
	defer raw.Close()
	var ids []string
	conn := tls.Client(raw, &tls.Config{NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS12,
		// Only the presented identity matters here; the security experiment's identity
		// probe judges the chain.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) > 0 {
				for _, u := range cs.PeerCertificates[0].URIs {
					ids = append(ids, u.String())
				}
			}
			return nil
		}})
	err = conn.HandshakeContext(ctx)
	switch {
	case slices.Contains(ids, want):
		control.Refused, control.Observed = false, "answered: ztunnel presented the pod's identity"
	case len(ids) > 0:
		control.Observed = fmt.Sprintf("not answered: a certificate for %v, not the pod's %s", ids, want)
	default:
		control.Observed = fmt.Sprintf("not answered: %v", err)
	}
	return control
}

func appendNote(pods []mesh.PodEnrollment, pod, note string) []mesh.PodEnrollment {
	for i := range pods {
		if pods[i].Pod == pod {
			pods[i].Notes = append(pods[i].Notes, note)
		}
	}
	return pods
}

// receivesTraffic says whether the service split sends pod any connection.
func receivesTraffic(app *topology.App, pod topology.Pod) bool {
	for _, s := range app.Services {
		split := false
		if len(s.Versions) > 1 {
			for _, v := range s.Versions {
				split = split || v.Weight > 0
			}
		}
		for _, v := range s.Versions {
			for _, ep := range v.Endpoints {
				if ep.Name == pod.Name {
					return !split || v.Weight > 0
				}
			}
		}
	}
	return false
}

// probesPerService sends enough requests that every positive-weight endpoint is hit.
func probesPerService(s topology.Service) int {
	n := 0
	for _, v := range s.Versions {
		n += len(v.Endpoints)
	}
	return max(4, 4*n)
}

// outsider picks a vantage point outside the mesh: an unmeshed client, else the node
// namespace of the first service pod.
func (p *Profile) outsider(sub substrate.Substrate, app *topology.App) (topology.Pod, string, bool) {
	if !p.opts.ClientsMeshed(p.mode) && len(app.Clients) > 0 {
		return app.Clients[0], "unmeshed client " + app.Clients[0].Name, true
	}
	if np, ok := sub.(nodePodder); ok {
		for _, pod := range app.Pods() {
			if pod.Node == "" {
				continue
			}
			if n, err := np.NodePod(pod.Node); err == nil {
				return n, "node " + pod.Node + " namespace", true
			}
		}
	}
	return topology.Pod{}, "", false
}

func (n *nodeProxy) logPath() string {
	if n.proc == nil {
		return "-"
	}
	return n.proc.LogPath()
}

// checkWaypoint: the waypoint must have routed requests into every service the probes
// reached.
func (p *Profile) checkWaypoint(ctx context.Context, sub substrate.Substrate, app *topology.App, e *mesh.Enrollment, wp *waypointProxy) {
	pc := readWaypoint(ctx, sub, app, wp)
	if pc.Err != nil {
		e.Fail("waypoint: %v (log: %s)", pc.Err, wp.proc.LogPath())
		return
	}
	for _, s := range app.Services {
		if pc.Inbound[s.Name] == 0 {
			e.Fail("waypoint routed no request into %s", s.Name)
		}
	}
}

// hbonePeers lists the addresses a namespace holds established connections to on the
// HBONE port (ztunnel and the waypoint keep them pooled after use).
// otherNodeTarget is the first pod that receives traffic on a node other than from's.
func otherNodeTarget(app *topology.App, from topology.Pod) (topology.Pod, bool) {
	for _, s := range app.Services {
		for _, v := range s.Versions {
			for _, to := range v.Endpoints {
				if to.Node != from.Node && receivesTraffic(app, to) {
					return to, true
				}
			}
		}
	}
	return topology.Pod{}, false
}

func hbonePeers(ctx context.Context, sub substrate.Substrate, in topology.Pod) []string {
	out, err := sub.Exec(ctx, in, nil, "ss", "-Htn", "state", "established")
	if err != nil {
		return nil
	}
	var peers []string
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		// With a state filter ss prints Recv-Q, Send-Q, local, peer.
		if len(f) >= 4 {
			if host, port, err := net.SplitHostPort(f[3]); err == nil && port == fmt.Sprint(HBONEPort) {
				peers = append(peers, host)
			}
		}
	}
	return peers
}

// checkGateway checks the mesh's ingress gateway in pod: its Envoy is live and, asked
// in plaintext from outside the mesh as an ingress is, answers through the entry
// service, which ambient pods under strict mTLS take only over HBONE.
func (p *Profile) checkGateway(ctx context.Context, sub substrate.Substrate, app *topology.App, e *mesh.Enrollment, pod topology.Pod) mesh.PodEnrollment {
	pe := mesh.PodEnrollment{Pod: pod.Name, Service: pod.Service, Meshed: true}
	r, err := mesh.ProbeHTTP(ctx, sub, pod, fmt.Sprintf("127.0.0.1:%d", gateway.AdminPort), "", "/ready")
	if err != nil || r.Status != 200 {
		e.Fail("pod %s: the mesh's ingress gateway is not live: %v (HTTP %d)", pod.Name, err, r.Status)
		return pe
	}
	pe.Sidecar = true
	pe.Notes = append(pe.Notes, "the mesh's ingress gateway: Envoy outside ambient capture, taking plaintext from outside and sending on over HBONE")
	from, what, ok := p.outsider(sub, app)
	if !ok {
		pe.Notes = append(pe.Notes, "no pod outside the mesh to probe it from")
		return pe
	}
	r, err = mesh.ProbeHTTP(ctx, sub, from, mesh.Addr(pod.IP, pod.Port), "", "/")
	if err != nil || r.Status >= 500 {
		e.Fail("pod %s: the ingress gateway did not answer %s: %v (HTTP %d)", pod.Name, what, err, r.Status)
		return pe
	}
	pe.Answered = true
	return pe
}
