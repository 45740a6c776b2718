package kubeplatform

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/load"
	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/runner"
	"github.com/meshmark/meshmark/internal/store"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/substrate/kube"
	"github.com/meshmark/meshmark/internal/substrate/kube/kubetest"
	"github.com/meshmark/meshmark/internal/topology"
	"github.com/meshmark/meshmark/internal/workload"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// graphPods is every pod of g as the cluster would list them, one generator beside, on
// node n1 unless onNode says otherwise for the pod's service.
func graphPods(g *workload.Graph, onNode map[string]string) []kube.PodSidecar {
	var pods []kube.PodSidecar
	for _, d := range g.Deployments() {
		for i := range max(d.Replicas, 1) {
			node := "n1"
			if n, ok := onNode[d.Service]; ok {
				node = n
			}
			if n, ok := onNode[fmt.Sprintf("%s-%s-%d", d.Service, d.Version, i)]; ok {
				node = n
			}
			pods = append(pods, kube.PodSidecar{Pod: fmt.Sprintf("%s-%s-%d", d.Service, d.Version, i), App: d.Service, Version: d.Version, Node: node, Sidecar: true})
		}
	}
	return append(pods, kube.PodSidecar{Pod: "meshmark-loadgen-0", App: "loadgen", Generator: true, Node: "n2", Sidecar: true})
}

// TestBurstIsSizedForTheSmallestShare: the burst brings the pod with the smallest share
// of the graph's requests 20 of them, at least 200 requests over 3 s, at most 250 req/s
// for 10 s; pods that would still get fewer than 10, weight-0 versions, services the
// entry never reaches and the load generators are not held to it.
func TestBurstIsSizedForTheSmallestShare(t *testing.T) {
	bookinfo, err := workload.Load("bookinfo")
	if err != nil {
		t.Fatal(err)
	}
	flow := serviceFlows(bookinfo)
	for svc, want := range map[string]float64{"productpage": 1, "details": 1, "reviews": 1, "ratings": 2.0 / 3} {
		if math.Abs(flow[svc]-want) > 1e-9 {
			t.Errorf("bookinfo: %s gets %.3f requests per entry request, want %.3f", svc, flow[svc], want)
		}
	}
	for _, tc := range []struct {
		replicas     int
		rate         float64
		length       time.Duration
		held, unheld int
	}{
		{1, 67, 3 * time.Second, 6, 1},         // reviews' 3 pods a third each: 60, so the floor of 200
		{10, 200, 3 * time.Second, 60, 1},      // 30 reviews pods: 600
		{40, 250, 10 * time.Second, 240, 1},    // 120 reviews pods: 2400, over 250 req/s
		{100, 250, 10 * time.Second, 300, 301}, // 300 reviews pods: 2500 bring them 8.3 each, not held
	} {
		g, _ := workload.Load("bookinfo")
		g.SetReplicas(tc.replicas)
		bp := planBurst(g, graphPods(g, nil))
		if bp.rate != tc.rate || bp.length != tc.length {
			t.Errorf("bookinfo × %d: burst %g req/s for %s, want %g for %s", tc.replicas, bp.rate, bp.length, tc.rate, tc.length)
		}
		// What judgeTraffic holds, at the burst's size.
		out := burstOutcome{plan: bp, res: &load.Result{Sent: int64(bp.rate * bp.length.Seconds()), Completed: int64(bp.rate * bp.length.Seconds())}}
		out.res.Succeeded = out.res.Completed
		enr := mesh.Enrollment{Pass: true}
		judgeTraffic(&enr, nil, out, nil)
		held, unheld := 0, 0
		for _, p := range out.plan.pods {
			if p.notHeld == "" {
				held++
			} else {
				unheld++
			}
		}
		if held != tc.held || unheld != tc.unheld {
			t.Errorf("bookinfo × %d: %d pods held to the burst, %d not; want %d and %d", tc.replicas, held, unheld, tc.held, tc.unheld)
		}
	}

	g, err := workload.Parse("g.yaml", []byte(`name: g
services:
  - name: front
    isEntrypoint: true
    script: [{call: {service: back, probability: 50%}}]
  - name: back
    versions:
      - {name: v1, weight: 1}
      - {name: v2, weight: 1}
  - name: lonely
    isEntrypoint: false
`))
	if err != nil {
		t.Fatal(err)
	}
	bp := planBurst(g, graphPods(g, nil))
	// back's two pods get a quarter each: 80 requests.
	if bp.rate != 67 {
		t.Errorf("burst at %g req/s, want the floor's 67", bp.rate)
	}
	why := map[string]string{}
	for _, p := range bp.pods {
		why[p.Pod] = p.notHeld
	}
	if why["front-v1-0"] != "" || why["back-v1-0"] != "" || why["back-v2-0"] != "" ||
		!strings.Contains(why["lonely-v1-0"], "no request from the entry service") || !strings.Contains(why["meshmark-loadgen-0"], "load generator") {
		t.Errorf("not held: %q", why)
	}
}

