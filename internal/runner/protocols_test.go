package runner

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/gateway"
	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/study"
	"github.com/meshmark/meshmark/internal/substrate"
)

// A graph whose services talk HTTP/1.1, h2c and gRPC to each other, as emojivoto does
// (web over HTTP, emoji and voting over gRPC).
const mixedProtocolGraph = `name: mixed
services:
  - name: web
    isEntrypoint: true
    script:
      - - call: emoji
        - call: voting
  - name: emoji
    protocol: grpc
    script: [call: ratings]
  - name: voting
    protocol: http2
  - name: ratings
    protocol: grpc
`

const mixedProtocolStudy = `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: runner-mixed-protocols}
spec:
  substrate:
    local: {nodes: 2, loadgenNode: 1}
  workload: {graph: mixed.yaml}
  meshes:
    - {name: none, profile: none}
    - {name: sidecar, profile: envoy-sidecar, options: {mtls: strict}}
  experiments:
    - {name: latency, kind: fixed-rate, rate: 60, connections: 4, duration: 3s, warmup: 1s}
  repeats: 1
`

// TestMixedProtocolsThroughSidecars: every request of a graph whose edges are HTTP/1.1,
// h2c and gRPC succeeds without a mesh and through strict-mTLS sidecars, and the
// sidecars really spoke HTTP/2 upstream to the HTTP/2 and gRPC services.
func TestMixedProtocolsThroughSidecars(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "mixed.yaml"), []byte(mixedProtocolGraph), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "study.yaml")
	if err := os.WriteFile(path, []byte(mixedProtocolStudy), 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := study.ParseFile(path)
	if err != nil {
		t.Fatal(err)
	}
	run, _ := runStudy(t, st)
	for _, m := range run.Meshes {
		var e mesh.Enrollment
		if err := json.Unmarshal(m.Enrollment, &e); err != nil || !e.Pass {
			t.Errorf("%s enrollment: %v %+v", m.Label, err, e.Failures)
		}
	}
	var h2Inbound uint64
	for _, tr := range run.Trials {
		r := tr.Result
		if r.Requests < 150 || r.Errors != 0 || r.StatusCodes[200] != r.Requests {
			t.Errorf("%s: %d requests, %d errors %v, codes %v", tr.Mesh, r.Requests, r.Errors, r.ErrorsByKind, r.StatusCodes)
		}
		for _, ps := range r.ProxyStats {
			var d mesh.ProxyDelta
			if err := json.Unmarshal(ps.Stats, &d); err != nil {
				t.Fatal(err)
			}
			// Connections are kept alive from the enrollment probes on, so the
			// evidence is the HTTP/2 connections open on the callees' inbound side
			// (a gauge) rather than ones opened during the trial.
			if strings.HasPrefix(d.Pod, "web") {
				continue
			}
			for name, v := range d.Gauges {
				if strings.HasPrefix(name, "http.inbound") && strings.HasSuffix(name, ".downstream_cx_http2_active") {
					h2Inbound += v
				}
			}
		}
	}
	if h2Inbound == 0 {
		t.Error("no HTTP/2 connection was open into the sidecars of the HTTP/2 and gRPC services")
	}
}

const ingressStudy = `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: runner-ingress}
spec:
  substrate:
    local: {nodes: 2, loadgenNode: 1}
  workload: {graph: bookinfo}
  meshes:
    - {name: none, profile: none}
    - {name: sidecar, profile: envoy-sidecar, options: {mtls: strict}}
  experiments:
    - {name: internal, kind: fixed-rate, rate: 60, connections: 4, duration: 3s, warmup: 1s}
    - {name: ingress, kind: fixed-rate, rate: 60, connections: 4, duration: 3s, warmup: 1s, path: ingress}
  repeats: 1
`

