package study

import (
	"bytes"
	"os"
	"strings"
	"testing"
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
	// The demo's promise: three meshes, capacity then 75% of the lowest, three
	// interleaved repeats, and short enough to finish in under five minutes.
	if len(s.Spec.Meshes) != 3 || s.Spec.Repeats != 3 || s.Spec.Order != Interleaved || s.BaselineMesh().Profile != ProfileNone {
		t.Errorf("demo shape: %+v", s.Spec)
	}
	var measured int64
	for _, tr := range s.Plan() {
		measured += int64(tr.Experiment.Duration)
	}
	if budget := int64(4 * 60 * 1e9); measured > budget*3/4 {
		t.Errorf("demo load alone takes %v; bring-ups need the rest of 4 minutes", measured/1e9)
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