// TestJudgeTrafficHoldsEveryProxy: each kind of proxy is held to what it should have
// counted of the burst, and what is not held says why.
func TestJudgeTrafficHoldsEveryProxy(t *testing.T) {
	g, err := workload.Parse("g.yaml", []byte("name: g\nservices:\n  - name: front\n    isEntrypoint: true\n    script: [call: back]\n  - name: back\n    replicas: 2\n"))
	if err != nil {
		t.Fatal(err)
	}
	sidecars := []meshkube.ProxyEndpoint{{Component: "envoy", Container: "istio-proxy"}}
	ztunnel := []meshkube.ProxyEndpoint{{Component: "ztunnel", Namespace: "istio-system", Labels: map[string]string{"app": "ztunnel"}}}
	waypoint := append(slices.Clone(ztunnel), meshkube.ProxyEndpoint{Component: "waypoint", AppLabels: map[string]string{"gateway": "waypoint"}})
	cilium := []meshkube.ProxyEndpoint{{Component: "cilium-agent", Namespace: "kube-system"}, {Component: "cilium-envoy", Namespace: "kube-system"}}
	ok := &load.Result{Sent: 201, Completed: 201, Succeeded: 201, StatusCodes: map[int]int64{200: 201}}
	sidecar := func(pod, svc string, n uint64) mesh.ProxyDelta {
		d := mesh.ProxyDelta{Component: "envoy", Pod: pod, Unit: meshkube.UnitRequests}
		if svc != "" {
			d.Inbound = map[string]uint64{svc: n}
		}
		return d
	}
	node := func(comp, name, unit string, in map[string]uint64) mesh.ProxyDelta {
		return mesh.ProxyDelta{Component: comp, Pod: name, Unit: unit, Inbound: in}
	}
	bytesIn := func(d mesh.ProxyDelta, in map[string]uint64) mesh.ProxyDelta {
		d.InboundBytes = in
		return d
	}
	allCount := []mesh.ProxyDelta{sidecar("front-v1-0", "front", 201), sidecar("back-v1-0", "back", 100), sidecar("back-v1-1", "back", 101), sidecar("meshmark-loadgen-0", "", 0)}
	// wire splits a proxy's inbound count by what its counters say of mTLS.
	wire := func(d mesh.ProxyDelta, unit string, mtls, plain map[string]uint64) mesh.ProxyDelta {
		d.WireUnit, d.InboundMTLS, d.InboundPlaintext = unit, mtls, plain
		return d
	}
	allMTLS := []mesh.ProxyDelta{
		wire(sidecar("front-v1-0", "front", 201), meshkube.UnitConnections, map[string]uint64{"front": 2}, map[string]uint64{"front": 0}),
		wire(sidecar("back-v1-0", "back", 100), meshkube.UnitConnections, map[string]uint64{"back": 1}, map[string]uint64{"back": 0}),
		wire(sidecar("back-v1-1", "back", 101), meshkube.UnitConnections, map[string]uint64{"back": 1}, map[string]uint64{"back": 0}),
		sidecar("meshmark-loadgen-0", "", 0)}
	somePlain := slices.Clone(allMTLS)
	somePlain[2] = wire(sidecar("back-v1-1", "back", 101), meshkube.UnitRequests, map[string]uint64{"back": 98}, map[string]uint64{"back": 3})
	for _, tc := range []struct {
		name       string
		endpoints  []meshkube.ProxyEndpoint
		onNode     map[string]string
		res        *load.Result
		runErr     error
		tolerate   bool
		deltas     []mesh.ProxyDelta
		fails      []string // each failure contains the one at its index
		proven     bool
		held       int
		notes      []string // some note contains each
		podInbound map[string]uint64
		mtls       mesh.MTLSMode
		observed   map[string]string // pod: what its row says the wire carried
		served     map[string]int64  // pod: what it served of the burst, read from it
	}{
		{name: "every sidecar counted", endpoints: sidecars, res: ok, deltas: allCount, proven: true, held: 3,
			podInbound: map[string]uint64{"front-v1-0": 201, "back-v1-0": 100, "back-v1-1": 101}},
		{name: "every sidecar took its traffic over mTLS", endpoints: sidecars, res: ok, deltas: allMTLS, proven: true, held: 3, mtls: mesh.MTLSStrict,
			observed: map[string]string{"front-v1-0": "mtls", "back-v1-0": "mtls", "back-v1-1": "mtls", "meshmark-loadgen-0": ""}},
		{name: "a sidecar took plaintext under strict mTLS", endpoints: sidecars, res: ok, deltas: somePlain, held: 3, mtls: mesh.MTLSStrict,
			fails:    []string{"pod back-v1-1: istio-proxy accepted 3 inbound requests for back in plaintext during a 3s probe burst of 201 requests, though the mesh is configured for strict mTLS"},
			observed: map[string]string{"front-v1-0": "mtls", "back-v1-1": "mixed"}},
		{name: "plaintext under permissive mTLS is seen, not failed", endpoints: sidecars, res: ok, deltas: somePlain, proven: true, held: 3, mtls: mesh.MTLSPermissive,
			observed: map[string]string{"back-v1-1": "mixed"}},
		// ztunnel alone balances per connection: the burst's calls may all reach one
		// version, and a service only another version calls then gets nothing. What the
		// pods served says so: not held, not failed.
		{name: "a service whose pods served nothing of the burst", endpoints: ztunnel, res: ok, onNode: map[string]string{"back": "n3"},
			deltas: []mesh.ProxyDelta{node("ztunnel", "n1", meshkube.UnitConnections, map[string]uint64{"front": 2, "back": 0}), node("ztunnel", "n2", meshkube.UnitConnections, map[string]uint64{"front": 0, "back": 0}),
				node("ztunnel", "n3", meshkube.UnitConnections, map[string]uint64{"front": 0, "back": 0})},
			served: map[string]int64{"front-v1-0": 201, "back-v1-0": 0, "back-v1-1": 3},
			proven: true, held: 1, notes: []string{"pod back-v1-0 not held to the burst: it served 0 of the burst's requests (about 100 were planned for it)", "pod back-v1-1 not held"}},
		// What the pod served is no excuse for a proxy that did not count it.
		{name: "a sidecar that counted nothing though its pod served", endpoints: sidecars, res: ok,
			deltas: []mesh.ProxyDelta{sidecar("front-v1-0", "front", 201), sidecar("back-v1-0", "back", 201), sidecar("back-v1-1", "back", 0), sidecar("meshmark-loadgen-0", "", 0)},
			served: map[string]int64{"front-v1-0": 201, "back-v1-0": 101, "back-v1-1": 100},
			fails:  []string{"pod back-v1-1: its istio-proxy counted no inbound request for back"}, held: 3},
		{name: "a sidecar that counted nothing", endpoints: sidecars, res: ok,
			deltas: []mesh.ProxyDelta{sidecar("front-v1-0", "front", 201), sidecar("back-v1-0", "back", 201), sidecar("back-v1-1", "back", 0), sidecar("meshmark-loadgen-0", "", 0)},
			fails:  []string{"pod back-v1-1: its istio-proxy counted no inbound request for back during a 3s probe burst of 201 requests (about 100 of them were for this pod): its traffic bypassed the proxy"}, held: 3},
		{name: "an unreadable sidecar", endpoints: sidecars, res: ok,
			deltas: []mesh.ProxyDelta{sidecar("front-v1-0", "front", 201), sidecar("back-v1-0", "back", 201), {Component: "envoy", Pod: "back-v1-1", Err: "pod back-v1-1: GET …: HTTP 503"}, {Component: "envoy", Pod: "meshmark-loadgen-0", Err: "not read before the trial"}},
			fails: []string{"istio-proxy of pod back-v1-1 could not be read around the probe burst (pod back-v1-1: GET …: HTTP 503): that its traffic crossed the mesh is unproven",
				"istio-proxy of pod meshmark-loadgen-0 could not be read around the probe burst (not read before the burst)"}, held: 2},
		{name: "refused requests", endpoints: sidecars, res: &load.Result{Sent: 201, Completed: 201, Succeeded: 190, Errors: load.Errors{Refused: 11}, ErrorSamples: []string{"connection refused"}}, deltas: allCount,
			fails: []string{"a 3s probe burst of 201 requests to front through the mesh failed 11 of its requests (11 refused; e.g. connection refused): a mesh that cannot serve the app is not measured"}, held: 3},
		{name: "5xx answers", endpoints: sidecars, res: &load.Result{Sent: 201, Completed: 201, Succeeded: 0, Errors: load.Errors{Non2xx: 201}, StatusCodes: map[int]int64{503: 201}}, deltas: allCount,
			fails: []string{"had no request answered (201 non-2xx; HTTP 503 ×201)"}, held: 3},
		{name: "5xx answers of a graph that injects errors", endpoints: sidecars, tolerate: true, res: &load.Result{Sent: 201, Completed: 201, Succeeded: 180, Errors: load.Errors{Non2xx: 21}, StatusCodes: map[int]int64{200: 180, 500: 21}}, deltas: allCount,
			proven: true, held: 3, notes: []string{"21 non-2xx answers not held against the mesh"}},
		{name: "a burst that cannot run", endpoints: sidecars, runErr: errors.New("generator 127.0.0.1:1: connection reset"),
			fails: []string{"that every pod's proxy carried traffic is unproven: the probe burst through the mesh could not run: generator 127.0.0.1:1: connection reset"}},
		{name: "ztunnels on every node", endpoints: ztunnel, res: ok, onNode: map[string]string{"back-v1-1": "n3"},
			deltas: []mesh.ProxyDelta{
				wire(node("ztunnel", "n1", meshkube.UnitConnections, map[string]uint64{"front": 2, "back": 1}), meshkube.UnitConnections, map[string]uint64{"front": 2, "back": 1}, map[string]uint64{"front": 0, "back": 0}),
				node("ztunnel", "n2", meshkube.UnitConnections, map[string]uint64{"front": 0, "back": 0}),
				node("ztunnel", "n3", meshkube.UnitConnections, map[string]uint64{"front": 0, "back": 0})},
			// back has pods on n1 and n3, balanced per connection: n3's nothing is noted.
			proven: true, held: 2, notes: []string{"ztunnel on nodes n3 counted no connection into back, which others of its nodes counted"},
			mtls: mesh.MTLSStrict, observed: map[string]string{"front-v1-0": "mtls", "back-v1-0": "mtls"}},
		{name: "a ztunnel that counted nothing for the one node of a service", endpoints: ztunnel, res: ok, onNode: map[string]string{"back": "n3"},
			deltas: []mesh.ProxyDelta{node("ztunnel", "n1", meshkube.UnitConnections, map[string]uint64{"front": 2, "back": 0}), node("ztunnel", "n2", meshkube.UnitConnections, map[string]uint64{"front": 0, "back": 0}),
				node("ztunnel", "n3", meshkube.UnitConnections, map[string]uint64{"front": 0, "back": 0})},
			fails: []string{"node n3: its ztunnel counted no inbound connection for back during a 3s probe burst of 201 requests, though pods back-v1-0, back-v1-1 of back are on it (about 201 requests for them): their traffic bypassed the proxy"}, held: 2},
		// The callers kept their connections from before the burst (the wait for the
		// entry service opened front's to back): no connection opened, the bytes show
		// the burst crossed the ztunnel.
		{name: "a ztunnel that counted bytes over kept connections", endpoints: ztunnel, res: ok, onNode: map[string]string{"back": "n3"},
			deltas: []mesh.ProxyDelta{bytesIn(node("ztunnel", "n1", meshkube.UnitConnections, map[string]uint64{"front": 2, "back": 0}), map[string]uint64{"front": 30000, "back": 0}),
				bytesIn(node("ztunnel", "n2", meshkube.UnitConnections, map[string]uint64{"front": 0, "back": 0}), map[string]uint64{"front": 0, "back": 0}),
				bytesIn(node("ztunnel", "n3", meshkube.UnitConnections, map[string]uint64{"front": 0, "back": 0}), map[string]uint64{"front": 0, "back": 24120})},
			proven: true, held: 2},
		{name: "a ztunnel that counted neither connections nor bytes", endpoints: ztunnel, res: ok, onNode: map[string]string{"back": "n3"},
			deltas: []mesh.ProxyDelta{bytesIn(node("ztunnel", "n1", meshkube.UnitConnections, map[string]uint64{"front": 2, "back": 0}), map[string]uint64{"front": 30000, "back": 0}),
				bytesIn(node("ztunnel", "n2", meshkube.UnitConnections, map[string]uint64{"front": 0, "back": 0}), map[string]uint64{"front": 0, "back": 0}),
				bytesIn(node("ztunnel", "n3", meshkube.UnitConnections, map[string]uint64{"front": 0, "back": 0}), map[string]uint64{"front": 0, "back": 0})},
			fails: []string{"node n3: its ztunnel counted no inbound connection and no byte for back during a 3s probe burst of 201 requests"}, held: 2},
		{name: "a waypoint that fronts every service", endpoints: waypoint, res: ok,
			deltas: []mesh.ProxyDelta{node("ztunnel", "n1", meshkube.UnitConnections, map[string]uint64{"front": 2, "back": 2}), node("ztunnel", "n2", meshkube.UnitConnections, map[string]uint64{}),
				node("waypoint", "waypoint-abc", meshkube.UnitRequests, map[string]uint64{"front": 201, "back": 201})},
			proven: true, held: 2},
		{name: "a waypoint that carried nothing into back", endpoints: waypoint, res: ok,
			deltas: []mesh.ProxyDelta{node("ztunnel", "n1", meshkube.UnitConnections, map[string]uint64{"front": 2, "back": 2}), node("ztunnel", "n2", meshkube.UnitConnections, map[string]uint64{}),
				node("waypoint", "waypoint-abc", meshkube.UnitRequests, map[string]uint64{"front": 201, "back": 0})},
			fails: []string{"the waypoint (pods waypoint-abc) counted no request for back during a 3s probe burst of 201 requests (about 201 requests for it): its traffic bypassed the waypoint"}, held: 2},
		{name: "no waypoint pod", endpoints: waypoint, res: ok,
			deltas: []mesh.ProxyDelta{node("ztunnel", "n1", meshkube.UnitConnections, map[string]uint64{"front": 2, "back": 2}), {Component: "waypoint", Pod: "namespace ns", Err: "no waypoint pod (labels gateway=waypoint) in the namespace"}},
			fails:  []string{"waypoint in namespace ns could not be read around the probe burst (no waypoint pod (labels gateway=waypoint) in the namespace)"}, held: 1},
		{name: "cilium counts nothing per service", endpoints: cilium, res: ok,
			deltas: []mesh.ProxyDelta{{Component: "cilium-agent", Pod: "n1", Counters: map[string]uint64{"cilium_forward_count_total{direction=INGRESS}": 400}}, {Component: "cilium-agent", Pod: "n2", Err: "HTTP 503"}, {Component: "cilium-envoy", Pod: "n1"}},
			notes:  []string{"the mesh's proxies (cilium-agent, cilium-envoy) count nothing per service, so that every pod's proxy carried traffic cannot be proven", "cilium-agent on n2 could not be read around the burst (HTTP 503)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bp := planBurst(g, graphPods(g, tc.onNode))
			out := burstOutcome{plan: bp, res: tc.res, err: tc.runErr, tolerateNon2xx: tc.tolerate, entry: "front", served: tc.served}
			enr := mesh.Enrollment{Pass: true, MTLS: tc.mtls}
			for _, p := range bp.pods {
				enr.Pods = append(enr.Pods, mesh.PodEnrollment{Pod: p.Pod, Service: p.App, Meshed: true, Sidecar: true})
			}
			judgeTraffic(&enr, tc.endpoints, out, tc.deltas)
			tr := enr.Traffic
			if tr == nil {
				t.Fatal("no traffic proof stored")
			}
			if len(enr.Failures) != len(tc.fails) || enr.Pass != (len(tc.fails) == 0) {
				t.Fatalf("pass %v, failures %q\nwant %q", enr.Pass, enr.Failures, tc.fails)
			}
			for i, f := range tc.fails {
				if !strings.Contains(enr.Failures[i], f) {
					t.Errorf("failure %q\nwant    %q", enr.Failures[i], f)
				}
			}
			if tr.Proven != tc.proven || tr.Held != tc.held {
				t.Errorf("proven %v, %d proxies held; want %v, %d (notes %q)", tr.Proven, tr.Held, tc.proven, tc.held, tr.Notes)
			}
			for _, n := range tc.notes {
				if !slices.ContainsFunc(tr.Notes, func(s string) bool { return strings.Contains(s, n) }) {
					t.Errorf("notes %q lack %q", tr.Notes, n)
				}
			}
			if tc.runErr == nil && len(tr.Proxies) != len(tc.deltas) {
				t.Errorf("%d proxies' counts stored, want the %d read", len(tr.Proxies), len(tc.deltas))
			}
			for _, pe := range enr.Pods {
				want, held := tc.podInbound[pe.Pod]
				if held && (pe.InboundRequests != want || !pe.Answered || len(pe.Notes) == 0) {
					t.Errorf("pod row %+v: want %d inbound requests, answered, a note", pe, want)
				}
				if want, ok := tc.observed[pe.Pod]; ok && pe.MTLSObserved != want {
					t.Errorf("pod row %+v: the wire seen as %q, want %q", pe, pe.MTLSObserved, want)
				}
				if pe.Pod == "meshmark-loadgen-0" && tc.proven && len(tc.podInbound) > 0 && !slices.ContainsFunc(pe.Notes, func(s string) bool { return strings.Contains(s, "not held to it: a load generator's") }) {
					t.Errorf("generator's row %+v: want it noted as not held", pe)
				}
			}
		})
	}
}

