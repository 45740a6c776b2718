package workload

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// trace is what a response body says about the call graph.
type trace struct {
	Service string  `json:"service"`
	Version string  `json:"version"`
	Pod     string  `json:"pod"`
	Code    int     `json:"code"`
	Error   string  `json:"error"`
	Calls   []trace `json:"calls"`
	Pad     string  `json:"pad"`
}

type testPod struct{ service, version string }

// startPods runs each pod on its own 127.0.0.1 port; calls between them go through
// --resolve style overrides (plus extra ones, e.g. for fake services). It returns the
// base URL of each service.
func startPods(t testing.TB, g *Graph, pods []testPod, extra map[string]string) map[string]string {
	t.Helper()
	return startPodsOpts(t, g, pods, extra, nil)
}

// startPodsWrapped is startPods with each service's handler wrapped by wrap.
func startPodsWrapped(t testing.TB, g *Graph, pods []testPod, wrap func(service string, h http.Handler) http.Handler) map[string]string {
	t.Helper()
	return startPodsOpts(t, g, pods, nil, wrap)
}

func startPodsOpts(t testing.TB, g *Graph, pods []testPod, extra map[string]string, wrap func(string, http.Handler) http.Handler) map[string]string {
	t.Helper()
	resolve := map[string]string{}
	for k, v := range extra {
		resolve[k] = v
	}
	listeners := make([]net.Listener, len(pods))
	urls := map[string]string{}
	for i, p := range pods {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		listeners[i] = ln
		resolve[p.service] = ln.Addr().String()
		urls[p.service] = "http://" + ln.Addr().String()
	}
	for i, p := range pods {
		srv, err := NewServer(g, ServerOptions{Service: p.service, Version: p.version, Pod: p.service + "-" + p.version + "-0", Resolve: resolve})
		if err != nil {
			t.Fatal(err)
		}
		if wrap != nil {
			srv.wrap = wrap(p.service, srv)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- srv.Serve(ctx, listeners[i]) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("serve %s: %v", p.service, err)
			}
		})
	}
	return urls
}

func mustParse(t testing.TB, src string) *Graph {
	t.Helper()
	g, err := Parse(t.Name()+".yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return g
}

var testClient = &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 64}, Timeout: 20 * time.Second}

func get(t testing.TB, url string, header http.Header) (*http.Response, []byte, trace) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	var tr trace
	if err := json.Unmarshal(body, &tr); err != nil {
		t.Fatalf("body is not JSON (%v): %.200s", err, body)
	}
	return resp, body, tr
}

func TestBookinfoCallGraph(t *testing.T) {
	g, err := Builtin("bookinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, reviews := range []string{"v1", "v2", "v3"} {
		t.Run("reviews-"+reviews, func(t *testing.T) {
			urls := startPods(t, g, []testPod{{"productpage", "v1"}, {"details", "v1"}, {"reviews", reviews}, {"ratings", "v1"}}, nil)
			resp, body, tr := get(t, urls["productpage"]+"/productpage", http.Header{"X-Request-Id": {"req-42"}})
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			if resp.Header.Get("X-Request-Id") != "req-42" {
				t.Errorf("x-request-id not echoed: %q", resp.Header.Get("X-Request-Id"))
			}
			if len(body) != 5<<10 {
				t.Errorf("body %d bytes, want productpage's responseSize 5120", len(body))
			}
			if tr.Service != "productpage" || tr.Version != "v1" || tr.Pod != "productpage-v1-0" || tr.Code != 200 {
				t.Errorf("root %+v", tr)
			}
			if len(tr.Calls) != 2 || tr.Calls[0].Service != "details" || tr.Calls[1].Service != "reviews" {
				t.Fatalf("productpage calls %+v", tr.Calls)
			}
			rv := tr.Calls[1]
			if rv.Version != reviews || rv.Code != 200 || rv.Pad != "" {
				t.Errorf("reviews node %+v (nested nodes carry no padding)", rv)
			}
			wantRatings := reviews != "v1"
			gotRatings := len(rv.Calls) == 1 && rv.Calls[0].Service == "ratings" && rv.Calls[0].Code == 200
			if gotRatings != wantRatings || (!wantRatings && len(rv.Calls) != 0) {
				t.Errorf("reviews %s calls %+v", reviews, rv.Calls)
			}
		})
	}
}

