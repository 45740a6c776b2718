package kubeplatform

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/meshmark/meshmark/internal/load"
	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	"github.com/meshmark/meshmark/internal/study"
	"github.com/meshmark/meshmark/internal/substrate/kube"
	"github.com/meshmark/meshmark/internal/workload"
)

// The traffic half of the enrollment check on a cluster: the static check says the mesh
// put its proxy in every pod (or its agent on every node), the plaintext probe that it
// refuses callers from outside; this one proves, before the first measurement, that
// every proxy is on the app's path. The load generators send a short burst of requests
// to the entry service, every proxy of the mesh is read before and after it, and each
// must have counted its pods' share.
const (
	// burstPerPod is how many of the burst's requests the graph should send each app
	// pod: the burst is made large enough for the pod that gets the smallest share.
	burstPerPod = 20
	// burstHeldFrom is the fewest requests a pod must be expected to get from the burst
	// for its proxy to be held to it: below that a proxy that counted none may just have
	// been passed over by the balancing.
	burstHeldFrom = 10.0
	// burstMinRequests, burstMaxRate, burstLength and burstMaxLength bound the burst:
	// at least 200 requests, over 3 s at most 250 req/s, or longer (up to 10 s) at
	// 250 req/s where the smallest share needs more. Modest enough for a laptop's kind
	// cluster.
	burstMinRequests = 200
	burstMaxRate     = 250
	burstLength      = 3 * time.Second
	burstMaxLength   = 10 * time.Second
	// burstGrace is how long the burst may overrun its length before it is given up.
	burstGrace = 30 * time.Second
)

// burstPod is one pod of the app and what the burst should bring it.
type burstPod struct {
	kube.PodSidecar
	// share is the part of the burst's requests that the graph sends this pod.
	share float64
	// notHeld says why the pod's proxy is not held to the burst; empty when it is.
	notHeld string
}

// burstPlan is the burst: its rate and length, and each pod's share of it.
type burstPlan struct {
	rate   float64
	length time.Duration
	pods   []burstPod
}

// serviceFlows is how many requests each service of the graph receives per request to
// the entry service, as the cluster routes them: a Service spreads its requests over
// all its pods, whatever their version (the versions' weights are carried by their
// replicas on a cluster), a call is made with its probability, and a pod that answers with an injected error
// calls nothing.
func serviceFlows(g *workload.Graph) map[string]float64 {
	entry := g.Entrypoint().Service
	flow := map[string]float64{entry: 1}
	// Calls form no cycle (the graph is validated), so as many rounds as there are
	// services reach every depth.
	for range g.Services {
		next := map[string]float64{entry: 1}
		for _, s := range g.Services {
			in := flow[s.Name]
			if in == 0 {
				continue
			}
			pods := 0
			for _, v := range s.Versions {
				pods += max(v.Replicas, 1)
			}
			for _, v := range s.Versions {
				out := in * float64(max(v.Replicas, 1)) / float64(pods) * (1 - s.ErrorRate)
				for _, c := range v.Script.Calls() {
					next[c.Service] += out * c.Probability
				}
			}
		}
		flow = next
	}
	return flow
}

// planBurst sizes the burst so that the pod with the smallest share gets burstPerPod
// requests, within the bounds above, and says which pods cannot be held to it.
func planBurst(g *workload.Graph, pods []kube.PodSidecar) burstPlan {
	flow := serviceFlows(g)
	podsOf := map[string]int{}
	for _, p := range pods {
		if !p.Generator {
			podsOf[p.App]++
		}
	}
	plan := burstPlan{length: burstLength}
	minShare := 0.0
	for _, p := range pods {
		bp := burstPod{PodSidecar: p}
		switch {
		case p.Generator:
			bp.notHeld = "a load generator's: it serves no service, and the proxies' counts are per service it serves"
		case g.Service(p.App) == nil:
			bp.notHeld = "not a service of the graph"
		case flow[p.App] == 0:
			bp.notHeld = "the graph sends " + p.App + " no request from the entry service"
		default:
			// A Service spreads over all its pods; the versions' weights are carried by
			// their replicas (checkVersionSplit refuses a graph whose are not).
			bp.share = flow[p.App] / float64(podsOf[p.App])
			if minShare == 0 || bp.share < minShare {
				minShare = bp.share
			}
		}
		plan.pods = append(plan.pods, bp)
	}
	need := float64(burstMinRequests)
	if minShare > 0 {
		need = max(need, math.Ceil(burstPerPod/minShare))
	}
	plan.rate = math.Ceil(need / burstLength.Seconds())
	if plan.rate > burstMaxRate {
		plan.rate = burstMaxRate
		plan.length = min(time.Duration(math.Ceil(need/burstMaxRate))*time.Second, burstMaxLength)
	}
	return plan
}

