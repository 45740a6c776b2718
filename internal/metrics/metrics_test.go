package metrics

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/meshmark/meshmark/internal/sampler"
	"github.com/meshmark/meshmark/internal/substrate"
)

func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// find returns the metric of family name whose labels include all of want.
func find(t *testing.T, fams map[string]*dto.MetricFamily, name string, want map[string]string) *dto.Metric {
	t.Helper()
	f := fams[name]
	if f == nil {
		t.Fatalf("no family %s", name)
	}
next:
	for _, m := range f.Metric {
		have := map[string]string{}
		for _, lp := range m.Label {
			have[lp.GetName()] = lp.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		return m
	}
	t.Fatalf("no %s with labels %v among %v", name, want, f.Metric)
	return nil
}

func TestServedMetricsCarryTheFedValues(t *testing.T) {
	r := New()
	srv, err := r.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	run := RunLabels{Mesh: "envoy-sidecar", Experiment: "bookinfo-100rps", Repeat: 2}
	r.ObserveInterval(run, Interval{Service: "productpage", Duration: time.Second, RequestedRate: 100, Completed: 98,
		Errors:  map[string]uint64{"timeout": 1, "http_5xx": 1},
		Latency: []LatencyCount{{200 * time.Microsecond, 50}, {time.Millisecond, 40}, {20 * time.Millisecond, 8}}})
	r.ObserveInterval(run, Interval{Service: "productpage", Duration: 500 * time.Millisecond, RequestedRate: 100, Completed: 50,
		Errors:  map[string]uint64{"timeout": 2},
		Latency: []LatencyCount{{2 * time.Millisecond, 50}}})

	// Resources from a real sampler round of this test process and a sleeping child.
	child := exec.Command("sleep", "30")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = child.Process.Kill(); _ = child.Wait() }()
	targets := []sampler.Target{
		{PID: os.Getpid(), Role: substrate.RoleLoadGen, Pod: "client-0", Node: "node-1", Mesh: run.Mesh, Component: "loadgen"},
		{PID: child.Process.Pid, Role: substrate.RoleSidecar, Pod: "productpage-0", Node: "node-1", Mesh: run.Mesh, Component: "envoy"},
	}
	s := sampler.New(sampler.Config{Targets: func() []sampler.Target { return targets }, OnRound: r.SamplerHook(run)})
	if err := s.SampleOnce(time.Now()); err != nil {
		t.Fatal(err)
	}
	// Burn 50 ms of CPU (not wall time: this machine is shared) so the load
	// generator's counter moves by several clock ticks.
	cpuStart := processCPU()
	for end := time.Now().Add(20 * time.Second); processCPU()-cpuStart < 50*time.Millisecond && time.Now().Before(end); {
	}
	if err := s.SampleOnce(time.Now()); err != nil {
		t.Fatal(err)
	}
	last := s.Rounds()[1]

	fams := scrape(t, srv.Addr())
	runL := map[string]string{"mesh": "envoy-sidecar", "experiment": "bookinfo-100rps", "repeat": "2", "service": "productpage"}
	if v := find(t, fams, NameRequestedRPS, runL).GetGauge().GetValue(); v != 100 {
		t.Errorf("requested %v", v)
	}
	if v := find(t, fams, NameAchievedRPS, runL).GetGauge().GetValue(); v != 100 { // 50 in 0.5 s
		t.Errorf("achieved %v", v)
	}
	if v := find(t, fams, NameRequests, runL).GetCounter().GetValue(); v != 148 {
		t.Errorf("requests %v", v)
	}
	if v := find(t, fams, NameErrors, map[string]string{"service": "productpage", "kind": "timeout"}).GetCounter().GetValue(); v != 3 {
		t.Errorf("timeouts %v", v)
	}
	if v := find(t, fams, NameErrors, map[string]string{"kind": "http_5xx"}).GetCounter().GetValue(); v != 1 {
		t.Errorf("5xx %v", v)
	}
	h := find(t, fams, NameLatency, runL).GetHistogram()
	if h.GetSampleCount() != 148 || abs(h.GetSampleSum()-0.31) > 1e-9 {
		t.Errorf("histogram count %d sum %v, want 148 and 0.31", h.GetSampleCount(), h.GetSampleSum())
	}
	// Cumulative "le" buckets: 50 at 200 µs, +40 at exactly 1 ms, +50 at 2 ms, +8 at 20 ms.
	want := map[float64]uint64{0.0001: 0, 0.00025: 50, 0.001: 90, 0.0015: 90, 0.002: 140, 0.015: 140, 0.025: 148, 10: 148}
	got := map[float64]uint64{}
	for _, b := range h.Bucket {
		got[b.GetUpperBound()] = b.GetCumulativeCount()
	}
	for ub, n := range want {
		if got[ub] != n {
			t.Errorf("bucket le=%v: %d, want %d", ub, got[ub], n)
		}
	}

	for _, p := range last.Procs {
		l := map[string]string{"mesh": run.Mesh, "repeat": "2", "pod": p.Pod, "role": string(p.Role),
			"node": "node-1", "component": p.Component, "pid": strconv.Itoa(p.PID)}
		if v := find(t, fams, NameCPUSeconds, l).GetCounter().GetValue(); abs(v-p.CPU().Seconds()) > 1e-9 {
			t.Errorf("%s cpu %v, sampled %v", p.Component, v, p.CPU().Seconds())
		}
		if v := find(t, fams, NameRSS, l).GetGauge().GetValue(); v != float64(p.RSSBytes) || v <= 0 {
			t.Errorf("%s rss %v, sampled %d", p.Component, v, p.RSSBytes)
		}
		find(t, fams, NameVCPU, l)
		find(t, fams, NameThreads, l)
	}
	lg := find(t, fams, NameVCPU, map[string]string{"role": "load-generator"}).GetGauge().GetValue()
	if lg <= 0 || lg > 2.5 {
		t.Errorf("load generator vCPU %v after a 50 ms CPU busy loop", lg)
	}
	if len(last.Nets) == 0 {
		t.Fatal("no interfaces sampled")
	}
	for _, n := range last.Nets {
		l := map[string]string{"pod": n.Pod, "interface": n.Interface}
		if v := find(t, fams, NameNetReceive, l).GetCounter().GetValue(); v != float64(n.RxBytes) {
			t.Errorf("%s/%s rx %v, sampled %d", n.Pod, n.Interface, v, n.RxBytes)
		}
	}

	r.Forget(run)
	fams = scrape(t, srv.Addr())
	if fams[NameLatency] != nil || fams[NameRSS] != nil {
		t.Error("Forget should drop the trial's latency and resource series")
	}
}

