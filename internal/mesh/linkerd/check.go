package linkerd

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/linkerd/controlplane"
	"github.com/meshmark/meshmark/internal/mesh/meshprobe"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/topology"
)

// ProbeServiceAccount is the identity the check presents when it calls a pod over mTLS
// from outside the mesh.
const ProbeServiceAccount = "meshmark-probe"

// probeResult is one probe's outcome.
type probeResult struct {
	status int
	body   string
	// proxyError is linkerd2-proxy's l5d-proxy-error header: the proxy, not the
	// workload, answered.
	proxyError string
	peer       []*x509.Certificate
}

// get sends one GET from inside pod `from` on a fresh connection, over TLS when conf
// is set.
func get(ctx context.Context, sub substrate.Substrate, from topology.Pod, conf *tls.Config, addr, host, path string) (probeResult, error) {
	ctx, cancel := context.WithTimeout(ctx, meshprobe.ProbeTimeout)
	defer cancel()
	dial := func(ctx context.Context, network, a string) (net.Conn, error) {
		return sub.DialContext(ctx, from, network, a)
	}
	tr := &http.Transport{DialContext: dial, DisableKeepAlives: true}
	scheme := "http"
	if conf != nil {
		scheme = "https"
		tr.DialTLSContext = func(ctx context.Context, network, a string) (net.Conn, error) {
			c, err := dial(ctx, network, a)
			if err != nil {
				return nil, err
			}
			tc := tls.Client(c, conf)
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
		return probeResult{}, err
	}
	if host != "" {
		req.Host = host
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return probeResult{}, fmt.Errorf("probe %s -> %s (Host %s): %w", from.Name, addr, host, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	r := probeResult{status: resp.StatusCode, body: string(b), proxyError: resp.Header.Get("l5d-proxy-error")}
	if resp.TLS != nil {
		r.peer = resp.TLS.PeerCertificates
	}
	return r, nil
}

// refusing says whether inbound policy refuses a client with this identity ("" for a
// plaintext client): strict admits any mesh identity, authz only the listed ones.
func (p *Profile) refusing(app *topology.App, identity string) bool {
	if allowed := p.authzIdentities(app); len(allowed) > 0 {
		return !slices.Contains(allowed, identity)
	}
	return p.mode == mesh.MTLSStrict && identity == ""
}

// Check drives probe traffic through the mesh and reads every proxy's metrics: each
// enrolled pod calls every other service through its own proxy (outbound requests, and
// at the destinations inbound requests with tls="true"); a pod outside the mesh then
// calls every service pod directly, in plaintext (refused with 403 when policy says
// so) and, under strict mTLS or authz, with a mesh certificate whose server identity
// is checked against the name meshmark issued.
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
		sort.Strings(e.Failures)
	}()

	// 1. Every enrolled pod has a ready proxy; remember its counters.
	before := map[string]Traffic{}
	for _, pod := range meshed {
		if err := adminReady(ctx, sub, pod); err != nil {
			e.Fail("pod %s: no ready linkerd2-proxy: %v", pod.Name, err)
			continue
		}
		rows[pod.Name].Sidecar = true
		t, err := readTraffic(ctx, sub, pod)
		if err != nil {
			e.Fail("pod %s: proxy metrics unreadable: %v", pod.Name, err)
			continue
		}
		before[pod.Name] = t
	}
	if ctx.Err() != nil {
		return e, ctx.Err()
	}

	// 2. Through the mesh, a few sources at a time.
	var (
		mu    sync.Mutex
		fails []string
		wg    sync.WaitGroup
		sem   = make(chan struct{}, 4)
	)
	for _, from := range meshed {
		if !rows[from.Name].Sidecar {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			msgs := p.meshProbes(ctx, sub, app, from)
			mu.Lock()
			fails = append(fails, msgs...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	for _, msg := range fails {
		e.Fail("%s", msg)
	}
	if ctx.Err() != nil {
		return e, ctx.Err()
	}

	// 3. From outside the mesh, straight to every service pod.
	out, outName, haveOutsider := p.outsider(sub, app)
	policyRefuses := p.refusing(app, "")
	var plaintext, controls []meshprobe.PlaintextProbe
	outside := map[string]uint64{} // per pod: its direct plaintext requests, where its policy admits them
	var probeTLS *tls.Config
	if haveOutsider && (p.mode == mesh.MTLSStrict || len(p.authz) > 0) {
		if probeTLS, err = p.probeTLSConfig(app); err != nil {
			return e, err
		}
	}
	for _, s := range app.Services {
		for _, v := range s.Versions {
			for _, pod := range v.Endpoints {
				r := rows[pod.Name]
				if !haveOutsider {
					r.Notes = append(r.Notes, "no pod outside the mesh to probe from directly")
					continue
				}
				addr := mesh.Addr(pod.IP, pod.Port)
				inBefore, sidecarUp := before[pod.Name]
				if sidecarUp {
					if t, err := readTraffic(ctx, sub, pod); err == nil {
						inBefore = t
					} else {
						sidecarUp = false
					}
				}
				res, err := get(ctx, sub, out, nil, addr, s.Name, "/")
				switch {
				case policyRefuses:
					observed, refused := meshprobe.Refusal(meshprobe.ProbeResult{Status: res.status, Body: res.body, ProxyGenerated: res.proxyError != ""}, err)
					plaintext = append(plaintext, meshprobe.PlaintextProbe{Service: s.Name, Refused: refused, Observed: observed,
						Target: fmt.Sprintf("pod %s at %s (http), from %s", pod.Name, addr, outName)})
				case err != nil:
					e.Fail("pod %s: direct probe from %s failed: %v", pod.Name, outName, err)
				case res.proxyError != "":
					e.Fail("pod %s: direct probe from %s: HTTP %d from the proxy: %s", pod.Name, outName, res.status, res.proxyError)
				default:
					r.Answered = true
				}
				if probeTLS != nil && isMeshed[pod.Name] {
					want := p.Identity(app, pod)
					conf := probeTLS.Clone()
					conf.ServerName = want
					res, err := get(ctx, sub, out, conf, addr, s.Name, "/")
					probeID := controlplane.IdentityName(ProbeServiceAccount, app.Namespace, p.opts.TrustDomain)
					if policyRefuses {
						// The positive control of the plaintext request: the same caller at
						// the same address, with a mesh identity, reaches the pod's proxy,
						// whose identity the handshake verified; any answer of that proxy
						// proves the reach (its policy's 403 where authz refuses the probe).
						control := meshprobe.PlaintextProbe{Service: s.Name, Refused: err != nil,
							Target: fmt.Sprintf("pod %s at %s (mTLS as %s), from %s", pod.Name, addr, ProbeServiceAccount, outName)}
						switch {
						case err != nil:
							control.Observed = "not answered: " + err.Error()
						case res.proxyError != "":
							control.Observed = fmt.Sprintf("answered by the proxy: HTTP %d", res.status)
						default:
							control.Observed = fmt.Sprintf("answered: HTTP %d", res.status)
						}
						controls = append(controls, control)
					}
					switch {
					case err != nil:
						e.Fail("pod %s: mTLS probe from %s as %s failed: %v", pod.Name, outName, ProbeServiceAccount, err)
					case p.refusing(app, probeID) && res.status != http.StatusForbidden:
						e.Fail("pod %s: authz should refuse %s but it answered HTTP %d", pod.Name, probeID, res.status)
					case !p.refusing(app, probeID) && (res.status >= 400 || res.proxyError != ""):
						e.Fail("pod %s: mTLS probe from %s: HTTP %d %s", pod.Name, outName, res.status, res.proxyError)
					default:
						r.Answered = r.Answered || res.status < 400
						r.Notes = append(r.Notes, fmt.Sprintf("mTLS probe as %s: HTTP %d, server identity %s", ProbeServiceAccount, res.status, peerName(res.peer)))
					}
				}
				if sidecarUp {
					if after, err := readTraffic(ctx, sub, pod); err == nil {
						d := after.Sub(inBefore)
						if d.InboundMTLS+d.InboundPlaintext+d.Denied == 0 {
							e.Fail("pod %s: a direct request from %s bypassed its linkerd2-proxy (inbound traffic not intercepted)", pod.Name, outName)
						}
						if !policyRefuses {
							outside[pod.Name] = d.InboundPlaintext
						}
					}
				}
			}
		}
	}

	if haveOutsider && policyRefuses {
		e.JudgePlaintext(plaintext, controls)
	}

	// 4. What every proxy saw.
	for _, pod := range meshed {
		r := rows[pod.Name]
		b, ok := before[pod.Name]
		if !ok {
			continue
		}
		after, err := readTraffic(ctx, sub, pod)
		if err != nil {
			e.Fail("pod %s: proxy metrics unreadable after probing: %v", pod.Name, err)
			continue
		}
		d := after.Sub(b)
		r.ObserveInbound(d.InboundMTLS, d.InboundPlaintext, outside[pod.Name])
		r.OutboundRequests = d.Outbound
		if d.Outbound == 0 && len(app.Services) > 1 {
			e.Fail("pod %s: its linkerd2-proxy saw no outbound request (outbound traffic not intercepted)", pod.Name)
		}
		if d.Outbound > 0 && d.OutboundMTLS < d.Outbound {
			e.Fail("pod %s: %d of %d outbound requests left without mTLS", pod.Name, d.Outbound-d.OutboundMTLS, d.Outbound)
		}
		if r.Service == "" {
			continue
		}
		if r.InboundRequests == 0 && d.Denied == 0 {
			if haveOutsider || p.receivesMeshTraffic(app, pod) {
				e.Fail("pod %s: its linkerd2-proxy saw no inbound request (inbound traffic not intercepted)", pod.Name)
			} else {
				r.Notes = append(r.Notes, "version has weight 0 and no pod outside the mesh could probe it")
			}
			continue
		}
		if r.InboundMTLS > 0 || r.InboundPlaintext > 0 {
			r.Answered = true
		}
		if r.InboundMTLS == 0 && p.receivesMeshTraffic(app, pod) && p.hasAllowedCaller(app, meshed, pod) {
			e.Fail("pod %s: no request from the mesh reached its proxy over mTLS", pod.Name)
		}
	}
	return e, nil
}

// hasAllowedCaller says whether some meshed pod of another service probed pod's
// service and was allowed by policy, so an mTLS request must have arrived.
func (p *Profile) hasAllowedCaller(app *topology.App, meshed []topology.Pod, pod topology.Pod) bool {
	for _, from := range meshed {
		if from.Service != pod.Service && !p.refusing(app, p.Identity(app, from)) {
			return true
		}
	}
	return false
}

func peerName(chain []*x509.Certificate) string {
	if len(chain) == 0 || len(chain[0].DNSNames) == 0 {
		return "-"
	}
	return chain[0].DNSNames[0]
}

// meshProbes sends requests from `from` to every other service by its address, through
// from's proxy, and describes what went wrong.
func (p *Profile) meshProbes(ctx context.Context, sub substrate.Substrate, app *topology.App, from topology.Pod) []string {
	var fails []string
	fromID := p.Identity(app, from)
	refused := p.refusing(app, fromID)
	for _, s := range app.Services {
		if s.Name == from.Service && len(app.Services) > 1 {
			// A pod calling its own service may be sent to itself, which the proxy
			// serves without passing its inbound side.
			continue
		}
		var addr string
		switch {
		case s.VIP.IsValid():
			addr = mesh.Addr(s.VIP, s.Port)
		case len(s.Versions) > 0 && len(s.Versions[0].Endpoints) > 0:
			addr = mesh.Addr(s.Versions[0].Endpoints[0].IP, s.Port)
		default:
			continue
		}
		n := probesPerService(s)
		failures := 0
		var last string
		for range n {
			if ctx.Err() != nil {
				return fails
			}
			r, err := get(ctx, sub, from, nil, addr, fmt.Sprintf("%s:%d", s.Name, s.Port), "/")
			switch {
			case err != nil:
				failures++
				last = err.Error()
			case refused && r.status != http.StatusForbidden:
				failures++
				last = fmt.Sprintf("authz should refuse %s but got HTTP %d", fromID, r.status)
			case refused:
			case r.proxyError != "" || r.status >= 500:
				failures++
				last = fmt.Sprintf("HTTP %d %s %.120s", r.status, r.proxyError, r.body)
			}
		}
		if failures > 0 {
			fails = append(fails, fmt.Sprintf("pod %s -> service %s through the mesh: %d of %d probes failed (last: %s)", from.Name, s.Name, failures, n, last))
		}
	}
	return fails
}

// probesPerService is how many requests each pod sends to a service: at least three
// per endpoint, and enough that each version with a positive weight is missed with a
// probability under one in a million (the check fails a version that got no mTLS).
func probesPerService(s topology.Service) int {
	n, total, least := 0, 0, 0
	for _, v := range s.Versions {
		n += len(v.Endpoints)
		total += v.Weight
		if v.Weight > 0 && (least == 0 || v.Weight < least) {
			least = v.Weight
		}
	}
	need := max(4, 3*n)
	if total > 0 && least < total {
		miss := 1 - float64(least)/float64(total)
		need = max(need, int(math.Ceil(math.Log(1e-6)/math.Log(miss))))
	}
	return need
}

// receivesMeshTraffic says whether the split sends the pod any share of its service.
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
		return true
	}
	for _, v := range s.Versions {
		if v.Name == pod.Version {
			return v.Weight > 0
		}
	}
	return false
}

// outsider picks a pod outside the mesh: an unmeshed client, else a node namespace.
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

// probeTLSConfig is a mesh client identity for the check, signed by the mesh CA the
// way the identity controller signs a proxy's, verifying servers against the CA.
func (p *Profile) probeTLSConfig(app *topology.App) (*tls.Config, error) {
	ca := p.CA()
	if ca == nil {
		return nil, fmt.Errorf("%s: no CA: Install has not run", Name)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	id := controlplane.IdentityName(ProbeServiceAccount, app.Namespace, p.opts.TrustDomain)
	der, _, err := ca.SignPublicKey(&key.PublicKey, []string{id}, "", time.Hour)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
		RootCAs:      ca.Pool(),
		MinVersion:   tls.VersionTLS12,
	}, nil
}
