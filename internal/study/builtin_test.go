package study

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"
)

func TestDemoIsBuiltinAndExample(t *testing.T) {
	embedded, err := builtinFS.ReadFile("builtin/demo.yaml")
	if err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile("../../examples/demo.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(embedded, example) {
		t.Fatal("examples/demo.yaml differs from internal/study/builtin/demo.yaml: copy one over the other")
	}
	s, err := Builtin("demo")
	if err != nil {
		t.Fatal(err)
	}
	if s.File != "builtin:demo" || s.Dir != "" {
		t.Errorf("embedded study File %q Dir %q", s.File, s.Dir)
	}
	// The demo's promise: three meshes kept up, a few capacity searches, then many
	// short latency blocks at half the lowest capacity, interleaved, the design that
	// resolves a few percent (docs/report.md); and its load fits in five minutes,
	// leaving the rest of six to bring-ups and setup.
	if len(s.Spec.Meshes) != 3 || !s.Spec.KeepMeshesUp || s.Spec.Order != Interleaved || s.BaselineMesh().Profile != ProfileNone {
		t.Errorf("demo shape: %+v", s.Spec)
	}
	capacity, latency := s.Experiment("capacity"), s.Experiment("latency")
	if capacity == nil || latency == nil || s.Spec.RepeatsOf(capacity) < 2 || s.Spec.RepeatsOf(latency) < 40 || latency.Duration.D() > 1500*time.Millisecond {
		t.Errorf("demo experiments: capacity %+v, latency %+v", capacity, latency)
	}
	var load time.Duration
	for _, tr := range s.Plan() {
		load += tr.Experiment.Duration.D() + tr.Experiment.Warmup.D()
	}
	if load > 5*time.Minute {
		t.Errorf("demo load alone takes %v; bring-ups and setup need the rest of 6 minutes", load)
	}
	if _, err := Builtin("nope"); err == nil {
		t.Error("unknown built-in study accepted")
	}
	if _, err := Load("no-such-study.yaml"); err == nil || !strings.Contains(err.Error(), "built-in: demo") {
		t.Errorf("Load of a missing file: %v", err)
	}
	if loaded, err := Load("demo"); err != nil || loaded.Metadata.Name != "demo" {
		t.Errorf("Load(demo): %v", err)
	}
}
