package runner

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/load"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/study"
	"github.com/meshmark/meshmark/internal/topology"
)

const translationStudy = `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: runner-one-translation}
spec:
  substrate:
    local: {nodes: 1, loadgenNode: 0}
  workload: {graph: emojivoto}
  meshes:
    - {name: none, profile: none}
  experiments:
    - {name: capacity, kind: capacity, connections: [4, 8], duration: 2s, warmup: 500ms}
    - {name: latency, kind: fixed-rate, rate: 200, connections: 4, duration: 3s, warmup: 1s, arrival: poisson, protocol: h2c, streams: 2}
    - {name: steps, kind: steps, from: 100, to: 300, step: 100, each: 1s, warmup: 500ms}
    - {name: conns, kind: connections, connections: [2, 6], rate: 150, duration: 2s, warmup: 500ms}
    - {name: closed, kind: connections, connections: [3], requests: 500, duration: 5s, warmup: 500ms}
  repeats: 1
  seed: 42
`

// An experiment becomes load once, for every platform: walking the same trials, the
// local testbed and a platform that brings only its target, as a cluster's does
// (kubeplatform's TestClusterLoadGoesToTheEntryService), send the same specs (the same
// model, timing, protocol and caps) and differ only in where the requests go and
// whether the generator may spin. A connections experiment with a rate caps the
// requests in flight at the connection count on both. The platforms' measuring is
// stood in for by a recorder that returns what a run at the requested rate would: only
// the translation is tested here, and TestConnectionsWithRateCapsInFlight measures.
func TestOneTranslationForBothPlatforms(t *testing.T) {
	r := &runner{study: parseStudy(t, translationStudy), capacities: map[string]map[string][]float64{}}
	if err := r.prepare(); err != nil {
		t.Fatal(err)
	}
	local := &deployment{profile: plainMesh{}, entry: r.graph.Entrypoint(), client: topology.Pod{Name: "client-0"}}
	type run struct {
		exp    string
		params results.TrialParams
		spec   load.Spec
	}
	walk := func(platform func(t *study.Trial, record MeasureLoad) Load) []run {
		var runs []run
		for i := range r.study.Spec.Experiments {
			e := &r.study.Spec.Experiments[i]
			tr := &study.Trial{Experiment: e, Mesh: &r.study.Spec.Meshes[0], Seq: i}
			record := func(spec load.Spec, params results.TrialParams) (*load.Result, error) {
				runs = append(runs, run{e.Name, params, spec})
				rate := params.RequestedRate
				if rate == 0 {
					rate = 1000
				}
				return &load.Result{AchievedRate: rate, Completed: 1}, nil
			}
			if err := r.runLoad(tr, platform(tr, record)); err != nil {
				t.Fatalf("%s: %v", e.Name, err)
			}
		}
		return runs
	}
	localRuns := walk(func(tr *study.Trial, record MeasureLoad) Load {
		p := r.localLoad(context.Background(), local, tr)
		p.Measure = record
		return p
	})
	r.capacities = map[string]map[string][]float64{}
	clusterRuns := walk(func(tr *study.Trial, record MeasureLoad) Load {
		return Load{Target: func(_ *study.Experiment, path string) string {
			return "http://web.mm-run-none.svc.cluster.local:8080" + path
		}, Measure: record}
	})
	if len(localRuns) != len(clusterRuns) || len(localRuns) < 9 {
		t.Fatalf("%d load runs locally, %d on a cluster; want the same, at least 9 (capacity 2 and its search, latency 1, steps 3, conns 2, closed 1)", len(localRuns), len(clusterRuns))
	}
	spin := !ownCPUs(placement(r.study.Spec.Substrate.Local))
	byExp := map[string][]load.Spec{}
	for i := range localRuns {
		lr, cr := localRuns[i], clusterRuns[i]
		l, c := lr.spec, cr.spec
		if lr.exp != cr.exp || lr.params.Connections != cr.params.Connections || lr.params.RequestedRate != cr.params.RequestedRate {
			t.Errorf("run %d: locally %s %+v, on a cluster %s %+v", i, lr.exp, lr.params, cr.exp, cr.params)
		}
		byExp[lr.exp] = append(byExp[lr.exp], l)
		if !strings.HasPrefix(l.Request.URL, "http://web:8080/") || !strings.HasPrefix(c.Request.URL, "http://web.mm-run-none.svc.cluster.local:8080/") {
			t.Errorf("run %d: local URL %s, cluster URL %s", i, l.Request.URL, c.Request.URL)
		}
		want := load.ProtocolHTTP1
		if lr.exp == "latency" {
			want = load.ProtocolH2C
		}
		if l.Protocol != want || l.Request.Method != "GET" || !strings.HasSuffix(l.Request.URL, r.graph.Entrypoint().Path) {
			t.Errorf("run %d (%s): %s %s %s: want %s GET of the entry's path", i, lr.exp, l.Protocol, l.Request.Method, l.Request.URL, want)
		}
		if l.Open != nil && (l.Open.SpinWindow < 0) != spin {
			t.Errorf("run %d: local spin window %s with a placement that gives the generator its own CPUs: %v", i, l.Open.SpinWindow, !spin)
		}
		if c.Open != nil && c.Open.SpinWindow != 0 {
			t.Errorf("run %d: a cluster's generator is kept from spinning (%s)", i, c.Open.SpinWindow)
		}
		// Where they go and the spinning apart, the two are the same load.
		l.Request.URL, c.Request.URL = "", ""
		if l.Open != nil && c.Open != nil {
			l.Open.SpinWindow, c.Open.SpinWindow = 0, 0
		}
		if a, b := jsonOf(t, l), jsonOf(t, c); a != b {
			t.Errorf("run %d differs:\n local   %s\n cluster %s", i, a, b)
		}
	}
	conns := byExp["conns"]
	if len(conns) != 2 {
		t.Fatalf("%d runs of conns, want 2", len(conns))
	}
	for i, want := range []int{2, 6} { // at 150 req/s
		if s := conns[i]; s.Open == nil || s.Open.Schedule.Rate != 150 || s.Open.Connections != want || s.Open.MaxInFlight != want {
			t.Errorf("connections %d with a rate: %s, want %d connections capping the requests in flight", want, jsonOf(t, s), want)
		}
	}
	if s := byExp["latency"]; len(s) != 1 || s[0].Open == nil || s[0].Open.MaxInFlight != 0 || s[0].Open.Connections != 4 || s[0].Open.Schedule.Arrival != load.Poisson ||
		s[0].Open.Schedule.Seed != 42 || s[0].Duration != 4e9 || s[0].Warmup != 1e9 || s[0].Streams != 2 {
		t.Errorf("fixed-rate with 4 connections: %v: want 4 opened up front, no cap, Poisson seeded 42, 1 s warm-up in 4 s, 2 streams", s)
	}
	if s := byExp["closed"]; len(s) != 1 || s[0].Closed == nil || s[0].Closed.Connections != 3 || s[0].Count != 500 {
		t.Errorf("closed connections experiment: %v", s)
	}
	if s := byExp["steps"]; len(s) != 3 || s[0].Warmup != 5e8 || s[1].Warmup != 0 || s[2].Open.Schedule.Rate != 300 || s[2].Duration != 1e9 {
		t.Errorf("steps: %v: want 100, 200, 300 req/s for 1 s each, the warm-up before the first", s)
	}
}

