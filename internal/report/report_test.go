package report

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/yuin/goldmark"
	"github.com/yuin/goldmark/ast"
	"github.com/yuin/goldmark/extension"
	east "github.com/yuin/goldmark/extension/ast"
	"github.com/yuin/goldmark/text"

	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/meshmark/meshmark/internal/results"
)

var (
	fixtureOnce sync.Once
	fixtureRun  *results.Run
	fixtureAn   *analysis.Report
)

// fixture analyses the synthetic run once, for every test that reads it.
func fixture(t testing.TB) (*results.Run, *analysis.Report) {
	fixtureOnce.Do(func() {
		fixtureRun = syntheticRun(t)
		fixtureAn = analysis.Analyze(fixtureRun, analysis.Options{}, nil)
	})
	return fixtureRun, fixtureAn
}

func TestSummaryNumbers(t *testing.T) {
	run, an := fixture(t)
	s := Summarize(run, an, Options{})

	caps := map[string]CapacityRow{}
	for _, c := range s.Capacity {
		if c.Experiment == "sweep" {
			caps[c.Mesh] = c
		}
	}
	// sidecar-mtls saturates at 1250 rps: at 1400 it drops ~2% of requests; the others
	// keep up with every step.
	if c := caps["sidecar-mtls"]; !c.Found || c.MaxX != 1200 || !strings.Contains(c.Limit, "error rate") {
		t.Errorf("sidecar-mtls capacity = %+v, want 1200 rps limited by errors", c)
	}
	if c := caps["baseline"]; !c.Found || c.MaxX != 1400 {
		t.Errorf("baseline capacity = %+v, want every step (1400 rps)", c)
	}
	if c := caps["sidecar-mtls"]; !c.HasKnee || c.KneeX > 1200 {
		t.Errorf("sidecar-mtls should have a knee at or below 1200 rps: %+v", c)
	}

	// The baseline's median is half the sidecar's by construction: a conclusive win.
	found := false
	for _, v := range s.Verdicts {
		if v.Experiment == "fixed" && v.Metric == "p50" {
			found = true
			if v.Best != "baseline" || v.Verdict != "better" {
				t.Errorf("fixed p50 verdict = %+v, want baseline, better", v)
			}
			if got := float64(v.Values["baseline"]); math.Abs(got-0.45*1/(1-600.0/5000))/0.51 > 0.1 {
				t.Errorf("baseline p50 = %.3f ms, want about 0.51 ms", got)
			}
		}
	}
	if !found {
		t.Error("no p50 verdict for the fixed experiment")
	}

	// Heatmap columns are shares of each step: they add up to 100%, counts to the step.
	if len(s.Heatmaps) != 3 {
		t.Fatalf("want one heatmap per mesh for the sweep, got %d", len(s.Heatmaps))
	}
	for _, h := range s.Heatmaps {
		share := make([]float64, len(h.Columns))
		for _, c := range h.Cells {
			share[int(c[0])] += c[2]
		}
		for i, x := range share {
			if math.Abs(x-100) > 1e-6 {
				t.Errorf("%s column %s sums to %.4f%%", h.Mesh, h.Columns[i], x)
			}
		}
	}

	// Resources: the envoy of productpage burns 0.20 cores per 1000 rps served.
	for _, r := range s.Resources {
		if r.Mesh == "sidecar" && r.Component == "envoy" && r.Pod == "productpage-0" {
			// Mean served rate over the fixed (600) and sweep (200..1400) points.
			want := 0.20 * (600 + 200 + 400 + 600 + 800 + 1000 + 1200 + 1400) / 8 / 1000
			if math.Abs(r.AvgCores-want)/want > 0.1 {
				t.Errorf("sidecar envoy avg cores = %.4f, want about %.4f", r.AvgCores, want)
			}
			if r.PeakCores < r.AvgCores || r.PeakMemMiB < r.AvgMemMiB || r.AvgMemMiB < 61 || r.AvgMemMiB > 65 {
				t.Errorf("implausible envoy resources %+v", r)
			}
		}
	}
	// Network: productpage's eth0 moves 1200 B in and 6200 B out per request without a
	// mesh, 200 and 300 B more with a sidecar, whose lo carries 5200 B each way; the
	// mean served rate over the eight points is 775 rps for both (no drops below
	// 1530 rps). Idle loopback is left out.
	net := map[string]NetworkRow{}
	for _, r := range s.Network {
		net[r.Mesh+"/"+r.Pod+"/"+r.Interface] = r
	}
	if len(s.Network) != 3+5+5 {
		t.Errorf("network rows = %d, want 13 (3 eth0 per mesh, 2 busy lo per sidecar mesh): %+v", len(s.Network), s.Network)
	}
	near := func(got, want float64) bool { return math.Abs(got-want) <= 1e-9*want }
	for _, c := range []struct {
		key    string
		rx, tx float64
	}{{"baseline/productpage-0/eth0", 1200 * 775, 6200 * 775}, {"sidecar/productpage-0/eth0", 1400 * 775, 6500 * 775},
		{"sidecar/productpage-0/lo", 5200 * 775, 5200 * 775}, {"sidecar/reviews-0/lo", 800 * 775, 800 * 775}} {
		r, ok := net[c.key]
		if !ok || !near(r.RxBytesPerSec, c.rx) || !near(r.TxBytesPerSec, c.tx) || r.Trials != 24 || !near(r.RxPacketsPerSec, 4*775) {
			t.Errorf("network %s = %+v, want rx %v tx %v B/s over 24 trials", c.key, r, c.rx, c.tx)
		}
	}
	if _, ok := net["baseline/productpage-0/lo"]; ok {
		t.Error("idle loopback of the baseline is listed")
	}
	if strings.Join(s.NetworkFrom, ",") != "fixed,sweep" {
		t.Errorf("network from %v", s.NetworkFrom)
	}
	costs := map[string]CostRow{}
	for _, c := range s.Costs {
		costs[c.Mesh] = c
	}
	// The sidecar mesh adds two envoys (0.20 and 0.18 cores per 1000 rps) and a control
	// plane (0.01) at a mean served rate of 775 rps.
	wantExtra := (0.20 + 0.18 + 0.01) * 775 / 1000
	sc := costs["sidecar"]
	if b := costs["baseline"]; b.ExtraVCPU != 0 || b.PerMonth != 0 {
		t.Errorf("baseline costs extra against itself: %+v", b)
	}
	if math.Abs(sc.ExtraVCPU-wantExtra)/wantExtra > 0.1 || math.Abs(sc.MeshVCPU-wantExtra)/wantExtra > 0.1 {
		t.Errorf("sidecar extra vCPU = %.3f (mesh components %.3f), want about %.3f", sc.ExtraVCPU, sc.MeshVCPU, wantExtra)
	}
	cm := s.CostModel
	if cm.Instance != DefaultInstance || sc.PerMonth <= 0 || math.Abs(sc.PerMonth-sc.InstanceEquivalents*cm.PricePerHour*cm.HoursPerMonth) > 1e-9 {
		t.Errorf("sidecar priced %+v on %+v", sc, cm)
	}
	checks := 0
	for _, c := range s.Checks {
		if strings.HasPrefix(c.Check, "mTLS on the wire") {
			checks++
			if c.Mesh != "sidecar-mtls" || !c.Pass {
				t.Errorf("unexpected mTLS check %+v", c)
			}
		}
	}
	if checks != 1 {
		t.Errorf("want one mTLS check (only sidecar-mtls runs mTLS), got %d", checks)
	}
}

