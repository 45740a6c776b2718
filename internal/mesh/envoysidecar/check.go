package envoysidecar

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/meshmark/meshmark/internal/gateway"
	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/meshprobe"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/topology"
)

// enrollmentStats selects only the counters the check reads.
const enrollmentStats = `^(http\.(inbound|outbound)_.*\.downstream_rq_total|cluster\.inbound\|[0-9]+\|\|\.upstream_rq_completed|cluster\.outbound\|.*\.upstream_rq_retry)$`

// readTraffic fetches a sidecar's enrollment counters through its admin endpoint.
func readTraffic(ctx context.Context, sub substrate.Substrate, pod topology.Pod) (Traffic, error) {
	ctx, cancel := context.WithTimeout(ctx, meshprobe.ProbeTimeout)
	defer cancel()
	body, status, err := httpGet(ctx, sub, pod, nil, adminAddr, "", "/stats?filter="+url.QueryEscape(enrollmentStats), 1<<20)
	if err != nil {
		return Traffic{}, err
	}
	if status != 200 {
		return Traffic{}, fmt.Errorf("envoy admin /stats: HTTP %d", status)
	}
	s, err := ParseStats(body)
	if err != nil {
		return Traffic{}, err
	}
	return TrafficOf(s), nil
}

// httpGet sends one GET from inside pod `from` on a fresh connection, over TLS when
// tlsConf is set.
func httpGet(ctx context.Context, sub substrate.Substrate, from topology.Pod, tlsConf *tls.Config, addr, host, path string, limit int64) (string, int, error) {
	dial := func(ctx context.Context, network, a string) (net.Conn, error) {
		return sub.DialContext(ctx, from, network, a)
	}
	tr := &http.Transport{DialContext: dial, DisableKeepAlives: true}
	scheme := "http"
	if tlsConf != nil {
		scheme = "https"
		tr.DialTLSContext = func(ctx context.Context, network, a string) (net.Conn, error) {
			c, err := dial(ctx, network, a)
			if err != nil {
				return nil, err
			}
			tc := tls.Client(c, tlsConf)
			if err := tc.HandshakeContext(ctx); err != nil {
				c.Close()
				return nil, err
			}
			return tc, nil
		}
	}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://"+addr+path, nil)
	if err != nil {
		return "", 0, err
	}
	if host != "" {
		req.Host = host
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	return string(b), resp.StatusCode, err
}

// nodePodder is implemented by substrates that can run probes from a node's own
// namespace: a vantage point outside the mesh when every client pod is enrolled.
type nodePodder interface {
	NodePod(node string) (topology.Pod, error)
}

// outsider picks a pod outside the mesh to probe from: an unmeshed client, else the
// node namespace of the first service pod.
func (p *Profile) outsider(sub substrate.Substrate, app *topology.App) (topology.Pod, string, bool) {
	if !p.opts.ClientsMeshed(p.mode) && len(app.Clients) > 0 {
		return app.Clients[0], "unmeshed client " + app.Clients[0].Name, true
	}
	if np, ok := sub.(nodePodder); ok {
		for _, pod := range app.Pods() {
			if pod.Node == "" {
				continue
			}
			if np, err := np.NodePod(pod.Node); err == nil {
				return np, "node " + pod.Node + " namespace", true
			}
		}
	}
	return topology.Pod{}, "", false
}

// probesPerService is how many requests each enrolled pod sends to each service:
// enough that every version with a positive weight is hit from the pods together.
func probesPerService(s topology.Service) int {
	n := 0
	for _, v := range s.Versions {
		n += len(v.Endpoints)
	}
	return max(4, 3*n)
}

// Check drives probe traffic through the mesh and reads every sidecar's counters:
// enrolled pods send requests along the graph's edges through their own sidecars (see
// probePlan; outbound and, at the destinations, inbound mTLS counts); a pod outside
// the mesh then dials
// every service pod directly (plaintext, or under strict mTLS first plaintext, which
// must be refused, then with a certificate from the mesh CA, whose server identity is
// verified).
func (p *Profile) Check(ctx context.Context, sub substrate.Substrate, app *topology.App) (e mesh.Enrollment, err error) {
	e = mesh.Enrollment{Mesh: Name, MTLS: p.mode, Pass: true, CheckedAt: time.Now().UTC()}
	meshed := p.MeshedPods(app)
	isMeshed := map[string]bool{}
	for _, pod := range meshed {
		isMeshed[pod.Name] = true
	}
	rows := map[string]*mesh.PodEnrollment{}
	var order []string
	for _, s := range app.Services {
		for _, v := range s.Versions {
			for _, pod := range v.Endpoints {
				rows[pod.Name] = &mesh.PodEnrollment{Pod: pod.Name, Service: s.Name, Meshed: isMeshed[pod.Name]}
				order = append(order, pod.Name)
			}
		}
	}
	for _, c := range app.Clients {
		rows[c.Name] = &mesh.PodEnrollment{Pod: c.Name, Meshed: isMeshed[c.Name]}
		order = append(order, c.Name)
	}
	defer func() {
		for _, name := range order {
			e.Pods = append(e.Pods, *rows[name])
		}
	}()

	// The mesh's own ingress gateway has no sidecar: it is the mesh's proxy itself. Its
	// direct probe below (plaintext from outside, as an ingress takes it) proves it
	// reaches the entry service, under strict mTLS only by originating mTLS itself.
	if gw := app.Service(gateway.Service); gw != nil {
		for _, pod := range allEndpoints(*gw) {
			r := rows[pod.Name]
			r.Meshed = true
			if err := gatewayReady(ctx, sub, pod); err != nil {
				e.Fail("pod %s: the mesh's ingress gateway is not live: %v", pod.Name, err)
				continue
			}
			r.Sidecar = true
			r.Notes = append(r.Notes, "the mesh's ingress gateway: Envoy in router mode with no sidecar, taking plaintext from outside and sending on with the mesh's mTLS")
		}
	}

	// Steps 1 and 4 read the sidecars several at a time (parallel): reading a hundred
	// sidecars' stats one after another takes minutes on a loaded machine. Each pod's
	// row is touched by its own goroutine only; failures and shared results go
	// through mu.
	var mu sync.Mutex
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		e.Fail(format, args...)
	}

	// 1. Every enrolled pod has a live sidecar; remember its counters.
	before := map[string]Traffic{}
	parallel(len(meshed), func(i int) {
		pod := meshed[i]
		r := rows[pod.Name]
		if err := adminReady(ctx, sub, pod); err != nil {
			fail("pod %s: no live sidecar: %v", pod.Name, err)
			return
		}
		r.Sidecar = true
		t, err := readTraffic(ctx, sub, pod)
		if err != nil {
			fail("pod %s: sidecar stats unreadable: %v", pod.Name, err)
			return
		}
		mu.Lock()
		before[pod.Name] = t
		mu.Unlock()
	})
	if ctx.Err() != nil {
		return e, ctx.Err()
	}

	// 2. Through the mesh: enrolled pods call the services probePlan gives them, by
	// name. Sources run a few at a time so large graphs are checked in seconds, not
	// minutes.
	var (
		meshFailMu sync.Mutex
		meshFails  []string
		wg         sync.WaitGroup
		sem        = make(chan struct{}, 4)
	)
	plan := probePlan(app, meshed)
	for _, from := range meshed {
		if !rows[from.Name].Sidecar {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			for _, msg := range meshProbes(ctx, sub, app, from, plan[from.Name]) {
				meshFailMu.Lock()
				meshFails = append(meshFails, msg)
				meshFailMu.Unlock()
			}
		}()
	}
	wg.Wait()
	for _, msg := range meshFails {
		e.Fail("%s", msg)
	}
	if ctx.Err() != nil {
		return e, ctx.Err()
	}

	// 3. From outside the mesh, straight to every service pod.
	out, outName, haveOutsider := p.outsider(sub, app)
	var probeTLS *tls.Config
	if haveOutsider && p.mode == mesh.MTLSStrict {
		conf, err := p.probeTLSConfig(app)
		if err != nil {
			return e, err
		}
		probeTLS = conf
	}
	var plaintext, controls []meshprobe.PlaintextProbe
	outside := map[string]uint64{} // per pod: its direct plaintext requests, where permissive mode admits them
	type servicePod struct {
		service string
		pod     topology.Pod
	}
	var direct []servicePod
	for _, s := range app.Services {
		for _, v := range s.Versions {
			for _, pod := range v.Endpoints {
				direct = append(direct, servicePod{s.Name, pod})
			}
		}
	}
	// One pod at a time: a probe fans out through the graph, and a callee's inbound
	// count must move only with its own direct probe for the bypass check to mean anything.
	for i := range direct {
		service, pod := direct[i].service, direct[i].pod
		r := rows[pod.Name]
		if !haveOutsider {
			r.Notes = append(r.Notes, "no pod outside the mesh to probe from directly")
			continue
		}
		addr := mesh.Addr(pod.IP, pod.Port)
		_, sidecarUp := before[pod.Name]
		var inboundBefore Traffic
		if sidecarUp {
			var rerr error
			if inboundBefore, rerr = readTraffic(ctx, sub, pod); rerr != nil {
				sidecarUp = false
			}
		}
		body, status, err := httpGet(ctx, sub, out, nil, addr, service, "/", 4096)
		if p.podMode(pod) == mesh.MTLSStrict {
			observed, refused := meshprobe.Refusal(meshprobe.ProbeResult{Status: status, Body: body,
				ProxyGenerated: status >= 500 && meshprobe.ProxyGeneratedBody(body)}, err)
			plaintext = append(plaintext, meshprobe.PlaintextProbe{Service: service, Refused: refused, Observed: observed,
				Target: fmt.Sprintf("pod %s at %s (http), from %s", pod.Name, addr, outName)})
			// The positive control: the same caller, the same address, with a mesh
			// certificate, must be answered by the pod's sidecar.
			conf := probeTLS.Clone()
			conf.VerifyConnection = p.expectIdentity(p.identity(app, pod))
			body, status, err = httpGet(ctx, sub, out, conf, addr, service, "/", 4096)
			control := meshprobe.PlaintextProbe{Service: service, Target: fmt.Sprintf("pod %s at %s (https with a mesh certificate), from %s", pod.Name, addr, outName),
				Refused: err != nil || status >= 500 && meshprobe.ProxyGeneratedBody(body)}
			if control.Observed = fmt.Sprintf("answered: HTTP %d", status); err != nil {
				control.Observed = "not answered: " + err.Error()
			}
			controls = append(controls, control)
		}
		switch {
		case err != nil:
			fail("pod %s: direct probe from %s failed: %v", pod.Name, outName, err)
		case status >= 500 && meshprobe.ProxyGeneratedBody(body):
			fail("pod %s: direct probe from %s: HTTP %d from the proxy: %.120s", pod.Name, outName, status, body)
		default:
			r.Answered = true
		}
		if sidecarUp {
			// The probe must have passed the pod's own sidecar, not just
			// reached the workload.
			after, err := readTraffic(ctx, sub, pod)
			if err == nil {
				d := after.Sub(inboundBefore)
				if d.InboundMTLS+d.InboundPlaintext == 0 {
					fail("pod %s: a direct request from %s bypassed its sidecar (inbound traffic not intercepted)", pod.Name, outName)
				}
				if p.podMode(pod) == mesh.MTLSPermissive {
					outside[pod.Name] = d.InboundPlaintext
				}
			}
		}
	}

	if haveOutsider && p.mode == mesh.MTLSStrict {
		e.JudgePlaintext(plaintext, controls)
	}

	// 4. What every sidecar saw (read in parallel, judged in order).
	type reading struct {
		t   Traffic
		err error
	}
	afterAll := make([]reading, len(meshed))
	parallel(len(meshed), func(i int) {
		if _, ok := before[meshed[i].Name]; ok {
			afterAll[i].t, afterAll[i].err = readTraffic(ctx, sub, meshed[i])
		}
	})
	for i, pod := range meshed {
		r := rows[pod.Name]
		b, ok := before[pod.Name]
		if !ok {
			continue
		}
		after, err := afterAll[i].t, afterAll[i].err
		if err != nil {
			e.Fail("pod %s: sidecar stats unreadable after probing: %v", pod.Name, err)
			continue
		}
		d := after.Sub(b)
		r.ObserveInbound(d.InboundMTLS, d.InboundPlaintext, outside[pod.Name])
		r.OutboundRequests = d.Outbound
		if d.Answered > 0 {
			r.Answered = true
		}
		if d.Retries > 0 {
			e.Fail("pod %s: its sidecar retried %d probe requests: some destination failed", pod.Name, d.Retries)
		}
		if r.OutboundRequests == 0 {
			e.Fail("pod %s: its sidecar saw no outbound request (outbound traffic not intercepted)", pod.Name)
		}
		if r.Service == "" {
			continue // a client serves nothing
		}
		if r.InboundRequests == 0 {
			if haveOutsider || p.receivesMeshTraffic(app, pod) {
				e.Fail("pod %s: its sidecar saw no inbound request (inbound traffic not intercepted)", pod.Name)
			} else {
				r.Notes = append(r.Notes, "version has weight 0 and no pod outside the mesh could probe it")
			}
			continue
		}
		if !r.Answered {
			e.Fail("pod %s: the workload behind the sidecar answered no request", pod.Name)
		}
		switch p.podMode(pod) {
		case mesh.MTLSOff:
			if r.InboundMTLS > 0 {
				e.Fail("pod %s: mTLS is off but %d inbound requests came over mTLS", pod.Name, r.InboundMTLS)
			}
		case mesh.MTLSStrict:
			if r.InboundPlaintext > 0 {
				e.Fail("pod %s: strict mTLS but %d inbound plaintext requests were served", pod.Name, r.InboundPlaintext)
			}
			if r.InboundMTLS == 0 {
				e.Fail("pod %s: strict mTLS but no inbound request came over mTLS", pod.Name)
			}
		case mesh.MTLSPermissive:
			if r.InboundMTLS == 0 && p.receivesMeshTraffic(app, pod) {
				e.Fail("pod %s: permissive mTLS but no mTLS request from the mesh reached its sidecar", pod.Name)
			}
		}
	}
	if p.mode == mesh.MTLSStrict && !haveOutsider {
		e.Fail("strict mTLS: no pod outside the mesh to test that plaintext is refused (add an unmeshed client)")
	}
	sort.Strings(e.Failures)
	return e, nil
}