// countingProxies is a mesh profile of the tests only, for the traffic proof on the test
// cluster, where no mesh's proxy can run: it installs nothing, marks every pod enrolled
// (an annotation it both sets and expects), and reads a "sidecar" at each pod's address
// on port 15090 (its workload's container app, a generator's container generator) that
// the test serves, counting test_inbound_total per service.
type countingProxies struct{}

const countingProxiesProfile = "test-counting-proxies"

func init() {
	mesh.RegisterProfile(mesh.Registration{Name: countingProxiesProfile, Summary: "tests only: proxies stood in for on the test cluster",
		New: func(mesh.Options) (mesh.Profile, error) { return countingProxies{}, nil }})
}

func (countingProxies) Name() string { return countingProxiesProfile }
func (countingProxies) Install(context.Context, substrate.Substrate, *topology.App) error {
	return errors.New("Kubernetes only")
}
func (countingProxies) Check(context.Context, substrate.Substrate, *topology.App) (mesh.Enrollment, error) {
	return mesh.Enrollment{}, errors.New("Kubernetes only")
}
func (countingProxies) Configs() map[string][]byte                           { return nil }
func (countingProxies) Uninstall(context.Context, substrate.Substrate) error { return nil }

const countingProxyPort = 15090

func (countingProxies) Kubernetes() (meshkube.KubernetesInstall, error) {
	enrolled := map[string]string{"meshmark.dev/test-proxy": "injected"}
	read := func(body io.Reader, of meshkube.ProxyScrape) (meshkube.ProxyCounters, error) {
		var n float64
		pc, err := mesh.ReadPrometheusText(body, func(name string, labels map[string]string, v float64) {
			if name == "test_inbound_total" && labels["service"] == of.Service {
				n += v
			}
		})
		if err != nil {
			return pc, err
		}
		pc.Unit = meshkube.UnitRequests
		if of.Service != "" {
			pc.Inbound = map[string]uint64{of.Service: uint64(n)}
		}
		return pc, nil
	}
	return meshkube.KubernetesInstall{
		PodAnnotations: enrolled, EnrolledAnnotations: enrolled,
		Proxies: []meshkube.ProxyEndpoint{
			{Component: "test-proxy", Container: "app", Port: countingProxyPort, Path: "/stats", Read: read},
			{Component: "test-proxy", Container: "generator", Port: countingProxyPort, Path: "/stats", Read: read},
		},
	}, nil
}

