package report

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/meshmark/meshmark/internal/results"
)

// s4StudyFile is what a run of examples/s4-steps-heatmap.yaml stores as its study
// file, reduced to what the report reads of it.
const s4StudyFile = "apiVersion: meshmark.dev/v1alpha1\nkind: Study\nmetadata:\n  name: s4-steps-heatmap\nspec:\n  reproduces: S4\n"

// s4Run is a stored synthetic run shaped like S4: a baseline and the three meshes S4
// compared, with known medians (µs), a fixed-rate point and a 7-step sweep whose
// middle step (800 rps) stands for S4's 1000 rps. Every mesh's capacity is far above
// the sweep, so no step queues.
func s4Run(t *testing.T, traefik, linkerd, istio float64) *results.Run {
	t.Helper()
	meshes := []synthMesh{
		{label: "baseline", profile: "none", medianUs: 400, sigma: 0.3, capacityRPS: 50000},
		{label: "istio-like", profile: "envoy-sidecar", options: map[string]string{"mtls": "strict"}, medianUs: istio, sigma: 0.3, capacityRPS: 50000, proxies: true},
		{label: "linkerd", profile: "linkerd", medianUs: linkerd, sigma: 0.3, capacityRPS: 50000, proxies: true},
		{label: "traefik-like", profile: "traefik-mesh", medianUs: traefik, sigma: 0.3, capacityRPS: 50000, proxies: true},
	}
	run := syntheticRunOf(t, meshes, true)
	run.Study, run.StudyFile = "s4-steps-heatmap", []byte(s4StudyFile)
	return throughStore(t, run)
}

// claimMarks are the marks of the Markdown report's claims table, keyed by its "Agrees
// if" column (unique per claim and point in an S4 run).
func claimMarks(t *testing.T, md []byte) map[string]string {
	t.Helper()
	var claims [][][]string
	for heading, ts := range mdTables(t, md) {
		if strings.HasPrefix(heading, "S4's published figures beside this run's") {
			claims = ts
		}
	}
	if len(claims) != 1 {
		t.Fatalf("no claims table under S4's published figures:\n%s", md)
	}
	out := map[string]string{}
	for _, row := range claims[0][1:] {
		out[row[4]] = row[0]
	}
	return out
}

// TestReproductionMarksAgreementAndDisagreement stores two S4 runs in SQLite: one whose
// meshes order as S4 published (Traefik < Linkerd < Istio at P95, in ratios near S4's)
// and one whose order is reversed. The first must be marked agrees on every latency
// claim, the second disagrees on every one, from the runs' intervals.
func TestReproductionMarksAgreementAndDisagreement(t *testing.T) {
	for _, c := range []struct {
		name                    string
		traefik, linkerd, istio float64
		want                    string
	}{
		// Istio at 1.51x Linkerd, the middle of S4's band (1.214-1.897): three repeats
		// whose trials drift 3 % apiece give the ratio an interval of about ±15 %.
		{"as published", 500, 700, 1060, "agrees"},
		{"reversed", 1000, 700, 500, "disagrees"},
	} {
		t.Run(c.name, func(t *testing.T) {
			run := s4Run(t, c.traefik, c.linkerd, c.istio)
			an := analysis.Analyze(run, analysis.Options{Seed: 42}, nil)
			var md bytes.Buffer
			if err := Render(&md, Markdown, run, an, Options{}); err != nil {
				t.Fatal(err)
			}
			marks := claimMarks(t, md.Bytes())
			for _, expect := range []string{
				"traefik-like lower than linkerd at p95",
				"linkerd lower than istio-like at p95",
				"linkerd ÷ traefik-like at p95 within",
				"istio-like ÷ linkerd at p95 within",
			} {
				got := ""
				for k, v := range marks {
					if strings.HasPrefix(k, expect) {
						got = v
					}
				}
				if got != c.want {
					t.Errorf("%q marked %q, want %q (all marks: %v)", expect, got, c.want, marks)
				}
			}
			// S4's memory was measured by a soak, which this run does not have.
			for k, v := range marks {
				if strings.Contains(k, "mesh memory") && v != "not measured" {
					t.Errorf("%q marked %q without a soak experiment", k, v)
				}
			}
			// The study's own tables open the report, before the answer.
			text := md.String()
			repro, answer := strings.Index(text, "## The published study, reproduced: S4"), strings.Index(text, "## "+titleAnswer)
			if repro < 0 || answer < 0 || repro > answer {
				t.Errorf("the reproduction (at %d) does not open the report before the answer (at %d)", repro, answer)
			}
			tables := mdTables(t, md.Bytes())
			if ts := tables["P95 and P99 per step (S4's latency study): sweep"]; len(ts) != 1 || len(ts[0]) != 1+7 {
				t.Errorf("P95/P99 table: %v, want one row per step of 7", ts)
			}
			if ts := tables["Heatmap of linkerd (S4's figure): sweep"]; len(ts) != 1 {
				t.Errorf("no heatmap of linkerd")
			}
		})
	}
}