func TestDashboardUsesOnlyExportedMetrics(t *testing.T) {
	b, err := os.ReadFile("../../dashboards/grafana-meshmark.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash any
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("dashboards/grafana-meshmark.json: %v", err)
	}
	var exprs []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				// A datasource variable's "query" is a plugin type, not PromQL.
				if s, ok := x.(string); ok && (k == "expr" || k == "query" && v["type"] != "datasource") {
					exprs = append(exprs, s)
				}
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(dash)
	if len(exprs) < 10 {
		t.Fatalf("only %d PromQL expressions found", len(exprs))
	}

	// Every family the registry can export, with its label names, from a fully fed Recorder.
	r := New()
	run := RunLabels{Mesh: "m", Experiment: "e", Repeat: 1}
	r.ObserveInterval(run, Interval{Service: "s", Duration: time.Second, Completed: 1,
		Errors: map[string]uint64{"k": 1}, Latency: []LatencyCount{{time.Millisecond, 1}}})
	t0 := time.Now()
	proc := sampler.ProcSample{Target: sampler.Target{PID: 1, Role: "sidecar", Pod: "p"}, PSSBytes: 1, Threads: 1}
	r.ObserveRound(run, sampler.Round{Time: t0, Procs: []sampler.ProcSample{proc}})
	r.ObserveRound(run, sampler.Round{Time: t0.Add(time.Second), Procs: []sampler.ProcSample{proc},
		Nets: []sampler.NetSample{{Pod: "p", Interface: "eth0"}}})
	fams, err := r.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]map[string]bool{}
	for _, f := range fams {
		names := []string{f.GetName()}
		if f.GetType() == dto.MetricType_HISTOGRAM {
			names = append(names, f.GetName()+"_bucket", f.GetName()+"_sum", f.GetName()+"_count")
		}
		ls := map[string]bool{"le": f.GetType() == dto.MetricType_HISTOGRAM}
		for _, m := range f.Metric {
			for _, lp := range m.Label {
				ls[lp.GetName()] = true
			}
		}
		for _, n := range names {
			labels[n] = ls
		}
	}

	metricName := regexp.MustCompile(`\bmeshmark_[a-zA-Z0-9_]+`)
	grouping := regexp.MustCompile(`\bby \(([^)]*)\)`)
	selector := regexp.MustCompile(`(meshmark_[a-zA-Z0-9_]+)\{([^}]*)\}`)
	matcher := regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)`)
	for _, e := range exprs {
		used := metricName.FindAllString(e, -1)
		if len(used) == 0 {
			t.Errorf("expression uses no meshmark metric: %s", e)
		}
		for _, n := range used {
			if labels[n] == nil {
				t.Errorf("dashboard uses %s, which the registry does not export (in %s)", n, e)
			}
		}
		for _, m := range selector.FindAllStringSubmatch(e, -1) {
			for _, lm := range matcher.FindAllStringSubmatch(m[2], -1) {
				if ls := labels[m[1]]; ls != nil && !ls[lm[1]] {
					t.Errorf("%s has no label %q (in %s)", m[1], lm[1], e)
				}
			}
		}
		for _, g := range grouping.FindAllStringSubmatch(e, -1) {
			for _, l := range strings.Split(g[1], ",") {
				l = strings.TrimSpace(l)
				for _, n := range used {
					if ls := labels[n]; ls != nil && !ls[l] {
						t.Errorf("grouping by %q, but %s has no such label (in %s)", l, n, e)
					}
				}
			}
		}
	}
}

func TestServeListensOnLoopbackAndStops(t *testing.T) {
	if got := normalizeAddr(":9090"); got != "127.0.0.1:9090" {
		t.Errorf("normalizeAddr(:9090) = %s", got)
	}
	if got := normalizeAddr(""); got != DefaultAddr {
		t.Errorf("normalizeAddr('') = %s", got)
	}
	// Find a free loopback port, then serve on it until the context ends.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	r := New()
	go func() { done <- r.Serve(ctx, addr) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Serve never answered: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after cancel")
	}
	if _, err := http.Get("http://" + addr + "/metrics"); err == nil {
		t.Error("server still answering after Serve returned")
	}
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// A cluster's container readings carry the time their kubelet took them, which refreshes
// every few seconds: a round that repeats a reading keeps the cores worked out from the
// last two fresh ones, rather than reading as idle, and a fresh reading is divided by
// the time between the kubelet's readings, not between the rounds.
func TestContainerReadingsKeepTheirOwnTime(t *testing.T) {
	r := New()
	run := RunLabels{Mesh: "istio", Experiment: "latency", Repeat: 0}
	t0 := time.Now()
	container := func(cpu time.Duration, at time.Time) sampler.ProcSample {
		return sampler.ProcSample{Target: sampler.Target{Role: substrate.RoleSidecar, Pod: "productpage-v1-x", Node: "n1", Component: "istio-proxy"},
			User: cpu, RSSBytes: 40 << 20, At: at}
	}
	vcpu := func() (float64, bool) {
		t.Helper()
		fams, err := r.Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			if f.GetName() == NameThreads {
				t.Errorf("a container's readings export %s, which its kubelet does not count", NameThreads)
			}
			if f.GetName() == NameVCPU {
				return f.Metric[0].GetGauge().GetValue(), true
			}
		}
		return 0, false
	}
	// Rounds a second apart; the kubelet's readings 10 s apart, 2 s of CPU between them.
	r.ObserveRound(run, sampler.Round{Time: t0, Procs: []sampler.ProcSample{container(5*time.Second, t0)}})
	if _, ok := vcpu(); ok {
		t.Error("a vCPU gauge from a single reading")
	}
	r.ObserveRound(run, sampler.Round{Time: t0.Add(time.Second), Procs: []sampler.ProcSample{container(5*time.Second, t0)}})
	r.ObserveRound(run, sampler.Round{Time: t0.Add(10 * time.Second), Procs: []sampler.ProcSample{container(7*time.Second, t0.Add(10*time.Second))}})
	if v, ok := vcpu(); !ok || abs(v-0.2) > 1e-9 {
		t.Errorf("vCPU %v (exported %v), want 0.2: 2 s of CPU over the kubelet's 10 s", v, ok)
	}
	r.ObserveRound(run, sampler.Round{Time: t0.Add(11 * time.Second), Procs: []sampler.ProcSample{container(7*time.Second, t0.Add(10*time.Second))}})
	if v, ok := vcpu(); !ok || abs(v-0.2) > 1e-9 {
		t.Errorf("vCPU %v (exported %v) after a repeated reading, want 0.2 kept", v, ok)
	}
}