// injectsErrors says whether a service the entry's requests reach answers some of them
// with an error on purpose (errorRate), so that the burst's non-2xx answers are the
// graph's, not the mesh's.
func injectsErrors(g *workload.Graph) bool {
	flow := serviceFlows(g)
	for _, s := range g.Services {
		if flow[s.Name] > 0 && s.ErrorRate > 0 {
			return true
		}
	}
	return false
}

// burstOutcome is what came of the burst.
type burstOutcome struct {
	plan burstPlan
	res  *load.Result
	// err is why the burst could not run at all.
	err error
	// tolerateNon2xx is set when the graph injects errors.
	tolerateNon2xx bool
	entry          string
	// served is what each app pod served during the burst, read from the pods
	// themselves (kube.Cluster.Served); nil when they could not all be read.
	served map[string]int64
}

func (o burstOutcome) describe() string {
	sent := int64(0)
	if o.res != nil {
		sent = o.res.Sent
	}
	return fmt.Sprintf("a %s probe burst of %d requests", o.plan.length, sent)
}

// servedDuring is what each pod served between two reads.
func servedDuring(before, after []kube.PodServed) map[string]int64 {
	was := map[string]int64{}
	for _, p := range before {
		was[p.Pod] = p.Served
	}
	out := map[string]int64{}
	for _, p := range after {
		if b, ok := was[p.Pod]; ok && p.Served >= b {
			out[p.Pod] = p.Served - b
		}
	}
	return out
}

// proxyKind is how a mesh's proxy is placed, which says what it must have counted.
type proxyKind int

const (
	sidecarProxy proxyKind = iota // in every pod, stored under the pod's name
	nodeProxy                     // one per node, stored under the node's name
	appProxy                      // pods of the mesh's own in the app's namespace (a waypoint)
)

// proxyKinds tells each component of the mesh's proxy endpoints how it is placed, and
// how to name it: a sidecar by its container.
func proxyKinds(endpoints []meshkube.ProxyEndpoint) (map[string]proxyKind, map[string]string) {
	kinds, names := map[string]proxyKind{}, map[string]string{}
	for _, ep := range endpoints {
		if _, seen := kinds[ep.Component]; seen {
			continue
		}
		switch {
		case ep.Container != "":
			kinds[ep.Component], names[ep.Component] = sidecarProxy, ep.Container
		case len(ep.AppLabels) > 0:
			kinds[ep.Component], names[ep.Component] = appProxy, ep.Component
		default:
			kinds[ep.Component], names[ep.Component] = nodeProxy, ep.Component
		}
	}
	return kinds, names
}