// parallel runs fn(0..n-1), eight at a time.
func parallel(n int, fn func(i int)) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			fn(i)
		}()
	}
	wg.Wait()
}

// probePlan says, per meshed pod, which services it probes through its sidecar and how
// many times. With the graph's edges (app.Calls) a pod probes only the services its
// own service calls (a client pod, the entrypoint): each callee gets enough probes in
// all that every endpoint of a version with traffic is hit about ten times at its
// weight, shared among its meshed callers; a callee no meshed pod calls is probed from
// one meshed pod anyway, and a pod that calls nothing sends one probe so that its
// outbound interception is still proven. A 100-pod graph thus sends probes along its
// edges, not 100 × services. Without edges every pod probes every service other than
// its own, probesPerService times or its share of the coverage if that is more.
func probePlan(app *topology.App, meshed []topology.Pod) map[string]map[string]int {
	plan := map[string]map[string]int{}
	add := func(pod, svc string, n int) {
		if plan[pod] == nil {
			plan[pod] = map[string]int{}
		}
		plan[pod][svc] += n
	}
	if app.Calls == nil {
		for _, s := range app.Services {
			// A pod calling its own service may be routed to itself, which enters its
			// sidecar through the loopback hairpin and would mask a pod whose
			// inbound interception is missing.
			var callers []topology.Pod
			for _, from := range meshed {
				if from.Service != s.Name || len(app.Services) == 1 {
					callers = append(callers, from)
				}
			}
			if len(callers) == 0 {
				continue
			}
			// Every caller proves its outbound path; together they cover every endpoint
			// (a version at 25% got none of 9 probes one time in thirteen).
			each := max(probesPerService(s), (coverageProbes(s)+len(callers)-1)/len(callers))
			for _, from := range callers {
				add(from.Name, s.Name, each)
			}
		}
		return plan
	}
	for _, s := range app.Services {
		var callers []topology.Pod
		for _, from := range meshed {
			if from.Service == s.Name {
				continue // see above: no probes to a pod's own service
			}
			if (from.Service == "" && s.Name == app.Entrypoint) || slices.Contains(app.Calls[from.Service], s.Name) {
				callers = append(callers, from)
			}
		}
		if len(callers) == 0 {
			for _, from := range meshed {
				if from.Service != s.Name {
					callers = []topology.Pod{from}
					break
				}
			}
		}
		if len(callers) == 0 {
			continue
		}
		total := coverageProbes(s)
		each := (total + len(callers) - 1) / len(callers)
		for _, from := range callers {
			add(from.Name, s.Name, each)
		}
	}
	// The one outbound probe of a pod that calls nothing goes to the service that
	// calls the fewest others, so that it does not fan out through the graph.
	for _, from := range meshed {
		if len(plan[from.Name]) > 0 {
			continue
		}
		target := ""
		for _, s := range app.Services {
			if s.Name != from.Service && (target == "" || len(app.Calls[s.Name]) < len(app.Calls[target])) {
				target = s.Name
			}
		}
		if target != "" {
			add(from.Name, target, 1)
		}
	}
	return plan
}