// standInProxy serves what one pod's proxy counted, in test_inbound_total, and keeps
// every count it served.
type standInProxy struct {
	pod, namespace, service string
	count                   atomic.Int64
	// bypassed proxies never count: the requests reach their pod without them.
	bypassed bool
	mu       sync.Mutex
	served   []int64
}

// countingCluster stands in for the proxies of every pod of the app (kubetest.ReachPodPort
// to a server of the test at each pod's address and countingProxyPort) and for the
// entry service, whose handler counts each request at one pod of front and, as front
// would call back, at one pod of back, round robin, in the namespace its Host names.
type countingCluster struct {
	mu      sync.Mutex
	proxies map[string][]*standInProxy // by namespace
	// next says what the next app's first back pod does: "bypass" (its proxy counts
	// nothing) or "unreadable" (nothing serves its proxy's port); the pod is kept in
	// odd.
	next string
	odd  map[string]string // namespace -> pod
	rr   map[string]int
	// namespaces are the apps' namespaces, in the order their first pod appeared.
	namespaces []string
}

// last is the namespace of the latest app, and the pod it picked to misbehave.
func (cc *countingCluster) last() (namespace, odd string) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if len(cc.namespaces) == 0 {
		return "", ""
	}
	ns := cc.namespaces[len(cc.namespaces)-1]
	return ns, cc.odd[ns]
}