// proveTraffic sends the burst through the deployment's generators, reads every proxy
// before and after it, and holds each to what it should have counted (judgeTraffic),
// into enr. It returns an error only when ctx ends; a burst that cannot run fails the
// check as unproven.
func (r *run) proveTraffic(ctx context.Context, d *kubeDeployment, plan *meshkube.KubernetesInstall, enr *mesh.Enrollment) error {
	m := d.mesh
	pods, err := d.cluster.Sidecars(ctx, d.app, plan.Sidecar)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		enr.Traffic = &mesh.TrafficProof{}
		enr.Fail("that every pod's proxy carried traffic is unproven: listing the app's pods: %v", err)
		return nil
	}
	bp := planBurst(r.Graph(), pods)
	// The entry service in its own protocol, kept alive, as a fixed-rate trial without
	// a warm-up.
	e := &study.Experiment{Name: "enrollment-burst", Kind: study.KindFixedRate, KeepAlive: true}
	spec, err := r.ProbeSpec(e, r.kubeLoad(ctx, d, nil).Target, bp.rate, bp.length)
	if err != nil {
		return err
	}
	r.Note(fmt.Sprintf("%s: sending a probe burst through the mesh (%g req/s for %s, %d load generators) and reading every proxy before and after it",
		m.Name, bp.rate, bp.length, len(d.forwards.Generators)))
	out := burstOutcome{plan: bp, tolerateNon2xx: injectsErrors(r.Graph()), entry: r.Graph().Entrypoint().Service}
	// What the pods served is read outside the proxies' window, from their loopback,
	// which no proxy counts.
	servedBefore, servedErr := d.cluster.Served(ctx, d.app)
	before := d.readProxies(ctx)
	bctx, cancel := context.WithTimeout(ctx, bp.length+burstGrace)
	out.res, _, out.err = d.pool.Run(bctx, spec, nil)
	cancel()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	after := d.readProxies(ctx)
	if servedErr == nil {
		if servedAfter, err := d.cluster.Served(ctx, d.app); err == nil {
			out.served = servedDuring(servedBefore, servedAfter)
		}
	}
	if out.err != nil {
		if ferr := d.forwards.Err(); ferr != nil {
			out.err = fmt.Errorf("%w (%v)", out.err, ferr)
		}
	}
	judgeTraffic(enr, plan.Proxies, out, mesh.DiffCounters(before, after))
	t := enr.Traffic
	switch {
	case t.Proven:
		r.Note(fmt.Sprintf("%s: every pod's proxy carried traffic: %d proxies held to %s at %g req/s, %d answered",
			m.Name, t.Held, out.describe(), bp.rate, t.Succeeded))
	case enr.Pass:
		r.Note(fmt.Sprintf("%s: %s answered %d of %d; %s", m.Name, out.describe(), t.Succeeded, t.Sent, strings.Join(t.Notes, "; ")))
	}
	return nil
}

