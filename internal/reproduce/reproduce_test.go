package reproduce

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/analysis"
	_ "github.com/meshmark/meshmark/internal/mesh/meshes" // the profiles register which published meshes they stand for
	"github.com/meshmark/meshmark/internal/published"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/store"
)

// synthMesh is a synthetic mesh: its latency is log-normal around a known median (so that
// the ratio of two meshes' means and of their percentiles is the ratio of their
// medians), and its own components hold known memory.
type synthMesh struct {
	label, profile string
	options        map[string]string
	medianUs       float64
	proxies        int     // processes of the mesh (role sidecar)
	proxyMiB       float64 // memory of each
}

// experiment is a synthetic experiment: one step per rate, connection count or
// user count.
type experiment struct {
	name, kind, path string
	keepAlive        bool
	rates            []float64
	conns            []int
	users            []int
	repeats          int // default 3
}

// synthRun builds a run of three interleaved repeats (or the experiment's own) of
// every experiment on every mesh, stores it in a fresh SQLite store and loads it back, as `meshmark show` reads
// it. Closed-loop and user experiments serve a fixed 400 requests per second, so that
// every mesh's throughput is the same; open-loop ones serve their rate.
func synthRun(t *testing.T, studyFile string, meshes []synthMesh, exps []experiment) *results.Run {
	t.Helper()
	rng := rand.New(rand.NewPCG(3, 5))
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	run := &results.Run{ID: "20260301-120000-abcdef", Study: "synthetic", StudyFile: []byte(studyFile), Status: results.StatusComplete,
		Started: start, Seed: 7, Substrate: "local"}
	for _, m := range meshes {
		run.Meshes = append(run.Meshes, results.Mesh{Label: m.label, Profile: m.profile, Options: m.options})
	}
	const seconds = 3
	now := start
	most := 3
	for _, e := range exps {
		most = max(most, e.repeats)
	}
	for rep := 0; rep < most; rep++ {
		for _, e := range exps {
			if n := e.repeats; rep >= n && (n > 0 || rep >= 3) {
				continue
			}
			type step struct {
				rate         float64
				conns, users int
			}
			var steps []step
			for _, r := range e.rates {
				steps = append(steps, step{rate: r})
			}
			for _, c := range e.conns {
				steps = append(steps, step{conns: c})
			}
			for _, u := range e.users {
				steps = append(steps, step{users: u})
			}
			for i, st := range steps {
				for _, m := range meshes {
					now = now.Add(time.Second)
					tr := results.Trial{Repeat: rep, Mesh: m.label, Experiment: e.name, Kind: e.kind, Start: now, End: now.Add(seconds * time.Second),
						Params: results.TrialParams{RequestedRate: st.rate, Connections: st.conns, Users: st.users, Step: i, KeepAlive: e.keepAlive, Path: e.path}}
					served := st.rate
					if served == 0 {
						served = 400
					}
					res := &tr.Result
					res.Latency = results.NewLatencyHistogram()
					for s := 0; s < seconds; s++ {
						iv := results.Interval{Start: now.Add(time.Duration(s) * time.Second), Duration: time.Second, Histogram: results.NewLatencyHistogram()}
						for range int(served) {
							v := int64(m.medianUs * math.Exp(0.3*rng.NormFloat64()))
							_ = iv.Histogram.RecordValue(v)
							_ = res.Latency.RecordValue(v)
						}
						iv.Count, iv.AchievedRate = int64(served), served
						res.Intervals = append(res.Intervals, iv)
						res.Requests += int64(served)
					}
					for p := range m.proxies {
						for s := 0; s <= seconds; s++ {
							res.Resources = append(res.Resources, results.ResourceSample{Component: "proxy", Role: "sidecar", Pod: fmt.Sprintf("pod-%d", p),
								T: now.Add(time.Duration(s) * time.Second), CPUUserSeconds: 0.05 * float64(s),
								RSSBytes: int64(m.proxyMiB * (1 + 0.005*rng.NormFloat64()) * (1 << 20))})
						}
					}
					run.Trials = append(run.Trials, tr)
					now = tr.End
				}
			}
		}
	}
	run.Ended = now
	return throughStore(t, run)
}