func TestResponseSize(t *testing.T) {
	for _, size := range []int64{0, 10, 70, 72, 1 << 10, 100 << 10} {
		t.Run(strconv.FormatInt(size, 10), func(t *testing.T) {
			g := mustParse(t, "name: g\nservices:\n  - name: a\n    responseSize: "+strconv.FormatInt(size, 10)+"\n")
			urls := startPods(t, g, []testPod{{"a", "v1"}}, nil)
			resp, body, tr := get(t, urls["a"]+"/", nil)
			n, err := strconv.Atoi(resp.Header.Get(TraceBytesHeader))
			if err != nil {
				t.Fatal(err)
			}
			natural := n + 1
			if want := max(int(size), natural); len(body) != want {
				t.Errorf("body %d bytes, want %d", len(body), want)
			}
			var bare trace
			if err := json.Unmarshal(append(body[:n:n], '}'), &bare); err != nil || bare.Service != "a" || bare.Pad != "" || tr.Service != "a" {
				t.Errorf("trace prefix %q: %+v, %v", body[:n], bare, err)
			}
		})
	}
}

func TestUpstreamFailurePropagates(t *testing.T) {
	g := mustParse(t, `name: g
services:
  - name: a
    script:
      - call: b
      - call: c
  - name: b
    errorRate: 100%
  - name: c
`)
	// c is resolved to a port where nothing listens
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	closed.Close()

	urls := startPods(t, g, []testPod{{"a", "v1"}, {"b", "v1"}}, map[string]string{"c": closedAddr})
	resp, body, tr := get(t, urls["a"]+"/", nil)
	if resp.StatusCode != 502 || tr.Code != 502 {
		t.Fatalf("status %d, want 502: %s", resp.StatusCode, body)
	}
	if len(tr.Calls) != 1 || tr.Calls[0].Service != "b" || tr.Calls[0].Code != 500 || tr.Calls[0].Error != "injected fault" {
		t.Errorf("a failed step must stop the script and show b's 500: %+v", tr.Calls)
	}

	g2 := mustParse(t, "name: g\nservices:\n  - name: a\n    script: [call: c]\n  - name: c\n")
	urls = startPods(t, g2, []testPod{{"a", "v1"}}, map[string]string{"c": closedAddr})
	resp, body, tr = get(t, urls["a"]+"/", nil)
	if resp.StatusCode != 502 || len(tr.Calls) != 1 || tr.Calls[0].Code != 0 || !strings.Contains(tr.Calls[0].Error, "connection refused") {
		t.Errorf("status %d, body %s", resp.StatusCode, body)
	}
}

// fakeService is a real HTTP server standing in for a callee (or a proxy answering on
// its behalf); it records what it received.
type fakeService struct {
	mu       sync.Mutex
	headers  []http.Header
	methods  []string
	sizes    []int
	hosts    []string
	paths    []string
	newConns int
}

func startFake(t *testing.T, handler func(w http.ResponseWriter)) (*fakeService, string) {
	f := &fakeService{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		f.mu.Lock()
		f.headers = append(f.headers, r.Header.Clone())
		f.methods = append(f.methods, r.Method)
		f.sizes = append(f.sizes, int(n))
		f.hosts = append(f.hosts, r.Host)
		f.paths = append(f.paths, r.URL.Path)
		f.mu.Unlock()
		handler(w)
	}), ConnState: func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			f.mu.Lock()
			f.newConns++
			f.mu.Unlock()
		}
	}}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return f, ln.Addr().String()
}