// coverageProbes is how many probes a service needs in all for each endpoint of each
// version with traffic to expect ten (at least probesPerService, at most 2000).
func coverageProbes(s topology.Service) int {
	total := probesPerService(s)
	weights := 0
	for _, v := range s.Versions {
		weights += v.Weight
	}
	for _, v := range s.Versions {
		if len(v.Endpoints) == 0 || (weights > 0 && v.Weight == 0) {
			continue
		}
		share := 1 / float64(len(s.Versions))
		if weights > 0 {
			share = float64(v.Weight) / float64(weights)
		}
		total = max(total, int(math.Ceil(10*float64(len(v.Endpoints))/share)))
	}
	return min(total, 2000)
}

// meshProbes sends the planned requests from `from` to each service through from's
// sidecar and describes the services that did not answer every one.
func meshProbes(ctx context.Context, sub substrate.Substrate, app *topology.App, from topology.Pod, plan map[string]int) []string {
	var fails []string
	for _, s := range app.Services {
		n, planned := plan[s.Name]
		if !planned || n == 0 {
			continue
		}
		var addr string
		switch eps := allEndpoints(s); {
		case s.VIP.IsValid():
			addr = mesh.Addr(s.VIP, s.Port)
		case len(eps) > 0:
			// The sidecar routes by Host; the address only selects the port listener.
			addr = mesh.Addr(eps[0].IP, s.Port)
		default:
			continue
		}
		host := fmt.Sprintf("%s:%d", s.Name, s.Port)
		failures := 0
		var lastErr string
		for range n {
			if ctx.Err() != nil {
				return fails
			}
			r, err := mesh.ProbeHTTP(ctx, sub, from, addr, host, "/")
			switch {
			case err != nil:
				failures++
				lastErr = err.Error()
			case r.ProxyGenerated:
				failures++
				lastErr = fmt.Sprintf("HTTP %d from the proxy: %.120s", r.Status, r.Body)
			}
		}
		if failures > 0 {
			fails = append(fails, fmt.Sprintf("pod %s -> service %s through the mesh: %d of %d probes failed (last: %s)", from.Name, s.Name, failures, n, lastErr))
		}
	}
	return fails
}