// TestIngressPathCrossesTheGateway: path: ingress puts a gateway pod in front of the
// entry service, enrolled by the mesh like the app's pods; its Envoy is sampled under the
// gateway role during ingress trials, and every request succeeds on both paths.
func TestIngressPathCrossesTheGateway(t *testing.T) {
	needRoot(t)
	run, _ := runStudy(t, parseStudy(t, ingressStudy))
	for _, m := range run.Meshes {
		var e mesh.Enrollment
		if err := json.Unmarshal(m.Enrollment, &e); err != nil || !e.Pass {
			t.Errorf("%s enrollment: %v %+v", m.Label, err, e.Failures)
		}
		gw := false
		for _, p := range e.Pods {
			gw = gw || strings.HasPrefix(p.Pod, "ingress-gateway") && p.Meshed == (m.Profile != "none")
		}
		if !gw {
			t.Errorf("%s: the gateway pod is not among the enrolled pods as expected: %+v", m.Label, e.Pods)
		}
	}
	for _, tr := range run.Trials {
		r := tr.Result
		if r.Requests < 150 || r.Errors != 0 || r.StatusCodes[200] != r.Requests {
			t.Errorf("%s %s: %d requests, %d errors %v", tr.Mesh, tr.Experiment, r.Requests, r.Errors, r.ErrorsByKind)
		}
		wantURL := "http://productpage:9080/productpage"
		if tr.Experiment == "ingress" {
			wantURL = "http://ingress-gateway:8080/productpage"
		}
		if tr.Params.Extra["url"] != wantURL || tr.Params.Path != tr.Experiment {
			t.Errorf("%s %s: url %q path %q", tr.Mesh, tr.Experiment, tr.Params.Extra["url"], tr.Params.Path)
		}
		var gatewayCPU float64
		for _, s := range r.Resources {
			if s.Role == "gateway" {
				gatewayCPU = max(gatewayCPU, s.CPUUserSeconds+s.CPUSysSeconds)
			}
		}
		if tr.Experiment == "ingress" && gatewayCPU == 0 {
			t.Errorf("%s ingress: no gateway CPU sampled", tr.Mesh)
		}
	}
}

