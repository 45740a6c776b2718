package runner

import (
	"context"
	"encoding/json"
	"os"
	"testing"

	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/prereq"
	"github.com/meshmark/meshmark/internal/results"
)

// The S2/S4/S5 comparison in miniature: baseline, Envoy sidecars and Linkerd in one
// interleaved study, each with its enrollment check, proxy counters and the
// control plane's resources stored, and Linkerd compared with the baseline.
const linkerdStudy = `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: runner-linkerd}
spec:
  substrate:
    local: {nodes: 2, loadgenNode: 1}
  workload: {graph: bookinfo}
  meshes:
    - {name: baseline, profile: none}
    - {name: envoy, profile: envoy-sidecar}
    - {name: linkerd, profile: linkerd}
  experiments:
    - {name: latency, kind: fixed-rate, rate: 100, connections: 8, duration: 5s, warmup: 1s}
  repeats: 2
  order: interleaved
  seed: 3
`

func TestLinkerdBesideEnvoyAndBaseline(t *testing.T) {
	needRoot(t)
	if _, err := prereq.ProxyBin("linkerd2-proxy"); err != nil {
		if os.Getenv("CI") == "" {
			t.Skipf("runs the real linkerd2-proxy: %v", err)
		}
		t.Fatal(err)
	}
	run, db := runStudy(t, parseStudy(t, linkerdStudy))
	if len(run.Trials) != 6 {
		t.Fatalf("stored %d trials, want 3 meshes × 2 repeats", len(run.Trials))
	}
	for _, m := range run.Meshes {
		var e mesh.Enrollment
		if err := json.Unmarshal(m.Enrollment, &e); err != nil || !e.Pass {
			t.Errorf("mesh %s: enrollment %s (%v)", m.Label, m.Enrollment, err)
		}
	}
	stored, err := db.LoadRun(context.Background(), run.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range stored.Trials {
		if tr.Mesh != "linkerd" {
			continue
		}
		proxies, cp := 0, 0
		for _, ps := range tr.Result.ProxyStats {
			if ps.Component == "linkerd2-proxy" {
				proxies++
			}
		}
		for _, s := range tr.Result.Resources {
			if s.Role == "control-plane" && s.Component == "linkerd-control-plane" {
				cp++
			}
		}
		if proxies != 6 || cp == 0 {
			t.Errorf("linkerd trial %d: %d linkerd2-proxy counter sets (want 6), %d control-plane samples", tr.Repeat, proxies, cp)
		}
		for _, f := range tr.Result.Flags {
			if f == results.FlagProxyBypassed {
				t.Errorf("linkerd trial %d: the entry proxies counted fewer requests than were answered", tr.Repeat)
			}
		}
	}
	rep := analysis.Analyze(stored, analysis.Options{Seed: 1}, nil)
	found := false
	for _, c := range rep.Comparisons {
		if c.Mesh == "linkerd" && c.Metric == analysis.P50 {
			found = true
			t.Logf("linkerd p50: base %.0f µs, value %.0f µs, Δ %.0f µs [%.0f, %.0f], %s", c.Base, c.Value, c.Delta.Value, c.Delta.Lo, c.Delta.Hi, c.Verdict)
		}
	}
	if !found {
		t.Error("no comparison of linkerd with the baseline")
	}
}
