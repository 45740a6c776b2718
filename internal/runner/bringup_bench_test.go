package runner

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/study"
)

// fanoutGraph is issue 16's 100-pod graph: a root calling nine leaf services of
// eleven pods each (one root pod, 99 leaf pods, 100 workload pods and the load
// generator).
func fanoutGraph() string {
	var b strings.Builder
	b.WriteString("name: fanout-100\nservices:\n  - name: root\n    isEntrypoint: true\n    script:\n")
	for i := range 9 {
		fmt.Fprintf(&b, "      - call: leaf%d\n", i)
	}
	for i := range 9 {
		fmt.Fprintf(&b, "  - name: leaf%d\n    replicas: 11\n", i)
	}
	return b.String()
}

// BenchmarkBringUp100Pods brings the 100-pod graph up under envoy-sidecar (a sidecar in
// every pod, the enrollment check along the graph's edges) and under the baseline,
// and reports the seconds each took from nothing to checked, with its phases in the
// log. A measurement of this machine, not a pass/fail test:
//
//	go test -run XXX -bench BringUp100Pods -benchtime 1x ./internal/runner/
func BenchmarkBringUp100Pods(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	dir := b.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "fanout.yaml"), []byte(fanoutGraph()), 0o644); err != nil {
		b.Fatal(err)
	}
	doc := `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: bench-bring-up-100}
spec:
  substrate:
    local: {nodes: 2, loadgenNode: 1}
  workload: {graph: fanout.yaml}
  meshes:
    - {name: none, profile: none}
    - {name: sidecar, profile: envoy-sidecar, options: {mtls: strict}}
  experiments:
    - {name: latency, kind: fixed-rate, rate: 10, duration: 1s, warmup: 100ms}
`
	path := filepath.Join(dir, "study.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		b.Fatal(err)
	}
	st, err := study.ParseFile(path)
	if err != nil {
		b.Fatal(err)
	}
	r := &runner{study: st, opts: Options{PodBinary: podBin}, capacities: map[string]map[string][]float64{}}
	if err := r.prepare(); err != nil {
		b.Fatal(err)
	}
	r.saveCPUs()
	defer func() { _ = r.unpin() }()
	for range b.N {
		for i := range st.Spec.Meshes {
			m := &st.Spec.Meshes[i]
			start := time.Now()
			d, err := r.bringUp(context.Background(), m)
			took := time.Since(start)
			if err != nil {
				b.Fatalf("%s: %v", m.Name, err)
			}
			pods := len(d.app.Pods())
			b.Logf("%s: %d pods up and checked in %s (%s)", m.Name, pods, took.Round(time.Millisecond), strings.Join(d.phases, ", "))
			d.close()
			b.ReportMetric(took.Seconds(), "s-"+m.Name)
		}
	}
}
