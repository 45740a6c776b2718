package runner

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/report"
	"github.com/meshmark/meshmark/internal/results"
)

// Two versions of one service with equal weights, called by a front service over a
// kept-alive connection: with no mesh balancing per connection the testbed's VIP picks a
// version per connection (as kube-proxy does), so one version serves all traffic and the
// trial is flagged; the Envoy sidecars balance per request and split it by the weights,
// and so does the baseline balancing per request, its default.
func TestSkewedRequestMixIsFlagged(t *testing.T) {
	needRoot(t)
	graph := filepath.Join(t.TempDir(), "split.yaml")
	if err := os.WriteFile(graph, []byte(`name: split
services:
  - name: front
    isEntrypoint: true
    script: [call: back]
  - name: back
    versions:
      - {name: v1, weight: 1}
      - {name: v2, weight: 1}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	run, db := runStudy(t, parseStudy(t, `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: runner-request-mix}
spec:
  substrate:
    local: {nodes: 2, loadgenNode: 1}
  workload: {graph: `+graph+`}
  meshes:
    - {name: none, profile: none, options: {balancing: per-connection}}
    - {name: spread, profile: none}
    - {name: sidecar, profile: envoy-sidecar, options: {mtls: off}}
  experiments:
    - {name: latency, kind: fixed-rate, rate: 100, connections: 1, duration: 3s, warmup: 500ms}
  repeats: 1
`))
	for _, tr := range run.Trials {
		var split []string
		for _, v := range tr.Result.Mix {
			split = append(split, fmt.Sprintf("%s %d (%.0f%%)", v.Version, v.Requests, 100*v.Share))
		}
		t.Logf("%s: back split %v, flags %v", tr.Mesh, split, tr.Result.Flags)
		if len(tr.Result.Mix) != 2 {
			t.Errorf("%s: mix %+v, want back's two versions", tr.Mesh, tr.Result.Mix)
			continue
		}
		skewed := tr.Result.HasFlag(results.FlagMixSkewed)
		switch tr.Mesh {
		case "none":
			if !skewed {
				t.Errorf("baseline with one kept-alive connection split %+v and was not flagged", tr.Result.Mix)
			}
		case "sidecar", "spread":
			if skewed {
				t.Errorf("%s balancing per request was flagged: %+v", tr.Mesh, tr.Result.Mix)
			}
		}
	}
	stored, err := db.LoadRun(context.Background(), run.ID)
	if err != nil {
		t.Fatal(err)
	}
	var md bytes.Buffer
	if err := report.Render(&md, report.Markdown, stored, nil, report.Options{}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| none | request mix matches the graph's weights | FAIL | 1 of 1 trials off by more than 10 points",
		"balancing: per-connection: the service VIPs pick an endpoint per connection, as kube-proxy does",
		"| sidecar | request mix matches the graph's weights | PASS |", "| spread | request mix matches the graph's weights | PASS | 0 of 1 trials",
		"balancing: per-request: each caller picks a pod per request"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("report does not say %q", want)
		}
	}
	// Which version the kept-alive connection reached is chance. Nearly all traffic goes
	// to it, but not always all: when a response is slow, the generator and front open a
	// second connection, which the VIP may send to the other version (seen once: 97/3).
	if !regexp.MustCompile(`back v[12] (9\d|100)% \(intended 50%\)`).MatchString(md.String()) ||
		!regexp.MustCompile(`back v[12] \d% \(intended 50%\)`).MatchString(md.String()) {
		t.Error("report does not name the version that served nearly everything and the one that served nearly nothing")
	}
	if t.Failed() {
		t.Log(md.String())
	}
}