// receivesMeshTraffic says whether the route table sends the pod any share of its
// service's traffic.
func (p *Profile) receivesMeshTraffic(app *topology.App, pod topology.Pod) bool {
	s := app.Service(pod.Service)
	if s == nil {
		return false
	}
	positive := 0
	for _, v := range s.Versions {
		if v.Weight > 0 {
			positive++
		}
	}
	if len(s.Versions) <= 1 || positive == 0 {
		return true // no split: every pod of the service
	}
	for _, v := range s.Versions {
		if v.Name == pod.Version {
			return v.Weight > 0
		}
	}
	return false
}

// probeTLSConfig is a client identity for the check itself, issued by the mesh CA.
func (p *Profile) probeTLSConfig(app *topology.App) (*tls.Config, error) {
	ca := p.CA()
	if ca == nil {
		return nil, fmt.Errorf("%s: no CA: Install has not run", Name)
	}
	leaf, err := ca.Issue(topology.SPIFFEID(p.opts.TrustDomain, app.Namespace, ProbeServiceAccount), time.Hour)
	if err != nil {
		return nil, err
	}
	cert, err := leaf.TLSCertificate()
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		// SPIFFE peers are verified by URI SAN in VerifyConnection, not by host name.
		InsecureSkipVerify: true,
		MinVersion:         tls.VersionTLS12,
	}, nil
}

// expectIdentity verifies the server's chain against the mesh CA and its SPIFFE ID.
func (p *Profile) expectIdentity(want string) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		got, err := p.CA().PeerID(cs.PeerCertificates)
		if err != nil {
			return err
		}
		if got != want {
			return fmt.Errorf("server identity %s, want %s", got, want)
		}
		return nil
	}
}

// gatewayReady asks the ingress gateway's admin whether its Envoy is ready.
func gatewayReady(ctx context.Context, sub substrate.Substrate, pod topology.Pod) error {
	r, err := mesh.ProbeHTTP(ctx, sub, pod, fmt.Sprintf("127.0.0.1:%d", gateway.AdminPort), "", "/ready")
	if err != nil {
		return err
	}
	if r.Status != 200 {
		return fmt.Errorf("admin /ready: HTTP %d %s", r.Status, strings.TrimSpace(r.Body))
	}
	return nil
}