func throughStore(t *testing.T, run *results.Run) *results.Run {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "results.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	trials := run.Trials
	stored := *run
	stored.Trials = nil
	if err := st.CreateRun(ctx, &stored); err != nil {
		t.Fatal(err)
	}
	for i := range trials {
		if err := st.AddTrial(ctx, stored.ID, &trials[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.FinishRun(ctx, stored.ID, results.StatusComplete, ""); err != nil {
		t.Fatal(err)
	}
	back, err := st.LoadRun(ctx, stored.ID)
	if err != nil {
		t.Fatal(err)
	}
	return back
}

func build(t *testing.T, run *results.Run) *Reproduction {
	t.Helper()
	rep := analysis.Analyze(run, analysis.Options{Seed: 1}, nil)
	r := Build(run, rep)
	if r == nil {
		t.Fatalf("no reproduction of a run whose study declares %q", Declared(run))
	}
	return r
}

// marks are the evaluations by claim id; a claim tested at several points has one
// mark per point, in order.
func marks(r *Reproduction) map[string][]Evaluation {
	out := map[string][]Evaluation{}
	for _, e := range r.Claims {
		out[e.Claim] = append(out[e.Claim], e)
	}
	return out
}

func wantMarks(t *testing.T, r *Reproduction, want map[string]Mark) {
	t.Helper()
	got := marks(r)
	for id, m := range want {
		es := got[id]
		if len(es) == 0 {
			t.Errorf("%s not evaluated", id)
		}
		for _, e := range es {
			if e.Mark != m {
				t.Errorf("%s at %s: %s (%s; ours %s), want %s", id, e.Point, e.Mark, e.Reason, e.Ours, m)
			}
		}
	}
}

const studyOf = "apiVersion: meshmark.dev/v1alpha1\nkind: Study\nspec:\n  reproduces: %s\n"

// S2's average latencies: Istio 7.2 times the baseline's (482 against 67 ms), Linkerd
// below Istio. A run with those ratios agrees on each; one where Istio adds half
// disagrees on the ratio but still agrees on both orderings.
func TestS2MeanLatencyClaims(t *testing.T) {
	exps := []experiment{{name: "rpm-600", kind: results.KindFixedRate, rates: []float64{10}}, {name: "rpm-2400", kind: results.KindFixedRate, rates: []float64{40}}}
	for _, c := range []struct {
		istio float64
		ratio Mark
	}{{7200, Agrees}, {1500, Disagrees}} {
		run := synthRun(t, fmt.Sprintf(studyOf, "S2"), []synthMesh{
			{label: "baseline", profile: "none", medianUs: 1000},
			{label: "istio-like", profile: "envoy-sidecar", options: map[string]string{"mtls": "strict"}, medianUs: c.istio},
			{label: "linkerd", profile: "linkerd", medianUs: 1200},
			{label: "istio-ambient", profile: "istio-ambient", medianUs: 1100},
		}, exps)
		r := build(t, run)
		wantMarks(t, r, map[string]Mark{"S2/mean-2400/baseline<istio": Agrees, "S2/mean-2400/istio÷baseline": c.ratio, "S2/mean-2400/linkerd<istio": Agrees})
		// Tested at 2400 rpm (40 req/s) only.
		for _, e := range r.Claims {
			if !strings.Contains(e.Point, "rpm-2400") {
				t.Errorf("%s tested at %q", e.Claim, e.Point)
			}
		}
		if strings.Join(r.Extra, ",") != "istio-ambient" {
			t.Errorf("meshes not in S2: %v", r.Extra)
		}
		if len(r.Tables) != 1 || len(r.Tables[0].Rows) != 2 || r.Tables[0].Bars == nil {
			t.Fatalf("S2's table: %+v", r.Tables)
		}
		// The table's Istio average at 2400 rpm is the ratio to the baseline's.
		row := r.Tables[0].Rows[1]
		var x float64
		if _, err := fmt.Sscanf(row[3][strings.Index(row[3], "×"):], "×%g)", &x); err != nil || !strings.HasPrefix(row[0], "2400 rpm") || math.Abs(x/(c.istio/1000)-1) > 0.05 {
			t.Errorf("S2 row %q, want Istio at ×%.1f the baseline (within 5%%: %d requests per mesh)", row, c.istio/1000, 3*3*40)
		}
	}
}

// S5 with its Cilium stood in for by the per-node Envoy: the Cilium claims are not
// comparable (with the run's figure beside them), the others are tested at each
// connection count on both paths; Linkerd is missing, so its claims are not measured.
func TestS5StandInAndMissingRole(t *testing.T) {
	exps := []experiment{
		{name: "internal", kind: results.KindConnections, path: "internal", conns: []int{32, 64}},
		{name: "external", kind: results.KindConnections, path: "ingress", conns: []int{32, 64}},
		{name: "internal-keepalive", kind: results.KindConnections, path: "internal", keepAlive: true, conns: []int{64}},
	}
	run := synthRun(t, fmt.Sprintf(studyOf, "S5"), []synthMesh{
		{label: "baseline", profile: "none", medianUs: 1000},
		{label: "istio-like", profile: "envoy-sidecar", options: map[string]string{"mtls": "strict"}, medianUs: 1300},
		{label: "cilium-like", profile: "cilium-envoy", medianUs: 1250},
	}, exps)
	r := build(t, run)
	wantMarks(t, r, map[string]Mark{
		"S5/internal/istio÷baseline": Agrees, "S5/external/istio÷baseline": Agrees,
		"S5/internal/cilium÷baseline": NotComparable, "S5/external/cilium÷baseline": NotComparable,
		"S5/internal/linkerd÷baseline": NotMeasured, "S5/internal/linkerd<istio": NotMeasured,
	})
	got := marks(r)
	if n := len(got["S5/internal/istio÷baseline"]); n != 2 {
		t.Errorf("istio÷baseline tested at %d internal points, want 32 and 64 connections (not the keep-alive one)", n)
	}
	for _, e := range got["S5/internal/cilium÷baseline"] {
		if !strings.Contains(e.Reason, "eBPF") || !strings.Contains(e.Ours, "cilium-like ÷ baseline 1.2") {
			t.Errorf("cilium stand-in: reason %q, ours %q", e.Reason, e.Ours)
		}
	}
	if len(r.Tables) != 2 || !strings.Contains(r.Tables[1].Title, "external") || len(r.Tables[0].Rows) != 2 {
		t.Errorf("S5 tables: %+v", r.Tables)
	}
}

// S3: throughput within 3% between the mesh and no mesh, and between Istio through
// its gateway and without it, with the same users on both paths.
func TestS3ThroughputAcrossPaths(t *testing.T) {
	users := func(name, path string, n ...int) experiment {
		return experiment{name: name, kind: results.KindUsers, path: path, keepAlive: true, users: n}
	}
	run := synthRun(t, fmt.Sprintf(studyOf, "S3"), []synthMesh{
		{label: "mesh-off", profile: "none", medianUs: 2000},
		{label: "istio-like", profile: "envoy-sidecar", options: map[string]string{"mtls": "disabled"}, medianUs: 2600},
	}, []experiment{users("users-100-ingress", "ingress", 100), users("users-100-direct", "internal", 100), users("users-400-ingress", "ingress", 400)})
	r := build(t, run)
	wantMarks(t, r, map[string]Mark{"S3/throughput/istio~off/ingress": Agrees, "S3/throughput/istio~off/direct": Agrees, "S3/throughput/gateway~direct": Agrees})
	got := marks(r)
	if n := len(got["S3/throughput/istio~off/ingress"]); n != 2 {
		t.Errorf("ingress claim tested at %d points, want 100 and 400 users", n)
	}
	if es := got["S3/throughput/gateway~direct"]; len(es) != 1 || !strings.Contains(es[0].Point, "users-100-direct") || !strings.Contains(es[0].Point, "users-100-ingress") {
		t.Errorf("gateway against direct: %+v", es)
	}
	// The regression table has one line per configuration: mesh × path.
	if len(r.Tables) != 2 || len(r.Tables[1].Rows) != 4 {
		t.Fatalf("S3 tables: %+v", r.Tables)
	}
}

// S4's memory: Traefik < Linkerd < Istio in the mesh's own memory, from the soak;
// the ratio of totals is not comparable, but shown.
func TestS4MemoryFromSoak(t *testing.T) {
	run := synthRun(t, fmt.Sprintf(studyOf, "S4"), []synthMesh{
		{label: "baseline", profile: "none", medianUs: 500},
		{label: "istio-like", profile: "envoy-sidecar", medianUs: 900, proxies: 3, proxyMiB: 60},
		{label: "linkerd", profile: "linkerd", medianUs: 700, proxies: 3, proxyMiB: 20},
		{label: "traefik-like", profile: "traefik-mesh", medianUs: 600, proxies: 1, proxyMiB: 40},
	}, []experiment{{name: "steps", kind: results.KindSteps, rates: []float64{50, 100, 150}}, {name: "resources", kind: results.KindSoak, rates: []float64{100}}})
	r := build(t, run)
	wantMarks(t, r, map[string]Mark{
		"S4/memory/traefik<linkerd": Agrees, "S4/memory/linkerd<istio": Agrees, "S4/memory/istio÷linkerd": NotComparable,
		"S4/p95-middle/traefik<linkerd": Agrees, "S4/p95-middle/linkerd<istio": Agrees,
	})
	for _, e := range marks(r)["S4/memory/istio÷linkerd"] {
		if !strings.Contains(e.Ours, "istio-like ÷ linkerd 3.0") {
			t.Errorf("memory ratio shown as %q, want 3.0 (180 against 60 MiB)", e.Ours)
		}
	}
	for _, e := range marks(r)["S4/p95-middle/traefik<linkerd"] {
		if !strings.Contains(e.Point, "100 rps") {
			t.Errorf("middle step: %q, want 100 rps of 50–150", e.Point)
		}
	}
	var proxies *Table
	for i := range r.Tables {
		if strings.HasPrefix(r.Tables[i].Title, "CPU and RAM per proxy") {
			proxies = &r.Tables[i]
		}
	}
	if proxies == nil {
		t.Fatal("no per-proxy table")
	}
	found := false
	for _, row := range proxies.Rows {
		if !strings.HasPrefix(row[0], "istio-like") || row[1] != "proxy" {
			continue
		}
		found = true
		var each, total float64
		fmt.Sscan(row[6], &each)
		fmt.Sscan(row[8], &total)
		if row[3] != "3" || math.Abs(each-60) > 1 || math.Abs(total-180) > 2 {
			t.Errorf("istio-like proxies %q, want 3 of 60 MiB, 180 MiB in all (±1%% of noise)", row)
		}
	}
	if !found {
		t.Errorf("no row of istio-like's proxies: %q", proxies.Rows)
	}
}

// S1's App Mesh is not available: every claim is not comparable, but the tables and
// the verdict table are the run's, with the better mesh judged by its intervals.
func TestS1NotComparableButTabled(t *testing.T) {
	run := synthRun(t, fmt.Sprintf(studyOf, "S1"), []synthMesh{
		{label: "baseline", profile: "none", medianUs: 1000},
		{label: "istio-like", profile: "envoy-sidecar", options: map[string]string{"mtls": "strict"}, medianUs: 2000},
		{label: "appmesh-like", profile: "envoy-sidecar", options: map[string]string{"mtls": "disabled"}, medianUs: 1500},
	}, []experiment{{name: "capacity", kind: results.KindCapacity, conns: []int{32}}, {name: "latency", kind: results.KindFixedRate, rates: []float64{300}}})
	r := build(t, run)
	for _, e := range r.Claims {
		if e.Mark != NotComparable || !strings.Contains(e.Reason, "App Mesh is not available") || e.Ours == "" {
			t.Errorf("%s: %s (%s), ours %q", e.Claim, e.Mark, e.Reason, e.Ours)
		}
	}
	var verdicts *Table
	for i := range r.Tables {
		if strings.HasPrefix(r.Tables[i].Title, "Verdict table") {
			verdicts = &r.Tables[i]
		}
	}
	if verdicts == nil {
		t.Fatalf("no verdict table: %+v", r.Tables)
	}
	better := map[string]string{}
	for _, row := range verdicts.Rows {
		better[row[0]+"|"+row[1]] = row[len(row)-1]
	}
	if b := better["latency at 75% (latency 300 rps)|p50"]; !strings.HasPrefix(b, "appmesh-like (istio-like +") {
		t.Errorf("p50 at 75%%: better %q, want appmesh-like", b)
	}
	// Both serve the same closed-loop rate here: equal within the margin.
	if b := better["capacity (capacity 32 conns)|throughput"]; !strings.HasPrefix(b, "equal") {
		t.Errorf("capacity: better %q, want equal", b)
	}
	var text bytes.Buffer
	if err := r.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "appmesh-like for AWS App Mesh is not comparable") {
		t.Errorf("terminal does not say the stand-in is not comparable:\n%s", text.String())
	}
}

// TestMarkRules pins the marking rules on outcomes whose verdicts are given: they are
// the design (docs/reproductions.md), each branch once.
func TestMarkRules(t *testing.T) {
	est := func(v, lo, hi float64) analysis.Estimate { return analysis.Estimate{Value: v, Lo: lo, Hi: hi} }
	for _, c := range []struct {
		o    outcome
		want Mark
	}{
		{outcome{verdict: analysis.Worse, va: 1, vb: 2, ratio: est(2, 1.8, 2.2)}, Agrees},
		{outcome{verdict: analysis.Better, va: 2, vb: 1, ratio: est(0.5, 0.4, 0.6)}, Disagrees},
		{outcome{verdict: analysis.Equal, va: 1, vb: 1.01, margin: 2, ratio: est(1.01, 0.99, 1.015)}, Disagrees},
		{outcome{verdict: analysis.Inconclusive, va: 1, vb: 1.05, margin: 2, ratio: est(1.05, 0.97, 1.13)}, NotResolved},
		{outcome{verdict: "saturated", va: 1, vb: 3, ratio: est(3, 2, 4)}, NotResolved},
	} {
		if got, why := orderMark(c.o, "a", "b"); got != c.want {
			t.Errorf("order with %s %v: %s (%s), want %s", c.o.verdict, c.o.ratio, got, why, c.want)
		}
	}
	cl := published.Claim{Kind: published.Ratio, Lo: 1.5, Hi: 1.5, Band: published.Band{Factor: 1.25}} // band 1.2–1.875
	for _, c := range []struct {
		r    analysis.Estimate
		want Mark
	}{
		{est(1.5, 1.3, 1.7), Agrees},
		{est(1.1, 1.0, 1.19), Disagrees},
		{est(2.2, 1.9, 2.5), Disagrees},
		{est(1.25, 1.1, 1.4), NotResolved},
		{est(1.5, math.NaN(), math.NaN()), NotResolved},
	} {
		if got, why := ratioMark(outcome{verdict: analysis.Worse, ratio: c.r}, cl); got != c.want {
			t.Errorf("ratio %v in 1.2–1.875: %s (%s), want %s", c.r, got, why, c.want)
		}
	}
}

func TestDeclared(t *testing.T) {
	for _, c := range []struct{ file, want string }{
		{fmt.Sprintf(studyOf, "S3"), "S3"},
		{"apiVersion: meshmark.dev/v1alpha1\nspec: {}\n", ""},
		{"not: [yaml", ""},
		{"", ""},
	} {
		if got := Declared(&results.Run{StudyFile: []byte(c.file)}); got != c.want {
			t.Errorf("Declared(%q) = %q, want %q", c.file, got, c.want)
		}
	}
	if Build(&results.Run{StudyFile: []byte(fmt.Sprintf(studyOf, "S9"))}, &analysis.Report{}) != nil {
		t.Error("a reproduction of an unknown study")
	}
}

// A latency claim at a point where the load generator fell behind is not resolved,
// however clear the numbers: they are not the mesh's latency.
func TestGeneratorBehindIsNotResolved(t *testing.T) {
	run := synthRun(t, fmt.Sprintf(studyOf, "S2"), []synthMesh{
		{label: "baseline", profile: "none", medianUs: 1000},
		{label: "istio-like", profile: "envoy-sidecar", medianUs: 7200},
		{label: "linkerd", profile: "linkerd", medianUs: 1200},
	}, []experiment{{name: "rpm-2400", kind: results.KindFixedRate, rates: []float64{40}}})
	for i := range run.Trials {
		if run.Trials[i].Mesh == "istio-like" && run.Trials[i].Repeat == 1 {
			run.Trials[i].Result.Flags = append(run.Trials[i].Result.Flags, results.FlagGeneratorBehind)
		}
	}
	r := build(t, run)
	wantMarks(t, r, map[string]Mark{"S2/mean-2400/baseline<istio": NotResolved, "S2/mean-2400/istio÷baseline": NotResolved, "S2/mean-2400/linkerd<istio": NotResolved})
	for _, e := range r.Claims {
		if !strings.Contains(e.Reason, "fell behind in 1 of 3 trials of istio-like") || e.Ours == "" {
			t.Errorf("%s: reason %q, ours %q", e.Claim, e.Reason, e.Ours)
		}
	}
}

// A comparison with no interval (one repeat, as a soak run once per mesh) prints as
// the analysis prints it, not as "[+NaN, +NaN]".
func TestPctTextWithoutInterval(t *testing.T) {
	got := pctText(analysis.Estimate{Value: 1.4, Lo: math.NaN(), Hi: math.NaN()})
	if got != "+40.0% [-, -]" {
		t.Errorf("pctText without an interval = %q", got)
	}
	if got := pctText(analysis.Estimate{Value: 1.4, Lo: 1.1, Hi: 1.8}); got != "+40.0% [+10.0, +80.0]" {
		t.Errorf("pctText = %q", got)
	}
}

// Many short latency blocks are summarised in S1's table, not listed one by one.
func TestS1ManyBlocksSummarised(t *testing.T) {
	run := synthRun(t, fmt.Sprintf(studyOf, "S1"), []synthMesh{
		{label: "baseline", profile: "none", medianUs: 1000},
		{label: "istio-like", profile: "envoy-sidecar", options: map[string]string{"mtls": "strict"}, medianUs: 2000},
	}, []experiment{{name: "capacity", kind: results.KindCapacity, conns: []int{32}, repeats: 2}, {name: "latency", kind: results.KindFixedRate, rates: []float64{300}, repeats: 12}})
	r := build(t, run)
	for _, tb := range r.Tables {
		if !strings.HasPrefix(tb.Title, "Latency at a fixed rate") {
			continue
		}
		for _, row := range tb.Rows {
			if cell := row[7]; !strings.HasPrefix(cell, "12 blocks: ") || !strings.Contains(cell, "median") {
				t.Errorf("%s: p99 per repeat %q, want 12 blocks summarised", row[0], cell)
			}
		}
		return
	}
	t.Fatal("no latency table")
}