func TestJSONHasNoNaNAndReadsBack(t *testing.T) {
	run, an := fixture(t)
	var buf bytes.Buffer
	if err := Render(&buf, JSON, run, an, Options{}); err != nil {
		t.Fatal(err)
	}
	var back Summary
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Network) != 13 || back.Network[0].RxBytesPerSec <= 0 || back.Network[0].Interface == "" {
		t.Errorf("JSON summary network rows: %+v", back.Network)
	}
	if len(back.Groups) != 24 || len(back.Comparisons) == 0 || back.RunID != run.ID {
		t.Fatalf("JSON summary lost data: %d groups, %d comparisons", len(back.Groups), len(back.Comparisons))
	}
}

func TestCSV(t *testing.T) {
	run, an := fixture(t)
	var buf bytes.Buffer
	if err := Render(&buf, CSV, run, an, Options{}); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&buf).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(rows[0], ",") != strings.Join(CSVHeader, ",") {
		t.Fatalf("header = %v", rows[0])
	}
	if len(rows) != 1+24 {
		t.Fatalf("want 24 data rows (3 meshes × 8 points), got %d", len(rows)-1)
	}
	col := map[string]int{}
	for i, h := range rows[0] {
		col[h] = i
	}
	for _, r := range rows[1:] {
		p50, _ := strconv.ParseFloat(r[col["p50_ms"]], 64)
		p99, _ := strconv.ParseFloat(r[col["p99_ms"]], 64)
		if !(p50 > 0 && p99 >= p50) {
			t.Errorf("row %v: p50 %v p99 %v", r, p50, p99)
		}
		if r[col["baseline"]] == "false" && r[col["p99_verdict"]] == "" {
			t.Errorf("mesh row without a verdict against the baseline: %v", r)
		}
	}
}