// TestGRPCBalancedPerRequestOnlyByTheMesh: a gRPC caller keeps one channel, so without a
// mesh balancing per connection (kube-proxy style DNAT) every call of it lands on one
// version of the callee, while the sidecars split per request by weight, as Istio does
// for gRPC, and so does the baseline balancing per request (its default).
func TestGRPCBalancedPerRequestOnlyByTheMesh(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	graph := `name: grpc-split
services:
  - name: front
    isEntrypoint: true
    script: [call: back]
  - name: back
    protocol: grpc
    versions: [{name: v1}, {name: v2}, {name: v3}]
`
	if err := os.WriteFile(filepath.Join(dir, "g.yaml"), []byte(graph), 0o644); err != nil {
		t.Fatal(err)
	}
	doc := strings.NewReplacer("mixed.yaml", "g.yaml", "{mtls: strict}", "{mtls: permissive}",
		"- {name: none, profile: none}", "- {name: none, profile: none, options: {balancing: per-connection}}\n    - {name: none-spread, profile: none}").Replace(mixedProtocolStudy)
	if err := os.WriteFile(filepath.Join(dir, "study.yaml"), []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := study.ParseFile(filepath.Join(dir, "study.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	r := &runner{study: st, opts: Options{PodBinary: podBin, Progress: testWriter{t}}, capacities: map[string]map[string][]float64{}}
	if err := r.prepare(); err != nil {
		t.Fatal(err)
	}
	const n = 90
	for i := range st.Spec.Meshes {
		m := &st.Spec.Meshes[i]
		d, err := r.bringUp(context.Background(), m)
		if err != nil {
			t.Fatalf("%s: %v", m.Name, err)
		}
		versions := map[string]int{}
		client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: clientPodDialer(d)}}
		for range n {
			resp, err := client.Get("http://front:9080/")
			if err != nil {
				d.close()
				t.Fatalf("%s: %v", m.Name, err)
			}
			var tr struct {
				Calls []struct{ Version string } `json:"calls"`
			}
			err = json.NewDecoder(resp.Body).Decode(&tr)
			resp.Body.Close()
			if err != nil || resp.StatusCode != 200 || len(tr.Calls) != 1 {
				d.close()
				t.Fatalf("%s: status %d, trace %+v, %v", m.Name, resp.StatusCode, tr, err)
			}
			versions[tr.Calls[0].Version]++
		}
		d.close()
		t.Logf("%s: back versions %v", m.Name, versions)
		switch m.Name {
		case "none":
			if len(versions) != 1 {
				t.Errorf("without a mesh one gRPC channel reached %d versions %v, want 1 (balancing per connection)", len(versions), versions)
			}
		default:
			// 90 calls, p = 1/3: mean 30, sd 4.5; 12 is four sd below.
			for _, v := range []string{"v1", "v2", "v3"} {
				if versions[v] < 12 {
					t.Errorf("%s: version %s got %d of %d calls %v, want about a third (balancing per request)", m.Name, v, versions[v], n, versions)
				}
			}
		}
	}
}

// TestIngressGatewayIsOneHop: under envoy-sidecar and istio-ambient the ingress path
// crosses the mesh's own gateway, as with Istio's ingress gateway: one Envoy in the
// gateway pod, with no sidecar beside it and outside ambient capture, answering
// plaintext from outside and reaching an entry service under strict mTLS, which only
// the gateway originating mTLS (HBONE for ambient) itself can do. Without a mesh it is
// the plain gateway. Either way the path has one gateway hop: the response names the
// gateway pod, and its trace starts at the entry service.
func TestIngressGatewayIsOneHop(t *testing.T) {
	needRoot(t)
	st := parseStudy(t, strings.Replace(ingressStudy, "    - {name: sidecar, profile: envoy-sidecar, options: {mtls: strict}}\n",
		"    - {name: sidecar, profile: envoy-sidecar, options: {mtls: strict}}\n    - {name: ambient, profile: istio-ambient, options: {mtls: strict}}\n", 1))
	if len(st.Spec.Meshes) != 3 {
		t.Fatalf("study has %d meshes, want 3", len(st.Spec.Meshes))
	}
	r := &runner{study: st, opts: Options{PodBinary: podBin, Progress: testWriter{t}}, capacities: map[string]map[string][]float64{}}
	if err := r.prepare(); err != nil {
		t.Fatal(err)
	}
	for i := range st.Spec.Meshes {
		m := &st.Spec.Meshes[i]
		func() {
			d, err := r.bringUp(context.Background(), m)
			if err != nil {
				t.Fatalf("%s: %v", m.Name, err)
			}
			defer d.close()
			gw := d.app.Service(gateway.Service)
			if gw == nil || len(gw.Versions) != 1 || len(gw.Versions[0].Endpoints) != 1 {
				t.Fatalf("%s: no single gateway pod: %+v", m.Name, gw)
			}
			gwPod := gw.Versions[0].Endpoints[0]
			var procs []string
			for _, p := range d.tb.Processes() {
				if p.Pod() == gwPod.Name {
					procs = append(procs, p.Spec().Name+"/"+string(p.Spec().Role))
				}
			}
			t.Logf("%s: enrollment %s; the gateway pod runs %v", m.Name, d.enrollment.Summary(), procs)
			if len(procs) != 1 || procs[0] != "gateway/"+string(substrate.RoleGateway) {
				t.Errorf("%s: the gateway pod runs %v, want its gateway alone", m.Name, procs)
			}
			if m.Profile != "none" {
				if !d.enrollment.Pass || d.enrollment.PlaintextRefused == nil || !*d.enrollment.PlaintextRefused {
					t.Errorf("%s: enrollment %v, plaintext refused %v: want strict mTLS proven", m.Name, d.enrollment.Failures, d.enrollment.PlaintextRefused)
				}
				for _, p := range d.enrollment.Pods {
					if p.Pod == gwPod.Name && (!p.Meshed || !p.Sidecar || !p.Answered) {
						t.Errorf("%s: gateway row %+v: want the mesh's live gateway answering", m.Name, p)
					}
				}
			}
			client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: clientPodDialer(d)}}
			for range 20 {
				resp, err := client.Get("http://ingress-gateway:8080/productpage")
				if err != nil {
					t.Fatalf("%s: %v", m.Name, err)
				}
				var tr struct {
					Service string `json:"service"`
				}
				err = json.NewDecoder(resp.Body).Decode(&tr)
				resp.Body.Close()
				if err != nil || resp.StatusCode != 200 || tr.Service != "productpage" || resp.Header.Get(gateway.HopHeader) != gwPod.Name {
					t.Fatalf("%s: HTTP %d, trace root %q, %s %q, %v", m.Name, resp.StatusCode, tr.Service, gateway.HopHeader, resp.Header.Get(gateway.HopHeader), err)
				}
			}
		}()
	}
}
