package report

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/store"
)

// throughStore stores run in a fresh SQLite results database and loads it back, as
// `meshmark report` and `show` read it.
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
		tr := trials[i]
		if err := st.AddTrial(ctx, stored.ID, &tr); err != nil {
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

// answerTable returns the Markdown answer table of a point: header, then one row per
// mesh, keyed by the mesh column's first word.
func answerTable(t *testing.T, md []byte, label string) (header []string, rows map[string][]string) {
	t.Helper()
	ts := mdTables(t, md)[label]
	if len(ts) != 1 {
		t.Fatalf("%d tables under the heading %q, want the answer's one:\n%s", len(ts), label, md)
	}
	rows = map[string][]string{}
	for _, r := range ts[0][1:] {
		rows[strings.Fields(r[0])[0]] = r
	}
	return ts[0][0], rows
}

// Columns of the answer table.
const (
	colMesh = iota
	colP50
	colP99
	colCPU
	colMemory
	colErrors
	colSecurity
	colVerdict
)

// sevenMeshes are a baseline and six meshes whose medians are known: two of them
// (linkerd, ambient) have the same distribution, so no run can order them, and every
// other neighbour differs by at least a third.
var sevenMeshes = []synthMesh{
	{label: "baseline", profile: "none", medianUs: 450, sigma: 0.35, capacityRPS: 5000},
	{label: "traefik-mesh", profile: "traefik-mesh", medianUs: 600, sigma: 0.35, capacityRPS: 5000, proxies: true},
	{label: "linkerd", profile: "linkerd", medianUs: 800, sigma: 0.35, capacityRPS: 5000, proxies: true},
	{label: "ambient", profile: "istio-ambient", medianUs: 800, sigma: 0.35, capacityRPS: 5000, proxies: true},
	{label: "cilium-envoy", profile: "cilium-envoy", medianUs: 1100, sigma: 0.35, capacityRPS: 5000, proxies: true},
	{label: "envoy-sidecar", profile: "envoy-sidecar", medianUs: 1500, sigma: 0.35, capacityRPS: 5000, proxies: true},
	{label: "envoy-sidecar-mtls", profile: "envoy-sidecar", options: map[string]string{"mtls": "strict"}, medianUs: 2200, sigma: 0.35,
		capacityRPS: 5000, proxies: true},
}

// A seven-mesh run's answer ranks the six meshes among themselves, fastest first, on
// comparisons with intervals: every step between meshes a third apart is significant,
// the step between the two meshes of one distribution is not, and the ranking says so.
func TestAnswerRanksSevenMeshes(t *testing.T) {
	run := throughStore(t, syntheticRunOf(t, sevenMeshes, false))
	an := analysis.Analyze(run, analysis.Options{Seed: 42}, nil)
	s := Summarize(run, an, Options{})
	if len(s.Answers) != 1 || s.Answers[0].Label != "fixed 600 rps" || len(s.Answers[0].Rows) != 7 {
		t.Fatalf("answers = %+v, want one point with seven rows", s.Answers)
	}
	p := s.Answers[0]
	if len(p.Rankings) != 2 {
		t.Fatalf("rankings = %+v, want p50 and p99", p.Rankings)
	}
	for _, rk := range p.Rankings {
		want := []string{"traefik-mesh", "linkerd|ambient", "linkerd|ambient", "cilium-envoy", "envoy-sidecar", "envoy-sidecar-mtls"}
		if len(rk.Order) != len(want) {
			t.Fatalf("%s ranking %v: want the six meshes but the baseline", rk.Metric, rk.Order)
		}
		for i, w := range want {
			if !slices.Contains(strings.Split(w, "|"), rk.Order[i]) {
				t.Errorf("%s ranking %v: place %d is %s, want %s", rk.Metric, rk.Order, i+1, rk.Order[i], w)
			}
		}
		for i, st := range rk.Steps {
			twins := i == 1 // linkerd and ambient: one distribution
			if twins && (st.Resolved || st.Symbol == "<") {
				t.Errorf("%s: %s < %s resolved (%+v), but they are one distribution", rk.Metric, st.Faster, st.Slower, st)
			}
			if !twins && (!st.Resolved || st.Symbol != "<" || !(st.PctLo > 0)) {
				t.Errorf("%s: step %s → %s not resolved (%+v), but the medians differ by a third or more", rk.Metric, st.Faster, st.Slower, st)
			}
		}
		// The line names the unresolved step with its interval.
		tw := rk.Steps[1]
		if !strings.HasPrefix(rk.Line, "fastest to slowest at "+rk.Metric+": traefik-mesh < "+tw.Faster+" "+tw.Symbol+" "+tw.Slower+" < cilium-envoy < envoy-sidecar < envoy-sidecar-mtls (") ||
			!strings.Contains(rk.Line, tw.Faster+" "+tw.Symbol+" "+tw.Slower+": ") {
			t.Errorf("ranking line %q", rk.Line)
		}
		if !strings.Contains(rk.Line, "not resolved") && !strings.Contains(rk.Line, "equal within") {
			t.Errorf("ranking line %q does not say why a step is open", rk.Line)
		}
	}
	var md bytes.Buffer
	if err := Render(&md, Markdown, run, an, Options{}); err != nil {
		t.Fatal(err)
	}
	for _, rk := range p.Rankings {
		if !strings.Contains(md.String(), "- "+rk.Line+"\n") {
			t.Errorf("markdown lacks the ranking %q", rk.Line)
		}
	}
	// The answer comes before every other section.
	if a, v := strings.Index(md.String(), "## "+titleAnswer), strings.Index(md.String(), "## "+titleVerdicts); a < 0 || v < a {
		t.Errorf("the answer (at %d) does not open the report (verdicts at %d)", a, v)
	}
	_, rows := answerTable(t, md.Bytes(), "fixed 600 rps")
	// Each mesh adds its known median minus the baseline's, times the queueing factor
	// 1/(1-600/5000), within the drift of three repeats.
	for _, m := range sevenMeshes[1:] {
		want := (m.medianUs - 450) / (1 - 600.0/5000) / 1000
		got := s.Answers[0].Rows[slices.IndexFunc(s.Answers[0].Rows, func(r AnswerRow) bool { return r.Mesh == m.label })].AddedP50
		if got == nil || math.Abs(float64(got.Ms)-want) > 0.1*want+0.03 {
			t.Errorf("%s added p50 = %+v, want about %.3f ms", m.label, got, want)
		}
		if rows[m.label] == nil || !strings.HasPrefix(rows[m.label][colP50], "+") {
			t.Errorf("%s markdown row %q", m.label, rows[m.label])
		}
	}
}

// An SLO the study set and a mesh broke is said beside the number that broke it and
// in the mesh's verdict; the mesh that meets it carries no such flag.
func TestAnswerSaysBrokenSLO(t *testing.T) {
	run := throughStore(t, syntheticRunOf(t, synthMeshes, false))
	// At 600 rps the sidecar's p99 is about 3.9 ms and the mTLS sidecar's about 6.1 ms.
	slo := analysis.DefaultSLO()
	slo.P99 = 5 * time.Millisecond
	an := analysis.Analyze(run, analysis.Options{Seed: 42}, &slo)
	var md bytes.Buffer
	if err := Render(&md, Markdown, run, an, Options{}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(md.String(), "SLO (set by the study): p50 ≤ 300ms, p99 ≤ 5ms, errors ≤ 0.1%") {
		t.Errorf("the answer does not state the study's SLO:\n%s", md.String())
	}
	_, rows := answerTable(t, md.Bytes(), "fixed 600 rps")
	mtls, plain := rows["sidecar-mtls"], rows["sidecar"]
	if !strings.HasSuffix(mtls[colP99], "(breaks SLO)") || strings.Contains(mtls[colP50], "SLO") {
		t.Errorf("sidecar-mtls: p99 cell %q, p50 cell %q: want the SLO flag beside the p99 only", mtls[colP99], mtls[colP50])
	}
	if !strings.Contains(mtls[colVerdict], "breaks the SLO: p99 ") || !strings.Contains(mtls[colVerdict], " > 5ms") {
		t.Errorf("sidecar-mtls verdict %q does not say it breaks the SLO", mtls[colVerdict])
	}
	if strings.Contains(strings.Join(plain, "|"), "SLO") {
		t.Errorf("sidecar meets the SLO (p99 about 3.9 ms) but its row says otherwise: %q", plain)
	}
	// The terminal summary says the same.
	var text bytes.Buffer
	if err := analysis.WriteAnswerSummary(&text, run, an, false); err != nil {
		t.Fatal(err)
	}
	out := text.String()
	for _, want := range []string{"SLO (set by the study): p50 ≤ 300ms, p99 ≤ 5ms", "(breaks SLO)", "breaks the SLO: p99 ", "sidecar-mtls: p99 "} {
		if !strings.Contains(out, want) {
			t.Errorf("terminal summary lacks %q:\n%s", want, out)
		}
	}
}

// A flag stands beside the number it qualifies: a saturated target beside both added
// latencies (and first in the verdict), an excluded trial beside the mesh, a failed
// probe beside the security posture; a flag the answer does not know yet stands
// beside the mesh rather than vanish. The other numbers are checked against what the
// synthetic run was built with.
func TestAnswerFlagsStandBesideTheirNumbers(t *testing.T) {
	run := syntheticRunOf(t, synthMeshes, false)
	saturated := 0
	for i := range run.Trials {
		tr := &run.Trials[i]
		switch {
		case tr.Mesh == "sidecar-mtls" && tr.Experiment == "fixed" && tr.Repeat < 2:
			tr.Result.Flags = append(tr.Result.Flags, "target-saturated")
			saturated++
		case tr.Mesh == "sidecar" && tr.Experiment == "fixed" && tr.Repeat == 1:
			// A fault trial, measured again (the copy is the retry).
			retry := *tr
			retry.Result.Flags = nil
			tr.Result.Flags = append(tr.Result.Flags, results.FlagFault)
			tr.Result.Faults = []results.Fault{{Pod: "reviews-0", Process: "envoy", PID: 4242, At: tr.Start.Add(time.Second), Exit: "signal: killed"}}
			run.Trials = append(run.Trials, retry)
		case tr.Mesh == "baseline" && tr.Experiment == "fixed" && tr.Repeat == 0:
			tr.Result.Flags = append(tr.Result.Flags, "a-flag-from-the-future")
		}
	}
	if saturated != 2 {
		t.Fatalf("flagged %d trials, want 2", saturated)
	}
	run = throughStore(t, run)
	an := analysis.Analyze(run, analysis.Options{Seed: 42}, nil)
	// A verdict the answer does not know by name (as an analysis calls a comparison
	// with a saturated group): beside its number and in the verdict, once.
	for i := range an.Comparisons {
		c := &an.Comparisons[i]
		if c.Experiment == "fixed" && (c.Mesh == "sidecar-mtls" || c.Mesh == "sidecar" && c.Metric == analysis.P99) {
			c.Verdict = "saturated"
		}
	}
	var md bytes.Buffer
	if err := Render(&md, Markdown, run, an, Options{}); err != nil {
		t.Fatal(err)
	}
	header, rows := answerTable(t, md.Bytes(), "fixed 600 rps")
	if want := []string{"Mesh", "Added p50 [95%]", "Added p99 [95%]", "CPU / 1000 req/s: proxies (system under test)", "Proxy memory", "Errors", "Security", "Verdict"}; !slices.Equal(header, want) {
		t.Errorf("answer header %q, want %q", header, want)
	}
	mtls, plain, base := rows["sidecar-mtls"], rows["sidecar"], rows["baseline"]
	for _, col := range []int{colP50, colP99} {
		if !strings.HasSuffix(mtls[col], "(target saturated 2/3)") || strings.Count(mtls[col], "saturated") != 1 {
			t.Errorf("sidecar-mtls cell %q: want the saturation beside it, once", mtls[col])
		}
	}
	for _, col := range []int{colMesh, colCPU, colMemory, colErrors} {
		if strings.Contains(mtls[col], "saturated") {
			t.Errorf("saturation flagged beside a number it does not qualify: %q", mtls[col])
		}
	}
	if mtls[colVerdict] != "saturated in 2 of 3 trials, so its latency is not comparable" {
		t.Errorf("sidecar-mtls verdict %q: want the saturation and no latency verdict", mtls[colVerdict])
	}
	if !strings.HasSuffix(mtls[colSecurity], "(1 probe failed)") || !strings.Contains(mtls[colSecurity], "strict mTLS seen 4/4, plaintext refused") {
		t.Errorf("sidecar-mtls security %q", mtls[colSecurity])
	}
	if plain[colMesh] != "sidecar (1 trial excluded)" || strings.Contains(plain[colP50]+plain[colP99], "excluded") {
		t.Errorf("sidecar mesh cell %q, p50 %q: want the excluded trial beside the mesh", plain[colMesh], plain[colP50])
	}
	if !strings.HasSuffix(plain[colP99], " (saturated)") || !strings.HasPrefix(plain[colVerdict], "p99 saturated; slower: +") || !strings.HasSuffix(plain[colVerdict], " at p50") {
		t.Errorf("sidecar p99 %q, verdict %q: want its p99 saturated beside it and first in the verdict, then the p50", plain[colP99], plain[colVerdict])
	}
	if base[colMesh] != "baseline (a flag from the future 1/3)" || base[colVerdict] != "reference" {
		t.Errorf("baseline row %q: an unknown flag must stand beside the mesh", base)
	}
	for _, want := range []string{"- sidecar: left out of every number: trial ", "reviews-0/envoy (pid 4242)", "- sidecar-mtls: target saturated in 2 of 3 trials (trial "} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("markdown lacks the evidence %q", want)
		}
	}
	// Known truths of the synthetic run: two Envoy sidecars at 0.20 and 0.18 cores per
	// 1000 req/s and 61 and 58 MiB (+0..4), the workload and control plane at 0.21 more.
	s := Summarize(run, an, Options{})
	for _, r := range s.Answers[0].Rows {
		if r.Baseline {
			if r.Proxies != 0 || math.Abs(float64(r.SUTCoresPer1000RPS)-0.20)/0.20 > 0.1 {
				t.Errorf("baseline: %d proxies, SUT %.3f cores/1000 req/s, want none and 0.20", r.Proxies, float64(r.SUTCoresPer1000RPS))
			}
			continue
		}
		if r.Proxies != 2 || math.Abs(float64(r.ProxyCoresPer1000RPS)-0.38)/0.38 > 0.1 || math.Abs(float64(r.SUTCoresPer1000RPS)-0.59)/0.59 > 0.1 ||
			math.Abs(float64(r.ProxyMemMiB)-123) > 3 {
			t.Errorf("%s: %d proxies, %.3f (SUT %.3f) cores/1000 req/s, %.1f MiB; want 2, 0.38 (0.59), 123", r.Mesh, r.Proxies,
				float64(r.ProxyCoresPer1000RPS), float64(r.SUTCoresPer1000RPS), float64(r.ProxyMemMiB))
		}
	}
	// The JSON carries the flags with the field they qualify.
	var back struct {
		Answers []struct {
			Rows []struct {
				Mesh  string          `json:"mesh"`
				Flags []analysis.Flag `json:"flags"`
			} `json:"rows"`
		} `json:"answers"`
	}
	var js bytes.Buffer
	if err := Render(&js, JSON, run, an, Options{}); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, r := range back.Answers[0].Rows {
		for _, f := range r.Flags {
			if r.Mesh == "sidecar-mtls" && f.Name == "target-saturated" && f.Field == analysis.FieldLatency && f.Trials == 2 && f.Of == 3 {
				found = true
			}
		}
	}
	if !found {
		t.Errorf("JSON answers lack sidecar-mtls's saturation flag: %s", js.String())
	}
}