// mdTables parses Markdown with GitHub's table extension and returns each table as
// header + rows of cell text, keyed by the heading that precedes it.
func mdTables(t *testing.T, src []byte) map[string][][][]string {
	md := goldmark.New(goldmark.WithExtensions(extension.GFM))
	doc := md.Parser().Parse(text.NewReader(src))
	out := map[string][][][]string{}
	heading := ""
	cellText := func(n ast.Node) string {
		var b strings.Builder
		_ = ast.Walk(n, func(c ast.Node, entering bool) (ast.WalkStatus, error) {
			if entering {
				switch x := c.(type) {
				case *ast.Text:
					b.Write(x.Segment.Value(src))
				case *ast.CodeSpan:
					for ch := x.FirstChild(); ch != nil; ch = ch.NextSibling() {
						if tx, ok := ch.(*ast.Text); ok {
							b.Write(tx.Segment.Value(src))
						}
					}
					return ast.WalkSkipChildren, nil
				}
			}
			return ast.WalkContinue, nil
		})
		return b.String()
	}
	for n := doc.FirstChild(); n != nil; n = n.NextSibling() {
		switch x := n.(type) {
		case *ast.Heading:
			heading = cellText(x)
		case *east.Table:
			var tbl [][]string
			for row := x.FirstChild(); row != nil; row = row.NextSibling() {
				var cells []string
				for c := row.FirstChild(); c != nil; c = c.NextSibling() {
					cells = append(cells, cellText(c))
				}
				tbl = append(tbl, cells)
			}
			out[heading] = append(out[heading], tbl)
		}
	}
	return out
}

func TestMarkdownTables(t *testing.T) {
	run, an := fixture(t)
	var buf bytes.Buffer
	if err := Render(&buf, Markdown, run, an, Options{}); err != nil {
		t.Fatal(err)
	}
	tables := mdTables(t, buf.Bytes())
	want := map[string][]string{
		titleVerdicts:    {"Point", "Metric", "Best", "Value", "Runner-up", "Runner-up value", "Runner-up vs best", "Interval", "Verdict"},
		titleComparisons: {"Point", "Mesh", "Metric", "Baseline", "Mesh value", "Δ", "Δ interval", "Δ%", "Δ% interval", "Noise floor", "Verdict"},
		titleResults:     {"Point", "Mesh", "Repeats", "Requests", "req/s", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "max ms", "errors %", "failed without response", "target saturated"},
		titleCapacity:    {"Experiment", "Mesh", "Capacity", "req/s at capacity", "Knee", "Limited by"},
		titleResources:   {"Mesh", "Component", "Role", "Pod", "CPU avg (cores)", "CPU peak (cores)", "RSS avg (MiB)", "RSS peak (MiB)"},
		titleCost: {"Mesh", "vCPU", "Memory (MiB)", "Mesh vCPU", "Mesh memory (MiB)", "req/s", "Extra vCPU", "Extra GiB",
			"Instances (bound by)", "USD/month", "USD per million requests"},
		titleNetwork:    {"Mesh", "Pod", "Interface", "Rx KiB/s", "Tx KiB/s", "Rx pkt/s", "Tx pkt/s", "Dropped rx / tx"},
		titleChecks:     {"Mesh", "Check", "Result", "Detail"},
		titleProvenance: {"Item", "Value"},
	}
	for title, header := range want {
		ts := tables[title]
		if len(ts) == 0 {
			t.Errorf("section %q has no table", title)
			continue
		}
		if strings.Join(ts[0][0], "|") != strings.Join(header, "|") {
			t.Errorf("section %q header = %q, want %q", title, ts[0][0], header)
		}
		if len(ts[0]) < 2 {
			t.Errorf("section %q table has no rows", title)
		}
	}
	// The synthetic run's repeats ran interleaved, so the comparisons were paired.
	if !regexp.MustCompile(`compared within the block \(\d+ of \d+ comparisons\)`).Match(buf.Bytes()) {
		t.Error("the report does not say its repeats were compared within their blocks")
	}
	// 3 meshes × 8 points pooled; 2 meshes × 8 points × 6 metrics against the baseline.
	if n := len(tables[titleResults][0]) - 1; n != 24 {
		t.Errorf("pooled results rows = %d, want 24", n)
	}
	if n := len(tables[titleComparisons][0]) - 1; n != 2*8*6 {
		t.Errorf("comparison rows = %d, want 96", n)
	}
	if n := len(tables[titleNetwork][0]) - 1; n != 13 {
		t.Errorf("network rows = %d, want 13", n)
	}
	for _, row := range tables[titleNetwork][0][1:] {
		// 1200 B × 775 rps / 1024 = 908.2 KiB/s.
		if row[0] == "baseline" && row[1] == "productpage-0" && (row[2] != "eth0" || row[3] != "908.2" || row[7] != "0 / 0") {
			t.Errorf("baseline productpage network row %q, want eth0 908.2 KiB/s in, no drops", row)
		}
	}
	for _, row := range tables[titleCapacity][0][1:] {
		if row[0] == "sweep" && row[1] == "sidecar-mtls" && row[2] != "1200 rps" {
			t.Errorf("capacity row %q, want 1200 rps", row)
		}
	}
}