func standInCountingProxies(t *testing.T, c *kubetest.Cluster) (*countingCluster, *httptest.Server) {
	cc := &countingCluster{proxies: map[string][]*standInProxy{}, odd: map[string]string{}, rr: map[string]int{}}
	closed, err := kubetest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	var servers []*httptest.Server
	t.Cleanup(func() {
		for _, s := range servers {
			s.Close()
		}
	})
	c.OnNewPods(t, kube.ManagedByLabel, func(_ context.Context, p *corev1.Pod) (bool, error) {
		if p.Status.PodIP == "" {
			return false, nil
		}
		sp := &standInProxy{pod: p.Name, namespace: p.Namespace, service: p.Labels["app"]}
		cc.mu.Lock()
		oddOne := ""
		if sp.service == "back" && cc.odd[p.Namespace] == "" && cc.next != "" {
			oddOne, cc.odd[p.Namespace] = cc.next, p.Name
		}
		if cc.proxies[p.Namespace] == nil {
			cc.namespaces = append(cc.namespaces, p.Namespace)
		}
		cc.proxies[p.Namespace] = append(cc.proxies[p.Namespace], sp)
		cc.mu.Unlock()
		if oddOne == "unreadable" {
			return true, c.ReachPodPort(p.Status.PodIP, countingProxyPort, "127.0.0.1:"+strconv.Itoa(closed))
		}
		sp.bypassed = oddOne == "bypass"
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := sp.count.Load()
			sp.mu.Lock()
			sp.served = append(sp.served, n)
			sp.mu.Unlock()
			fmt.Fprintf(w, "# TYPE test_inbound_total counter\ntest_inbound_total{service=%q} %d\n# TYPE test_up gauge\ntest_up 1\n", sp.service, n)
		}))
		cc.mu.Lock()
		servers = append(servers, srv)
		cc.mu.Unlock()
		return true, c.ReachPodPort(p.Status.PodIP, countingProxyPort, srv.Listener.Addr().String())
	})
	entry := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// front.NAMESPACE.svc.cluster.local:PORT
		host, _, _ := strings.Cut(r.Host, ":")
		parts := strings.Split(host, ".")
		if len(parts) > 1 {
			cc.count(parts[1], "front")
			cc.count(parts[1], "back")
		}
		_, _ = w.Write([]byte("ok"))
	}))
	t.Cleanup(entry.Close)
	return cc, entry
}

