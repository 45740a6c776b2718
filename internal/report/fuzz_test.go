package report

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/meshmark/meshmark/internal/results"
)

// FuzzRenderStoredRun feeds arbitrary run JSON (what the store and `meshmark export`
// hold) through every format: a damaged or odd run must give an error or a report,
// never a panic, and the JSON report must stay valid JSON.
func FuzzRenderStoredRun(f *testing.F) {
	h := results.NewLatencyHistogram()
	for v := int64(1); v < 500; v += 7 {
		_ = h.RecordValue(v)
	}
	for _, mesh := range []string{"none", "a|b</script>"} {
		run := results.Run{ID: "r1", Study: "s", Meshes: []results.Mesh{{Label: "none", Profile: "none"}, {Label: mesh, Profile: "envoy-sidecar"}},
			Trials: []results.Trial{{Mesh: "none", Experiment: "e", Result: results.TrialResult{Requests: 10, Latency: h}},
				{Mesh: mesh, Experiment: "e", Params: results.TrialParams{Step: 1, RequestedRate: 5}, Result: results.TrialResult{Requests: 10, Errors: 1, Latency: h,
					Resources: []results.ResourceSample{{Component: "envoy", Role: "sidecar", CPUUserSeconds: 1}}}}}}
		b, err := json.Marshal(run)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"meshes":[{"label":"x","enrollment":{"pods":[{"service":"s"}],"mtls":"strict"}}],"trials":[{"mesh":"x","result":{"intervals":[{}]}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var run results.Run
		// A few trials exercise every path here.
		if json.Unmarshal(data, &run) != nil || len(run.Trials) > 8 {
			return
		}
		an := analysis.Analyze(&run, analysis.Options{}, nil)
		for _, format := range Formats {
			var buf bytes.Buffer
			if err := Render(&buf, format, &run, an, Options{}); err != nil {
				continue
			}
			if format == JSON || format == SMP {
				if !json.Valid(buf.Bytes()) {
					t.Fatalf("%s report is not valid JSON", format)
				}
			}
			// Four scripts: ECharts, the data, the reproduction and the page.
			if format == HTML && strings.Count(buf.String(), "</script>") != 4 {
				t.Fatalf("data ended a <script> early: %d </script> tags", strings.Count(buf.String(), "</script>"))
			}
		}
	})
}