// TestReproductionTerminalAndJSON checks the other renderings carry the same marks:
// the terminal summary opens with the study, and the JSON report has every claim.
func TestReproductionTerminalAndJSON(t *testing.T) {
	run := s4Run(t, 1000, 700, 500)
	an := analysis.Analyze(run, analysis.Options{Seed: 42}, nil)
	s := Summarize(run, an, Options{})
	if s.Reproduction == nil {
		t.Fatal("no reproduction in the summary of a run whose study declares spec.reproduces")
	}
	var term bytes.Buffer
	if err := analysis.WriteAnswerSummary(&term, run, an, false, s.Reproduction.WriteText); err != nil {
		t.Fatal(err)
	}
	out := term.String()
	if i, j := strings.Index(out, "reproduces S4, Performance and security"), strings.Index(out, "SLO ("); i < 0 || j < 0 || i > j {
		t.Errorf("terminal summary does not open with S4 before the answer:\n%s", out)
	}
	if !strings.Contains(out, "[disagrees] P95 at 1000 rps: Traefik ~0.63 ms, Linkerd ~0.87 ms") {
		t.Errorf("terminal summary does not mark the reversed order:\n%s", out)
	}
	var buf bytes.Buffer
	if err := Render(&buf, JSON, run, an, Options{}); err != nil {
		t.Fatal(err)
	}
	var back struct {
		Reproduction struct {
			Study  string `json:"study"`
			Claims []struct {
				Claim string `json:"claim"`
				Mark  string `json:"mark"`
			} `json:"claims"`
		} `json:"reproduction"`
	}
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	marks := map[string]string{}
	for _, c := range back.Reproduction.Claims {
		marks[c.Claim] = c.Mark
	}
	if back.Reproduction.Study != "S4" || marks["S4/p95-middle/linkerd<istio"] != "disagrees" || marks["S4/memory/linkerd<istio"] != "not measured" {
		t.Errorf("JSON reproduction %s: %v", back.Reproduction.Study, marks)
	}
}

// TestNoReproductionWithoutDeclaration: a run whose study declares nothing opens with
// the answer, as before.
func TestNoReproductionWithoutDeclaration(t *testing.T) {
	run, an := fixture(t)
	var md bytes.Buffer
	if err := Render(&md, Markdown, run, an, Options{}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(md.String(), titleReproduction) {
		t.Error("a run that reproduces nothing has a reproduction section")
	}
}

// TestReproductionHTMLInChromium renders an S4 reproduction in headless Chromium: the
// section comes first, with the study's tables and the claims, and no error.
func TestReproductionHTMLInChromium(t *testing.T) {
	run := s4Run(t, 500, 700, 1000)
	an := analysis.Analyze(run, analysis.Options{Seed: 42}, nil)
	paths, err := Write(context.Background(), run, an, t.TempDir(), Options{}, HTML)
	if err != nil {
		t.Fatal(err)
	}
	checks, _, problems, _ := renderInChromium(t, paths[0])
	for _, p := range problems {
		t.Errorf("browser reported: %s", p)
	}
	if len(checks) == 0 || checks[0].ID != "reproduction" {
		t.Fatalf("first section %v, want the reproduction", checks)
	}
	// 7 steps × (P95/P99 + 4 heatmaps of ~5 buckets) and 7 claim rows at least.
	if c := checks[0]; c.DataRows < 7+4*3+7 || c.EmptyNote != "" {
		t.Errorf("reproduction section: %d rows, empty note %q", c.DataRows, c.EmptyNote)
	}
}