// judgeTraffic holds each proxy to the burst, as the cluster read it, and records in enr
// what each counted (enr.Traffic, and each pod's row), failing enr for:
//   - a burst that could not run, or whose requests failed (refused, reset, timed out,
//     or answered other than 2xx where the graph injects no errors): a mesh that cannot
//     serve the app is not measured;
//   - a proxy that could not be read before or after, as unproven;
//   - a sidecar that counted nothing into its own pod's service;
//   - a node proxy that counted nothing into a service with pods on its node (for
//     proxies that count connections, which are balanced per connection, it is enough
//     that some node of the service counted it when it has pods on several);
//   - proxies in the app's namespace (a waypoint) that together counted nothing into a
//     service.
//
// Only pods whose share the burst should bring at least burstHeldFrom requests are held
// to it; the others, the load generators' own proxies, and a mesh whose proxies count
// nothing per service (Cilium's agents) are noted, not held, and then nothing is claimed
// proven.
func judgeTraffic(enr *mesh.Enrollment, endpoints []meshkube.ProxyEndpoint, out burstOutcome, deltas []mesh.ProxyDelta) {
	t := &mesh.TrafficProof{Rate: out.plan.rate, Seconds: out.plan.length.Seconds()}
	enr.Traffic = t
	if out.err != nil || out.res == nil {
		enr.Fail("that every pod's proxy carried traffic is unproven: the probe burst through the mesh could not run: %v", out.err)
		return
	}
	res := out.res
	t.Sent, t.Succeeded = res.Sent, res.Succeeded
	t.Errors = map[string]int64{}
	for kind, n := range map[string]int64{"refused": res.Errors.Refused, "reset": res.Errors.Reset, "timeout": res.Errors.Timeout, "non2xx": res.Errors.Non2xx, "other": res.Errors.Other, "lookup": res.Errors.Lookup} {
		if n > 0 {
			t.Errors[kind] = n
		}
	}
	if len(t.Errors) == 0 {
		t.Errors = nil
	}
	failed := res.Errors.Total()
	if out.tolerateNon2xx && res.Errors.Non2xx > 0 {
		failed -= res.Errors.Non2xx
		t.Notes = append(t.Notes, fmt.Sprintf("%d non-2xx answers not held against the mesh: the graph injects errors (errorRate)", res.Errors.Non2xx))
	}
	switch {
	case res.Succeeded == 0:
		enr.Fail("%s to %s through the mesh had no request answered (%s): a mesh that cannot serve the app is not measured", out.describe(), out.entry, describeBurstErrors(res))
	case failed > 0:
		enr.Fail("%s to %s through the mesh failed %d of its requests (%s): a mesh that cannot serve the app is not measured", out.describe(), out.entry, failed, describeBurstErrors(res))
	}
	if res.Health.Dropped > 0 {
		t.Notes = append(t.Notes, fmt.Sprintf("the load generators dropped %d of the burst's sends", res.Health.Dropped))
	}

	kinds, names := proxyKinds(endpoints)
	pods := map[string]*burstPod{}
	for i := range out.plan.pods {
		p := &out.plan.pods[i]
		if p.notHeld == "" {
			if expected := float64(res.Completed) * p.share; expected < burstHeldFrom {
				p.notHeld = fmt.Sprintf("only about %.1f of the burst's requests were for it (%.2g%% of them)", expected, 100*p.share)
			}
		}
		// A proxy that balances per connection (ztunnel alone) may send every call of
		// the burst to one version, leaving another, and the services only it calls,
		// without a request: what the pod itself served says so, and a proxy is held
		// only to traffic that reached its pod.
		if served, known := out.served[p.Pod]; p.notHeld == "" && out.served != nil && known && float64(served) < burstHeldFrom {
			p.notHeld = fmt.Sprintf("it served %d of the burst's requests (about %.0f were planned for it), read from the pod: its callers' connections went to other pods", served, float64(res.Completed)*p.share)
			t.Notes = append(t.Notes, fmt.Sprintf("pod %s not held to the burst: %s", p.Pod, p.notHeld))
		}
		pods[p.Pod] = p
	}
	row := func(pod string) *mesh.PodEnrollment {
		i := slices.IndexFunc(enr.Pods, func(pe mesh.PodEnrollment) bool { return pe.Pod == pod })
		if i < 0 {
			enr.Pods = append(enr.Pods, mesh.PodEnrollment{Pod: pod, Meshed: true})
			i = len(enr.Pods) - 1
		}
		return &enr.Pods[i]
	}
	expected := func(p *burstPod) float64 { return float64(res.Completed) * p.share }
	one := func(unit string) string { return strings.TrimSuffix(unit, "s") }

	perService := false
	deltas = slices.Clone(deltas)
	for i := range deltas {
		d := &deltas[i]
		// DiffCounters speaks of a trial.
		d.Err = strings.Replace(strings.Replace(d.Err, "not read before the trial", "not read before the burst", 1), "before the trial: ", "before the burst: ", 1)
		t.Proxies = append(t.Proxies, mesh.ProxyTraffic{Component: d.Component, Pod: d.Pod, Unit: d.Unit, Inbound: d.Inbound, Err: d.Err})
		perService = perService || (d.Err == "" && d.Unit != "")
	}
	if !perService && slices.ContainsFunc(deltas, func(d mesh.ProxyDelta) bool { return d.Err == "" }) {
		// Cilium's agents count per node and direction only: nothing to hold a pod to.
		var comps []string
		for _, d := range deltas {
			if !slices.Contains(comps, d.Component) {
				comps = append(comps, d.Component)
			}
			if d.Err != "" {
				t.Notes = append(t.Notes, fmt.Sprintf("%s on %s could not be read around the burst (%s)", names[d.Component], d.Pod, d.Err))
			}
		}
		t.Notes = append(t.Notes, fmt.Sprintf("the mesh's proxies (%s) count nothing per service, so that every pod's proxy carried traffic cannot be proven from their counters: the burst proves only that the app answered through the mesh",
			strings.Join(comps, ", ")))
		return
	}

	// Node proxies that count connections are judged per service over all their nodes.
	type compService struct{ component, service string }
	l4Counted := map[compService]bool{}
	l4Zero := map[compService][]string{}
	// Proxies in the app's namespace are judged per service over all their pods.
	appCounted := map[compService]uint64{}
	appPods := map[string][]string{}
	for _, d := range deltas {
		kind, name := kinds[d.Component], names[d.Component]
		if d.Err != "" {
			where := name + " of pod " + d.Pod
			switch {
			case strings.HasPrefix(d.Pod, "namespace "):
				where = name + " in " + d.Pod
			case kind == nodeProxy:
				where = name + " on node " + d.Pod
			case kind == appProxy:
				where = name + " pod " + d.Pod
			}
			enr.Fail("%s could not be read around the probe burst (%s): that its traffic crossed the mesh is unproven", where, d.Err)
			continue
		}
		if d.Unit == "" {
			t.Notes = append(t.Notes, fmt.Sprintf("%s on %s counts nothing per service: not held to the burst", name, d.Pod))
			continue
		}
		switch kind {
		case sidecarProxy:
			p := pods[d.Pod]
			if p == nil {
				t.Notes = append(t.Notes, fmt.Sprintf("%s of pod %s: the pod is not the app's any more, not held to the burst", name, d.Pod))
				continue
			}
			pe := row(d.Pod)
			pe.Sidecar = true // its proxy answered
			if p.Generator {
				pe.Notes = append(pe.Notes, fmt.Sprintf("burst: its %s was read; not held to it: %s", name, p.notHeld))
				continue
			}
			counted := d.Inbound[p.App]
			if d.Unit == meshkube.UnitRequests {
				pe.InboundRequests = counted
			}
			wireEvidence(enr, pe, d, p.App, name, out.describe())
			if p.notHeld != "" {
				pe.Notes = append(pe.Notes, fmt.Sprintf("burst: its %s counted %d inbound %s; not held to it: %s", name, counted, d.Unit, p.notHeld))
				continue
			}
			t.Held++
			pe.Notes = append(pe.Notes, fmt.Sprintf("burst: its %s counted %d inbound %s for %s (about %.0f expected)", name, counted, d.Unit, p.App, expected(p)))
			if counted == 0 {
				pe.MTLSObserved = mesh.ObservedMode(0, 0)
				enr.Fail("pod %s: its %s counted no inbound %s for %s during %s (about %.0f of them were for this pod): its traffic bypassed the proxy",
					d.Pod, name, one(d.Unit), p.App, out.describe(), expected(p))
				continue
			}
			if d.Unit == meshkube.UnitRequests && res.Errors.Total() == 0 {
				pe.Answered = true
			}
		case nodeProxy:
			services := map[string][]*burstPod{}
			for _, p := range out.plan.pods {
				if p.Node == d.Pod && p.notHeld == "" {
					services[p.App] = append(services[p.App], pods[p.Pod])
				}
			}
			if len(services) > 0 {
				t.Held++
			}
			for _, s := range slices.Sorted(maps.Keys(services)) {
				counted, ps := d.Inbound[s], services[s]
				// A proxy that counts connections opened sees none where the callers
				// kept theirs from traffic before the burst (seen when the wait for the
				// entry service went first: productpage's to its callees); the bytes it
				// received into the service, where it counts them as they flow, show
				// the burst crossed it.
				carried, bytes := counted > 0, ""
				if n, ok := d.InboundBytes[s]; ok && d.Unit == meshkube.UnitConnections {
					carried, bytes = carried || n > 0, fmt.Sprintf(", %d bytes", n)
				}
				var podNames []string
				want := 0.0
				for _, p := range ps {
					podNames = append(podNames, p.Pod)
					want += expected(p)
				}
				for _, p := range ps {
					pe := row(p.Pod)
					pe.Notes = append(pe.Notes, fmt.Sprintf("burst: %s on node %s counted %d inbound %s%s for %s (its %d pods of %s there: about %.0f requests expected)",
						name, d.Pod, counted, d.Unit, bytes, s, len(ps), s, want))
					wireEvidence(enr, pe, d, s, name+" on node "+d.Pod, out.describe())
				}
				cs := compService{d.Component, s}
				if d.Unit == meshkube.UnitConnections && nodesOf(out.plan.pods, s) > 1 {
					if carried {
						l4Counted[cs] = true
					} else {
						l4Zero[cs] = append(l4Zero[cs], d.Pod)
					}
					continue
				}
				if !carried {
					unit := one(d.Unit)
					if bytes != "" {
						unit += " and no byte"
					}
					enr.Fail("node %s: its %s counted no inbound %s for %s during %s, though pods %s of %s are on it (about %.0f requests for them): their traffic bypassed the proxy",
						d.Pod, name, unit, s, out.describe(), strings.Join(podNames, ", "), s, want)
				}
			}
		case appProxy:
			t.Held++
			appPods[d.Component] = append(appPods[d.Component], d.Pod)
			for s, n := range d.Inbound {
				appCounted[compService{d.Component, s}] += n
			}
		}
	}
	for _, cs := range slices.SortedFunc(maps.Keys(l4Zero), func(a, b compService) int {
		return strings.Compare(a.component+"/"+a.service, b.component+"/"+b.service)
	}) {
		if l4Counted[cs] {
			t.Notes = append(t.Notes, fmt.Sprintf("%s on nodes %s counted no connection into %s, which others of its nodes counted: connections are balanced per connection, so the burst's may all have gone to pods elsewhere; not held",
				names[cs.component], strings.Join(l4Zero[cs], ", "), cs.service))
			continue
		}
		enr.Fail("nodes %s: their %s counted no inbound connection for %s during %s: its traffic bypassed the proxies",
			strings.Join(l4Zero[cs], ", "), names[cs.component], cs.service, out.describe())
	}
	held := map[string]float64{}
	for _, p := range out.plan.pods {
		if p.notHeld == "" {
			held[p.App] += expected(&p)
		}
	}
	for _, comp := range slices.Sorted(maps.Keys(appPods)) {
		for _, s := range slices.Sorted(maps.Keys(held)) {
			n := appCounted[compService{comp, s}]
			if n == 0 {
				enr.Fail("the %s (pods %s) counted no %s for %s during %s (about %.0f requests for it): its traffic bypassed the %s",
					names[comp], strings.Join(appPods[comp], ", "), one(unitOf(deltas, comp)), s, out.describe(), held[s], names[comp])
			}
		}
	}
	t.Proven = enr.Pass && t.Held > 0
	if t.Held == 0 && enr.Pass {
		t.Notes = append(t.Notes, "no proxy could be held to the burst")
	}
}