func jsonOf(t *testing.T, s load.Spec) string {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A connections experiment with a rate measures what so many connections carry at that
// rate: the load generator keeps at most that many requests in flight, on the local
// testbed as on a cluster (TestOneTranslationForBothPlatforms, and loadgen's
// TestInFlightCapThroughGenerators for the generator service). Against a service that
// holds every request 20 ms, 200 req/s would keep about 4 in flight; capped at 2, the
// stored trial shows at most 2 and sends that waited, flagged as the target's
// saturation, while a fixed-rate experiment that merely opens 2 connections up front
// goes past them.
func TestConnectionsWithRateCapsInFlight(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	graph := filepath.Join(dir, "slow.yaml")
	if err := os.WriteFile(graph, []byte("name: slow\nservices:\n  - {name: front, isEntrypoint: true, script: [sleep: 20ms]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run, _ := runStudy(t, parseStudy(t, `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: runner-connections-cap}
spec:
  substrate:
    local: {nodes: 1, loadgenNode: 0}
  workload: {graph: `+graph+`}
  meshes:
    - {name: none, profile: none}
  experiments:
    - {name: conns, kind: connections, connections: [2], rate: 200, duration: 3s, warmup: 500ms}
    - {name: latency, kind: fixed-rate, connections: 2, rate: 200, duration: 3s, warmup: 500ms}
  repeats: 1
`))
	peak := map[string]results.GeneratorHealth{}
	trial := map[string]results.Trial{}
	for _, tr := range run.Trials {
		peak[tr.Experiment], trial[tr.Experiment] = tr.Result.Generator, tr
	}
	t.Logf("capped: %+v, flags %v, %s; uncapped: %+v", peak["conns"], trial["conns"].Result.Flags, trial["conns"].Result.Saturation, peak["latency"])
	if g := peak["conns"]; g.PeakInFlight > 2 || g.PeakInFlight == 0 || g.LateSends == 0 {
		t.Errorf("connections [2] at 200 req/s: peak %d in flight, %d late sends; want at most 2 in flight and late sends", g.PeakInFlight, g.LateSends)
	}
	// Two connections to a 20 ms service carry at most 100 req/s: the other 100 a second
	// wait for one, which is the target's saturation at that concurrency, not the
	// generator falling behind.
	if c := trial["conns"].Result; !c.HasFlag(results.FlagTargetSaturated) || c.HasFlag(results.FlagGeneratorBehind) ||
		c.Saturation == nil || c.Saturation.WaitingLow < 10 || c.Saturation.BacklogTo <= c.Saturation.BacklogFrom {
		t.Errorf("connections [2] at 200 req/s: flags %v, evidence %s; want the target saturated by the sends waiting for a connection", c.Flags, c.Saturation)
	}
	if g := peak["latency"]; g.PeakInFlight <= 2 {
		t.Errorf("fixed-rate with 2 connections at 200 req/s: peak %d in flight; want more than 2 against a 20 ms service, or the capped run proves nothing", g.PeakInFlight)
	}
}

// Locust-like users are common random numbers within a repeat: every mesh and every
// experiment of a repeat meets users who spawn, choose and wait alike, so a difference
// in throughput between them is the system's, while each repeat draws anew. The seed
// of the generators' users is read from the specs the runner sends.
func TestUsersDrawAlikeWithinARepeat(t *testing.T) {
	r := &runner{study: parseStudy(t, `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: runner-users-seed}
spec:
  substrate:
    local: {nodes: 1, loadgenNode: 0}
  workload: {graph: bookinfo, entrypoint: /productpage}
  meshes:
    - {name: off, profile: none}
    - {name: on, profile: envoy-sidecar, options: {mtls: disabled}}
  experiments:
    - {name: users-10, kind: users, users: 10, spawnRate: 5, thinkTime: 1s-2s, tasks: [{name: main, path: /productpage}], duration: 2s, warmup: 1s}
    - {name: users-20, kind: users, users: 20, spawnRate: 5, thinkTime: 1s-2s, tasks: [{name: main, path: /productpage}], duration: 2s, warmup: 1s}
  repeats: 3
  order: interleaved
  seed: 7
`), capacities: map[string]map[string][]float64{}}
	if err := r.prepare(); err != nil {
		t.Fatal(err)
	}
	local := &deployment{profile: plainMesh{}, entry: r.graph.Entrypoint(), client: topology.Pod{Name: "client-0"}}
	seeds := map[int]map[uint64]bool{} // repeat → the users' seeds its trials sent
	plan := r.study.Plan()
	for i := range plan {
		tr := &plan[i]
		p := r.localLoad(context.Background(), local, tr)
		p.Measure = func(spec load.Spec, _ results.TrialParams) (*load.Result, error) {
			if spec.Users == nil {
				t.Fatalf("%s/%s: no users in %s", tr.Mesh.Name, tr.Experiment.Name, jsonOf(t, spec))
			}
			if seeds[tr.Repeat] == nil {
				seeds[tr.Repeat] = map[uint64]bool{}
			}
			seeds[tr.Repeat][spec.Users.Seed] = true
			return &load.Result{AchievedRate: 5, Completed: 10}, nil
		}
		if err := r.runLoad(tr, p); err != nil {
			t.Fatalf("%s/%s: %v", tr.Mesh.Name, tr.Experiment.Name, err)
		}
	}
	if len(plan) != 12 || len(seeds) != 3 {
		t.Fatalf("%d trials over %d repeats, want 12 over 3", len(plan), len(seeds))
	}
	all := map[uint64]bool{}
	for repeat, s := range seeds {
		if len(s) != 1 {
			t.Errorf("repeat %d: its meshes and experiments drew users from seeds %v, want one", repeat, s)
		}
		for seed := range s {
			if all[seed] {
				t.Errorf("repeat %d drew the users of another repeat (seed %d)", repeat, seed)
			}
			all[seed] = true
		}
	}
}

// The engine's interval cuts a short window into enough pieces for the saturation rules
// to read a trend, and ends one exactly as the warm-up ends, which the rules compare the
// backlog with.
func TestLoadIntervalFitsWindowAndWarmup(t *testing.T) {
	for _, c := range []struct {
		window, warmup, want time.Duration
	}{
		{30 * time.Second, 10 * time.Second, time.Second},
		{5 * time.Second, 0, time.Second},
		{time.Second, 0, 200 * time.Millisecond},
		{1200 * time.Millisecond, 200 * time.Millisecond, 200 * time.Millisecond},
		{time.Second, 500 * time.Millisecond, 500 * time.Millisecond / 3},
		{3 * time.Second, 500 * time.Millisecond, 500 * time.Millisecond},
		{10 * time.Second, 1500 * time.Millisecond, 750 * time.Millisecond},
		{300 * time.Millisecond, 0, 100 * time.Millisecond},
		{time.Second, 50 * time.Millisecond, 200 * time.Millisecond}, // a warm-up too short to align with
	} {
		got := loadInterval(c.window, c.warmup)
		if got != c.want {
			t.Errorf("window %v, warm-up %v: interval %v, want %v", c.window, c.warmup, got, c.want)
		}
		if rem := c.warmup % got; c.warmup >= 100*time.Millisecond && rem > got/100 && got-rem > got/100 {
			t.Errorf("window %v, warm-up %v: interval %v does not end at the warm-up's end", c.window, c.warmup, got)
		}
	}
}