// count counts one request at the next pod of service in namespace.
func (cc *countingCluster) count(namespace, service string) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	var of []*standInProxy
	for _, sp := range cc.proxies[namespace] {
		if sp.service == service {
			of = append(of, sp)
		}
	}
	if len(of) == 0 {
		return
	}
	sp := of[cc.rr[namespace+"/"+service]%len(of)]
	cc.rr[namespace+"/"+service]++
	if !sp.bypassed {
		sp.count.Add(1)
	}
}

// TestKubeTrafficProofHoldsEveryProxy runs `meshmark run` on the test cluster with a
// mesh whose proxies are stand-ins (countingProxies: kwok runs no container, so no
// proxy runs; a server of the test answers at each pod's proxy port through the API
// server's pod proxy, and the stand-in entry service counts each request at a pod of
// front and of back, as their proxies would), `meshmark generator` processes standing
// in for the generator pods. Before the first measurement the burst must be counted by
// every pod's proxy: then the stored enrollment says what each counted and the trial is
// measured; a pod whose proxy counted nothing, or could not be read, stops the run before
// any trial, naming the pod, and the namespace is removed all the same. `meshmark
// deploy`, which drives no generator, sends no burst and says so.
func TestKubeTrafficProofHoldsEveryProxy(t *testing.T) {
	if missing, how := kubetest.Missing(); len(missing) > 0 {
		t.Skipf("no test cluster: %s missing (%s)", strings.Join(missing, ", "), how)
	}
	ctx := context.Background()
	startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	c, err := kubetest.Start(startCtx, t.TempDir(), kubetest.Options{Nodes: 2})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	cc, entry := standInCountingProxies(t, c)
	standInGenerators(t, c, entry.Listener.Addr().String())
	client, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	graph := "name: two\nservices:\n  - name: front\n    isEntrypoint: true\n    script: [call: back]\n  - name: back\n    replicas: 2\n"
	if err := os.WriteFile(filepath.Join(dir, "app.yaml"), []byte(graph), 0o644); err != nil {
		t.Fatal(err)
	}
	st := parseStudy(t, fmt.Sprintf(`apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: kube-traffic}
spec:
  substrate:
    kubernetes:
      kubeconfig: %s
      image: registry.example/meshmark:test
      namespacePrefix: mmtp
      sutNodeSelector: {meshmark.dev/test-node: "0"}
      loadgenNodeSelector: {meshmark.dev/test-node: "1"}
  workload: {graph: %s}
  meshes:
    - {name: counted, profile: %s}
  experiments:
    - {name: latency, kind: fixed-rate, rate: 50, duration: 1s, warmup: 200ms}
  repeats: 1
`, c.Kubeconfig, filepath.Join(dir, "app.yaml"), countingProxiesProfile))
	run := func(t *testing.T, next string) (*results.Run, mesh.Enrollment, string, error) {
		t.Helper()
		cc.mu.Lock()
		cc.next = next
		cc.mu.Unlock()
		db, err := store.Open(ctx, filepath.Join(t.TempDir(), "results.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		var progress strings.Builder
		_, runErr := runner.Run(ctx, st, runner.Options{Store: db, Progress: io.MultiWriter(&progress, testWriter{t})})
		stored, err := db.LoadRun(ctx, "last")
		if err != nil {
			t.Fatal(err)
		}
		var enr mesh.Enrollment
		if m := stored.Mesh("counted"); m == nil || json.Unmarshal(m.Enrollment, &enr) != nil {
			t.Fatalf("no enrollment stored: %+v", stored.Meshes)
		}
		// Teardown happens whatever the check found.
		nss, err := client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: kube.ManagedByLabel})
		if err != nil {
			t.Fatal(err)
		}
		for _, ns := range nss.Items {
			t.Errorf("the run left namespace %s", ns.Name)
		}
		return stored, enr, progress.String(), runErr
	}

	t.Run("every proxy counted its share", func(t *testing.T) {
		stored, enr, progress, err := run(t, "")
		if err != nil {
			t.Fatal(err)
		}
		if len(stored.Trials) != 1 || stored.Trials[0].Result.Requests < 45 || stored.Trials[0].Result.Requests > 55 {
			t.Fatalf("%d trials stored: want the one trial of 50 requests, not the burst", len(stored.Trials))
		}
		tr := enr.Traffic
		if !enr.Pass || tr == nil || !tr.Proven || tr.Held != 3 || tr.Rate != 67 || tr.Seconds != 3 || tr.Sent < 195 || tr.Sent > 205 || tr.Succeeded != tr.Sent || len(tr.Proxies) != 4 {
			t.Fatalf("enrollment %+v, traffic %+v: want it passed, 3 proxies held to a burst of 201 requests, 4 read", enr, tr)
		}
		want := fmt.Sprintf("counted: every pod's proxy carried traffic: 3 proxies held to a 3s probe burst of %d requests at 67 req/s, %d answered", tr.Sent, tr.Succeeded)
		if !strings.Contains(progress, want) {
			t.Errorf("progress does not say %q:\n%s", want, progress)
		}
		// Each pod's row has what its proxy counted over the burst: the difference of
		// its stand-in's first two reads.
		ns, _ := cc.last()
		cc.mu.Lock()
		defer cc.mu.Unlock()
		byService := map[string]uint64{}
		rows := 0
		for _, sp := range cc.proxies[ns] {
			i := slices.IndexFunc(enr.Pods, func(pe mesh.PodEnrollment) bool { return pe.Pod == sp.pod })
			if i < 0 {
				t.Errorf("no row for pod %s", sp.pod)
				continue
			}
			pe := enr.Pods[i]
			rows++
			sp.mu.Lock()
			served := slices.Clone(sp.served)
			sp.mu.Unlock()
			if sp.service == "" {
				if pe.InboundRequests != 0 || !slices.ContainsFunc(pe.Notes, func(n string) bool { return strings.Contains(n, "not held to it: a load generator's") }) {
					t.Errorf("generator row %+v", pe)
				}
				continue
			}
			if len(served) < 2 || pe.InboundRequests != uint64(served[1]-served[0]) || pe.InboundRequests == 0 || !pe.Answered {
				t.Errorf("pod %s (%s): row %+v; its stand-in served %v", sp.pod, sp.service, pe, served)
			}
			byService[sp.service] += pe.InboundRequests
		}
		if rows != 4 || byService["front"] != uint64(tr.Sent) || byService["back"] != uint64(tr.Sent) {
			t.Errorf("%d rows; counted %v, want every one of the %d requests at front and at back", rows, byService, tr.Sent)
		}
	})

	t.Run("deploy sends no burst and says so", func(t *testing.T) {
		var progress strings.Builder
		deps, err := Deploy(ctx, st, DeployOptions{Progress: io.MultiWriter(&progress, testWriter{t})})
		if err != nil || len(deps) != 1 {
			t.Fatalf("deploy: %v, %+v", err, deps)
		}
		want := "counted: no probe burst sent: deploy drives no load generator, so that every pod's proxy carries traffic is not proven here"
		if !strings.Contains(progress.String(), want) || strings.Contains(progress.String(), "carried traffic:") {
			t.Errorf("progress does not say %q, or claims a proof:\n%s", want, progress.String())
		}
		ns, _ := cc.last()
		cc.mu.Lock()
		defer cc.mu.Unlock()
		for _, sp := range cc.proxies[ns] {
			if sp.count.Load() != 0 {
				t.Errorf("pod %s counted %d requests: deploy sent some", sp.pod, sp.count.Load())
			}
		}
	})

	t.Run("a proxy that counted nothing stops the run", func(t *testing.T) {
		stored, enr, _, err := run(t, "bypass")
		_, pod := cc.last()
		t.Logf("refused: %v", err)
		want := "pod " + pod + ": its app counted no inbound request for back during a 3s probe burst of "
		if err == nil || !strings.Contains(err.Error(), "mesh counted is not set up as claimed, refusing to measure it") || !strings.Contains(err.Error(), want) {
			t.Fatalf("run: %v\nwant it refused with %q", err, want)
		}
		if len(stored.Trials) != 0 || stored.Status != results.StatusFailed || enr.Pass || enr.Traffic == nil || enr.Traffic.Proven {
			t.Errorf("run %s, %d trials, enrollment pass %v traffic %+v: want no trial and the failed check stored", stored.Status, len(stored.Trials), enr.Pass, enr.Traffic)
		}
		if len(enr.Failures) != 1 || !strings.HasPrefix(enr.Failures[0], want) || !strings.HasSuffix(enr.Failures[0], "its traffic bypassed the proxy") {
			t.Errorf("failures %q", enr.Failures)
		}
	})

	t.Run("a proxy that cannot be read leaves it unproven", func(t *testing.T) {
		stored, enr, _, err := run(t, "unreadable")
		_, pod := cc.last()
		t.Logf("refused: %v", err)
		want := "app of pod " + pod + " could not be read around the probe burst (pod " + pod + ": GET /api/v1/namespaces/"
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "that its traffic crossed the mesh is unproven") {
			t.Fatalf("run: %v\nwant it refused with %q", err, want)
		}
		if len(stored.Trials) != 0 || enr.Pass || len(enr.Failures) != 1 {
			t.Errorf("%d trials, enrollment pass %v, failures %q: want no trial and the one failure stored", len(stored.Trials), enr.Pass, enr.Failures)
		}
	})
}