// wireEvidence records, on a pod's row, what its proxy (or its node's) says came in
// over mTLS and in plaintext for service during the burst, where the proxy tells it:
// the cluster's counterpart of the local check's reading of each sidecar. Plaintext
// accepted by a mesh configured for strict mTLS fails the check; a node proxy's counts
// are its node's for the service, shared by that service's pods there.
func wireEvidence(enr *mesh.Enrollment, pe *mesh.PodEnrollment, d mesh.ProxyDelta, service, proxy, burst string) {
	if d.WireUnit == "" {
		return
	}
	mtls, plain := d.InboundMTLS[service], d.InboundPlaintext[service]
	if d.WireUnit == meshkube.UnitRequests {
		pe.InboundMTLS, pe.InboundPlaintext = mtls, plain
	}
	pe.MTLSObserved = mesh.ObservedMode(mtls, plain)
	pe.Notes = append(pe.Notes, fmt.Sprintf("burst, on the wire: %s took %d inbound %s for %s over mTLS, %d in plaintext",
		proxy, mtls, d.WireUnit, service, plain))
	if enr.MTLS == mesh.MTLSStrict && plain > 0 {
		enr.Fail("pod %s: %s accepted %d inbound %s for %s in plaintext during %s, though the mesh is configured for strict mTLS",
			pe.Pod, proxy, plain, d.WireUnit, service, burst)
	}
}

