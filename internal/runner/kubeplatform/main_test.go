package kubeplatform

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/podcmd/podcmdtest"
	"github.com/meshmark/meshmark/internal/study"
)

// podBin is meshmark-pod, built once, which the stand-in load generators run.
var podBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "meshmark-kubeplatform-test-")
	if err != nil {
		panic(err)
	}
	if podBin, err = podcmdtest.Build(dir); err != nil {
		panic(err)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func parseStudy(t *testing.T, yaml string) *study.Study {
	t.Helper()
	path := filepath.Join(t.TempDir(), "study.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := study.ParseFile(path)
	if err != nil {
		t.Fatalf("study: %v", err)
	}
	return st
}

// testWriter logs the run's progress with the test.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