func TestMarkdownSaysWhenSectionsAreEmpty(t *testing.T) {
	run := syntheticRun(t)
	// Keep only the fixed-rate trials of one mesh, without resources or checks.
	var trials []results.Trial
	for _, tr := range run.Trials {
		if tr.Experiment == "fixed" && tr.Mesh == "baseline" {
			tr.Result.Resources, tr.Result.Network = nil, nil
			trials = append(trials, tr)
		}
	}
	run.Trials, run.Meshes = trials, run.Meshes[:1]
	run.Meshes[0].Enrollment = nil
	var buf bytes.Buffer
	if err := Render(&buf, Markdown, run, nil, Options{}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"nothing to rank", "no capacity was searched", "No resource samples were recorded", "No network counters were recorded", "no equivalence check stored"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("markdown lacks %q", want)
		}
	}
}

func TestWriteAllFormats(t *testing.T) {
	run, an := fixture(t)
	dir := t.TempDir()
	paths, err := Write(context.Background(), run, an, dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) != len(Formats) || filepath.Base(paths[0]) != "report.html" {
		t.Fatalf("paths = %v", paths)
	}
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil || st.Size() == 0 {
			t.Errorf("%s: %v, size %d", p, err, st.Size())
		}
	}
	left, _ := filepath.Glob(filepath.Join(dir, ".*"))
	if len(left) != 0 {
		t.Errorf("temporary files left behind: %v", left)
	}
}

// Every format names the intervals' level and method: the synthetic run has three
// interleaved repeats of 4 s.
func TestReportsNameTheIntervalMethod(t *testing.T) {
	run, an := fixture(t)
	const want = "95% intervals: paired t on 3 interleaved blocks of 4s"
	for _, f := range []Format{Markdown, HTML, JSON} {
		var buf bytes.Buffer
		if err := Render(&buf, f, run, an, Options{}); err != nil {
			t.Fatal(err)
		}
		text := buf.String()
		if f == JSON {
			if !strings.Contains(text, `"interval_line": "95% intervals: paired t on 3 interleaved blocks of 4s"`) {
				t.Errorf("JSON does not carry the interval method:\n%.600s", text)
			}
			continue
		}
		if !strings.Contains(text, want) {
			t.Errorf("%s does not say %q", f, want)
		}
	}
}

func TestParseFormat(t *testing.T) {
	for _, s := range []string{"html", "HTML", "md", "markdown", "json", "csv", "smp"} {
		if _, err := ParseFormat(s); err != nil {
			t.Errorf("%q: %v", s, err)
		}
	}
	if _, err := ParseFormat("pdf"); err == nil || !strings.Contains(err.Error(), "pdf") {
		t.Errorf("pdf: %v", err)
	}
}
