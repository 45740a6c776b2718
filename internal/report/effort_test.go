package report

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/results"
)

// A run on Kubernetes records each mesh install; the report shows the effort per mesh
// (the median time over its installs), and a local run has no such section.
func TestReportShowsInstallEffort(t *testing.T) {
	run := syntheticRun(t)
	var local bytes.Buffer
	if err := Render(&local, Markdown, run, nil, Options{}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(local.String(), titleEffort) {
		t.Error("a local run's report has an install effort section")
	}
	mesh := run.Meshes[1].Label
	for _, ready := range []time.Duration{9 * time.Second, 5 * time.Second, 7 * time.Second} {
		doc, err := json.Marshal(results.InstallEffort{
			Charts: []results.InstalledChart{{Release: "istio-base", Chart: "base", Version: "1.31.1"}, {Release: "istiod", Chart: "istiod", Version: "1.31.1"}},
			Ready:  ready, Objects: 35, CRDs: make([]string, 15), Values: 3,
		})
		if err != nil {
			t.Fatal(err)
		}
		run.Provenance.Configs = append(run.Provenance.Configs, results.NewGeneratedConfig(results.InstallEffortConfig, mesh, "envoy-sidecar", doc))
	}
	s := Summarize(run, nil, Options{})
	if len(s.Effort) != 1 || s.Effort[0].Mesh != mesh || s.Effort[0].Installs != 3 || s.Effort[0].ReadySeconds != 7 ||
		s.Effort[0].CRDs != 15 || s.Effort[0].Charts != "base 1.31.1, istiod 1.31.1" {
		t.Fatalf("effort rows %+v: want one row for %s, 3 installs, median 7 s", s.Effort, mesh)
	}
	var md, page bytes.Buffer
	if err := Render(&md, Markdown, run, nil, Options{}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(md.String(), "| "+mesh+" | 3 | 7 | 35 | 15 | 3 | base 1.31.1, istiod 1.31.1 |") {
		t.Errorf("markdown effort table missing:\n%s", md.String())
	}
	if err := Render(&page, HTML, run, nil, Options{}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(page.String(), "<td>"+mesh+"</td><td>3</td><td>7.0</td><td>35</td><td>15</td><td>3</td>") {
		t.Error("HTML effort table missing")
	}
}