// nodesOf counts the nodes that host pods of service held to the burst.
func nodesOf(pods []burstPod, service string) int {
	nodes := map[string]bool{}
	for _, p := range pods {
		if p.App == service && p.notHeld == "" {
			nodes[p.Node] = true
		}
	}
	return len(nodes)
}

// unitOf is what a component's proxies count.
func unitOf(deltas []mesh.ProxyDelta, component string) string {
	for _, d := range deltas {
		if d.Component == component && d.Unit != "" {
			return d.Unit
		}
	}
	return meshkube.UnitRequests
}

// describeBurstErrors says how the burst's requests failed: by kind, the status codes
// of non-2xx answers, and the first messages.
func describeBurstErrors(res *load.Result) string {
	var parts []string
	for _, k := range []struct {
		name string
		n    int64
	}{{"refused", res.Errors.Refused}, {"reset", res.Errors.Reset}, {"timed out", res.Errors.Timeout}, {"non-2xx", res.Errors.Non2xx}, {"other", res.Errors.Other}, {"failed lookups", res.Errors.Lookup}} {
		if k.n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", k.n, k.name))
		}
	}
	var codes []string
	for _, code := range slices.Sorted(maps.Keys(res.StatusCodes)) {
		if code < 200 || code > 299 {
			codes = append(codes, fmt.Sprintf("HTTP %d ×%d", code, res.StatusCodes[code]))
		}
	}
	if len(codes) > 0 {
		parts = append(parts, strings.Join(codes, ", "))
	}
	if len(res.ErrorSamples) > 0 {
		parts = append(parts, "e.g. "+strings.Join(res.ErrorSamples, "; "))
	}
	if len(parts) == 0 {
		return "no failure recorded"
	}
	return strings.Join(parts, "; ")
}