func TestHeadersAndRequestSize(t *testing.T) {
	fake, addr := startFake(t, fakeTrace)
	g := mustParse(t, "name: g\nservices:\n  - name: a\n    script:\n      - call: {service: b, path: /put, size: 10KiB}\n  - name: b\n")
	urls := startPods(t, g, []testPod{{"a", "v1"}}, map[string]string{"b": addr})
	in := http.Header{
		"X-Request-Id": {"rid-1"},
		"Traceparent":  {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		"X-B3-Traceid": {"80f198ee56343ba864fe8b2a57d3eff7"},
		"End-User":     {"jason"},
		"X-Private":    {"must-not-leak"},
	}
	resp, body, tr := get(t, urls["a"]+"/", in)
	if resp.StatusCode != 200 || len(tr.Calls) != 1 || tr.Calls[0].Pod != "fake" {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	fake.mu.Lock()
	defer fake.mu.Unlock()
	if len(fake.headers) != 1 {
		t.Fatalf("b received %d requests", len(fake.headers))
	}
	h := fake.headers[0]
	for _, k := range []string{"X-Request-Id", "Traceparent", "X-B3-Traceid", "End-User"} {
		if h.Get(k) != in.Get(k) {
			t.Errorf("%s: b got %q, want %q", k, h.Get(k), in.Get(k))
		}
	}
	if h.Get("X-Private") != "" {
		t.Errorf("X-Private propagated")
	}
	if fake.methods[0] != http.MethodPost || fake.sizes[0] != 10240 {
		t.Errorf("b got %s with %d bytes, want POST with 10240", fake.methods[0], fake.sizes[0])
	}
	// meshes route on the authority, so it must be the service name, not the address
	if fake.hosts[0] != "b:9080" || fake.paths[0] != "/put" {
		t.Errorf("b got Host %q path %q, want b:9080 and /put", fake.hosts[0], fake.paths[0])
	}
}

func fakeTrace(w http.ResponseWriter) {
	const tr = `{"service":"b","version":"v1","pod":"fake","code":200`
	w.Header().Set(TraceBytesHeader, strconv.Itoa(len(tr)))
	io.WriteString(w, tr+"}")
}

func TestUpstreamConnectionsAreReused(t *testing.T) {
	fake, addr := startFake(t, fakeTrace)
	g := mustParse(t, "name: g\nservices:\n  - name: a\n    script: [call: b]\n  - name: b\n    port: 7000\n    path: /api/b\n")
	urls := startPods(t, g, []testPod{{"a", "v1"}}, map[string]string{"b": addr})
	const n = 50
	for i := 0; i < n; i++ {
		if resp, body, _ := get(t, urls["a"]+"/", nil); resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
	}
	fake.mu.Lock()
	defer fake.mu.Unlock()
	if len(fake.paths) != n || fake.paths[0] != "/api/b" || fake.hosts[0] != "b:7000" || fake.methods[0] != http.MethodGet {
		t.Fatalf("b got %d requests, first %s %s%s", len(fake.paths), fake.methods[0], fake.hosts[0], fake.paths[0])
	}
	if fake.newConns > 2 {
		t.Errorf("%d sequential calls opened %d connections; keep-alive should reuse one", n, fake.newConns)
	}
}

func TestForeignErrorResponse(t *testing.T) {
	_, addr := startFake(t, func(w http.ResponseWriter) {
		w.WriteHeader(503)
		io.WriteString(w, "no healthy upstream")
	})
	g := mustParse(t, "name: g\nservices:\n  - name: a\n    script: [call: b]\n  - name: b\n")
	urls := startPods(t, g, []testPod{{"a", "v1"}}, map[string]string{"b": addr})
	resp, body, tr := get(t, urls["a"]+"/", nil)
	if resp.StatusCode != 502 || len(tr.Calls) != 1 || tr.Calls[0].Code != 503 ||
		!strings.Contains(tr.Calls[0].Error, "no healthy upstream") {
		t.Errorf("status %d, body %s", resp.StatusCode, body)
	}
}

// within5Sigma says whether k successes in n trials fit probability p.
func within5Sigma(k, n int, p float64) bool {
	sigma := math.Sqrt(float64(n) * p * (1 - p))
	return math.Abs(float64(k)-float64(n)*p) <= 5*sigma
}

func TestErrorRate(t *testing.T) {
	g := mustParse(t, "name: g\nservices:\n  - name: a\n    errorRate: 20%\n")
	urls := startPods(t, g, []testPod{{"a", "v1"}}, nil)
	const n = 1000
	failures := 0
	for i := 0; i < n; i++ {
		resp, _, tr := get(t, urls["a"]+"/", nil)
		switch resp.StatusCode {
		case 500:
			failures++
			if tr.Error != "injected fault" {
				t.Fatalf("500 without reason: %+v", tr)
			}
		case 200:
		default:
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	if !within5Sigma(failures, n, 0.2) {
		t.Errorf("%d of %d requests failed, want about %d", failures, n, n/5)
	}
}

func TestCallProbability(t *testing.T) {
	g := mustParse(t, "name: g\nservices:\n  - name: a\n    script:\n      - call: b\n        probability: 30%\n      - call: c\n  - name: b\n  - name: c\n")
	urls := startPods(t, g, []testPod{{"a", "v1"}, {"b", "v1"}, {"c", "v1"}}, nil)
	const n = 1000
	made := 0
	for i := 0; i < n; i++ {
		_, _, tr := get(t, urls["a"]+"/", nil)
		last := tr.Calls[len(tr.Calls)-1]
		if last.Service != "c" {
			t.Fatalf("c must always be called: %+v", tr.Calls)
		}
		if len(tr.Calls) == 2 {
			made++
		}
	}
	if !within5Sigma(made, n, 0.3) {
		t.Errorf("b called in %d of %d requests, want about %d", made, n, 3*n/10)
	}
}

func TestConcurrentGroupRunsInParallel(t *testing.T) {
	const leaves = `  - name: b
    script: [sleep: 200ms]
  - name: c
    script: [sleep: 200ms]
  - name: d
    script: [sleep: 200ms]
`
	concurrent := mustParse(t, "name: g\nservices:\n  - name: a\n    script:\n      - [call: b, call: c, call: d]\n"+leaves)
	sequential := mustParse(t, "name: g\nservices:\n  - name: a\n    script: [call: b, call: c, call: d]\n"+leaves)
	pods := []testPod{{"a", "v1"}, {"b", "v1"}, {"c", "v1"}, {"d", "v1"}}
	elapsed := func(g *Graph) time.Duration {
		urls := startPods(t, g, pods, nil)
		start := time.Now()
		resp, body, tr := get(t, urls["a"]+"/", nil)
		if resp.StatusCode != 200 || len(tr.Calls) != 3 || tr.Calls[0].Service != "b" || tr.Calls[2].Service != "d" {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		return time.Since(start)
	}
	if d := elapsed(concurrent); d < 200*time.Millisecond || d > 500*time.Millisecond {
		t.Errorf("concurrent group of three 200ms calls took %v", d)
	}
	if d := elapsed(sequential); d < 600*time.Millisecond {
		t.Errorf("three sequential 200ms calls took only %v", d)
	}
}

func TestSleepHonoured(t *testing.T) {
	g := mustParse(t, `name: g
services:
  - name: fixed
    script: [sleep: 30ms]
  - name: expo
    isEntrypoint: true
    script:
      - sleep: {distribution: exponential, mean: 10ms}
`)
	urls := startPods(t, g, []testPod{{"fixed", "v1"}, {"expo", "v1"}}, nil)
	for i := 0; i < 5; i++ {
		start := time.Now()
		get(t, urls["fixed"]+"/", nil)
		if d := time.Since(start); d < 30*time.Millisecond {
			t.Fatalf("request to a service sleeping 30ms took %v", d)
		}
	}
	const n = 150
	var total time.Duration
	for i := 0; i < n; i++ {
		start := time.Now()
		get(t, urls["expo"]+"/", nil)
		total += time.Since(start)
	}
	// the mean of 150 exponential draws with mean 10ms has a standard deviation of 0.8ms;
	// the upper bound also leaves room for a busy machine.
	if mean := total / n; mean < 6*time.Millisecond || mean > 35*time.Millisecond {
		t.Errorf("mean latency %v with an exponential 10ms sleep", mean)
	}
}

func TestDelaySampleDistributions(t *testing.T) {
	ms := float64(time.Millisecond)
	cases := []struct {
		name              string
		d                 Delay
		mean, sd, tolMean float64 // in ms; tolMean relative
		tolSD             float64 // relative
		lo, hi            float64 // every sample within, in ms
	}{
		{"constant", Delay{Distribution: Constant, Mean: 7 * time.Millisecond}, 7, 0, 0, 0, 7, 7},
		{"normal", Delay{Distribution: Normal, Mean: 10 * time.Millisecond, Stddev: 2 * time.Millisecond}, 10, 2, 0.01, 0.03, 0, math.Inf(1)},
		{"exponential", Delay{Distribution: Exponential, Mean: 5 * time.Millisecond}, 5, 5, 0.03, 0.05, 0, math.Inf(1)},
		{"uniform", Delay{Distribution: Uniform, Min: 2 * time.Millisecond, Max: 4 * time.Millisecond}, 3, 2 / math.Sqrt(12), 0.01, 0.03, 2, 4},
		{"clamped normal", Delay{Distribution: Normal, Mean: 10 * time.Millisecond, Stddev: 10 * time.Millisecond, Min: 5 * time.Millisecond, Max: 12 * time.Millisecond}, -1, -1, 0, 0, 5, 12},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newTestRand(42)
			const n = 50000
			var sum, sumSq float64
			for i := 0; i < n; i++ {
				v := float64(tc.d.Sample(r)) / ms
				if v < tc.lo || v > tc.hi {
					t.Fatalf("sample %vms outside [%v, %v]", v, tc.lo, tc.hi)
				}
				sum += v
				sumSq += v * v
			}
			mean := sum / n
			sd := math.Sqrt(sumSq/n - mean*mean)
			if tc.mean >= 0 && math.Abs(mean-tc.mean) > tc.tolMean*tc.mean+1e-9 {
				t.Errorf("mean %.4fms, want %.4fms", mean, tc.mean)
			}
			if tc.sd >= 0 && math.Abs(sd-tc.sd) > tc.tolSD*tc.sd+1e-6 {
				t.Errorf("stddev %.4fms, want %.4fms", sd, tc.sd)
			}
		})
	}
}

func processCPU(t testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func TestCPUBurnHonoured(t *testing.T) {
	g := mustParse(t, "name: g\nservices:\n  - name: a\n    script: [cpu: 20ms]\n")
	urls := startPods(t, g, []testPod{{"a", "v1"}}, nil)
	const n = 10
	before := processCPU(t)
	for i := 0; i < n; i++ {
		start := time.Now()
		if resp, _, _ := get(t, urls["a"]+"/", nil); resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		if d := time.Since(start); d < 20*time.Millisecond {
			t.Fatalf("request burning 20ms of CPU took %v", d)
		}
	}
	// CPU time, not wall time, is burnt, so a busy machine cannot shrink it
	if used := processCPU(t) - before; used < n*20*time.Millisecond*9/10 {
		t.Errorf("%d requests of cpu: 20ms used only %v of CPU", n, used)
	}
}

func TestHealthzSkipsScript(t *testing.T) {
	g := mustParse(t, "name: g\nservices:\n  - name: a\n    errorRate: 100%\n    script: [sleep: 2s]\n")
	urls := startPods(t, g, []testPod{{"a", "v1"}}, nil)
	start := time.Now()
	resp, err := testClient.Get(urls["a"] + HealthPath)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "ok\n" || time.Since(start) > time.Second {
		t.Errorf("healthz: %d %q after %v", resp.StatusCode, body, time.Since(start))
	}
}

func TestNewServerChoosesVersion(t *testing.T) {
	g, err := Builtin("bookinfo")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewServer(g, ServerOptions{Service: "reviews"}); err == nil || !strings.Contains(err.Error(), "v1, v2, v3") {
		t.Errorf("reviews without a version: %v", err)
	}
	if _, err := NewServer(g, ServerOptions{Service: "review", Version: "v1"}); err == nil || !strings.Contains(err.Error(), "productpage, details, reviews, ratings") {
		t.Errorf("unknown service: %v", err)
	}
	if _, err := NewServer(g, ServerOptions{Service: "details"}); err != nil {
		t.Errorf("details has one version: %v", err)
	}
}

func TestParseResolve(t *testing.T) {
	got, err := ParseResolve([]string{"a=127.0.0.2", "b=127.0.0.1:8080", "c=[::1]:80"})
	if err != nil || got["a"] != "127.0.0.2" || got["b"] != "127.0.0.1:8080" || got["c"] != "[::1]:80" {
		t.Errorf("ParseResolve = %v, %v", got, err)
	}
	for _, bad := range []string{"a", "=1.2.3.4", "a=", "a=host.example:80", "a=1.2.3"} {
		if _, err := ParseResolve([]string{bad}); err == nil {
			t.Errorf("ParseResolve(%q) accepted", bad)
		}
	}
}

func TestServeStopsOnCancel(t *testing.T) {
	g := mustParse(t, "name: g\nservices:\n  - name: a\n")
	srv, err := NewServer(g, ServerOptions{Service: "a"})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after cancel")
	}
	if _, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err == nil || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("listener still open after Serve returned: %v", err)
	}
}

// ServedPath counts every answered request, injected errors included, and neither
// health checks nor its own reads.
func TestServedCountsRequests(t *testing.T) {
	g := mustParse(t, "name: g\nservices:\n  - name: a\n    errorRate: 50%\n")
	urls := startPods(t, g, []testPod{{"a", "v1"}}, nil)
	read := func() string {
		resp, err := testClient.Get(urls["a"] + ServedPath)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return strings.TrimSpace(string(b))
	}
	if got := read(); got != "0" {
		t.Fatalf("served before any request: %q", got)
	}
	for range 7 {
		resp, err := testClient.Get(urls["a"] + "/")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	if resp, err := testClient.Get(urls["a"] + HealthPath); err == nil {
		resp.Body.Close()
	}
	if got := read(); got != "7" {
		t.Errorf("served after 7 requests and a health check: %q", got)
	}
}

// A mesh that addresses services by its own names (Traefik Mesh) rewrites the callee
// authority; the call then carries that name as its Host and dials where Resolve says.
func TestCalleeAuthority(t *testing.T) {
	g := mustParse(t, `name: g
services:
  - name: a
    script:
      - call: b
  - name: b
`)
	callee, err := NewServer(g, ServerOptions{Service: "b"})
	if err != nil {
		t.Fatal(err)
	}
	hosts := make(chan string, 1)
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hosts <- r.Host
		callee.ServeHTTP(w, r)
	}))
	defer b.Close()
	srv, err := NewServer(g, ServerOptions{Service: "a",
		Callees: map[string]string{"b": "b.default.traefik.mesh:5001"},
		Resolve: map[string]string{"b.default.traefik.mesh": b.Listener.Addr().String()}})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	srv.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	if rec.Code != 200 {
		t.Fatalf("a answered %d: %s", rec.Code, rec.Body)
	}
	if h := <-hosts; h != "b.default.traefik.mesh:5001" {
		t.Errorf("b saw Host %q, want the mesh name", h)
	}
	for _, bad := range []string{"b", "b=", "b=host", "b=host:0", "=h:1"} {
		if _, err := ParseCallees([]string{bad}); err == nil {
			t.Errorf("ParseCallees(%q) accepted", bad)
		}
	}
	if m, err := ParseCallees([]string{"b=b.ns.traefik.mesh:5001"}); err != nil || m["b"] != "b.ns.traefik.mesh:5001" {
		t.Errorf("ParseCallees: %v %v", m, err)
	}
}

// Spread picks a callee's endpoint per request by weight over kept-alive connections
// (HTTP/1.1 and gRPC alike), so one caller's calls land on every version in proportion,
// each request still naming the service as its Host (gRPC :authority).
func TestSpreadBalancesPerRequest(t *testing.T) {
	g := mustParse(t, `name: g
services:
  - name: a
    script:
      - call: b
      - call: c
  - name: b
    versions: [{name: v1}, {name: v2}]
  - name: c
    protocol: grpc
    versions: [{name: v1}, {name: v2}]
`)
	hosts := map[string]*sync.Map{"b": {}, "c": {}}
	spread := map[string][]Endpoint{}
	for _, p := range []testPod{{"b", "v1"}, {"b", "v2"}, {"c", "v1"}, {"c", "v2"}} {
		urls := startPodsWrapped(t, g, []testPod{p}, func(svc string, h http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				hosts[svc].Store(r.Host, true)
				h.ServeHTTP(w, r)
			})
		})
		weight := 1
		if p.version == "v2" {
			weight = 3
		}
		spread[p.service] = append(spread[p.service], Endpoint{Addr: strings.TrimPrefix(urls[p.service], "http://"), Weight: weight})
	}
	spread["unrelated"] = []Endpoint{{Addr: "127.0.0.1:1", Weight: 1}} // a service a does not call
	srv, err := NewServer(g, ServerOptions{Service: "a", Spread: spread})
	if err != nil {
		t.Fatal(err)
	}
	const n = 400
	got := map[string]int{}
	for range n {
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		var tr trace
		if err := json.Unmarshal(rec.Body.Bytes(), &tr); err != nil || rec.Code != 200 || len(tr.Calls) != 2 {
			t.Fatalf("a answered %d: %s", rec.Code, rec.Body)
		}
		for _, c := range tr.Calls {
			got[c.Service+" "+c.Version]++
		}
	}
	// v2 has 3/4 of the weight: 300 of 400 expected, sd 8.7; 30 is over three sd.
	for _, svc := range []string{"b", "c"} {
		if v2 := got[svc+" v2"]; v2 < 270 || v2 > 330 || got[svc+" v1"]+v2 != n {
			t.Errorf("%s: v1 %d, v2 %d of %d calls; want about 100 and 300", svc, got[svc+" v1"], v2, n)
		}
	}
	for svc, m := range hosts {
		var seen []string
		m.Range(func(k, _ any) bool { seen = append(seen, k.(string)); return true })
		if want := svc + ":9080"; len(seen) != 1 || seen[0] != want {
			t.Errorf("%s saw Host %v, want only %s", svc, seen, want)
		}
	}

	for _, bad := range []string{"b", "b=", "=127.0.0.1:1", "b=127.0.0.1:0", "b=127.0.0.1:1@x", "b=127.0.0.1:1@-1", "b=127.0.0.1:1@0"} {
		if _, err := ParseSpread([]string{bad}); err == nil {
			t.Errorf("ParseSpread(%q) accepted", bad)
		}
	}
	if _, err := ParseSpread([]string{"b=127.0.0.1:1", "b=127.0.0.1:2"}); err == nil {
		t.Error("ParseSpread accepted a service twice")
	}
	m, err := ParseSpread([]string{"b=127.0.0.1:1@2,127.0.0.2:1,127.0.0.3:1@0"})
	if err != nil || len(m["b"]) != 3 || m["b"][0].Weight != 2 || m["b"][1].Weight != 1 || m["b"][2].Weight != 0 {
		t.Errorf("ParseSpread: %+v %v", m, err)
	}
	if back, err := ParseSpread([]string{FormatSpread("b", m["b"])}); err != nil || !reflect.DeepEqual(back, m) {
		t.Errorf("FormatSpread does not parse back: %+v %v", back, err)
	}
}

func FuzzParseSpread(f *testing.F) {
	for _, s := range []string{"b=127.0.0.1:1@2,127.0.0.2:1", "b=[::1]:80@0,127.0.0.1:9", "b=", "=1", "b=1.2.3.4:5@@1", "b=1.2.3.4:5,"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		m, err := ParseSpread([]string{spec})
		if err != nil {
			return
		}
		for name, eps := range m {
			positive := false
			for _, ep := range eps {
				host, port, err := net.SplitHostPort(ep.Addr)
				if err != nil || net.ParseIP(host) == nil || port == "" || ep.Weight < 0 {
					t.Fatalf("%q accepted with endpoint %+v", spec, ep)
				}
				positive = positive || ep.Weight > 0
			}
			if name == "" || !positive {
				t.Fatalf("%q accepted: service %q, endpoints %+v", spec, name, eps)
			}
		}
	})
}
