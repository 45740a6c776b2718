package cli

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/meshmark/meshmark/internal/study"
)

// spec.results.dir decides where a run's database goes unless --db or $MESHMARK_DB
// says otherwise; it is relative to the study file and created when missing.
func TestStudyDBFollowsResultsDir(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "s.yaml")
	doc := "apiVersion: meshmark.dev/v1alpha1\nkind: Study\nmetadata: {name: s}\nspec:\n  workload: {graph: bookinfo}\n" +
		"  meshes: [{name: none, profile: none}]\n  experiments: [{kind: security}]\n  results: {dir: out/db}\n"
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := study.ParseFile(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("MESHMARK_DB", "")
	got, err := studyDB(st, "")
	if want := filepath.Join(dir, "out", "db", "results.db"); err != nil || got != want {
		t.Fatalf("studyDB = %q, %v; want %q", got, err, want)
	}
	if fi, err := os.Stat(filepath.Dir(got)); err != nil || !fi.IsDir() {
		t.Errorf("results dir not created: %v", err)
	}
	if got, _ := studyDB(st, "/elsewhere.db"); got != "/elsewhere.db" {
		t.Errorf("--db overridden by the study: %q", got)
	}
	t.Setenv("MESHMARK_DB", "/env.db")
	if got, _ := studyDB(st, ""); got != "" {
		t.Errorf("$MESHMARK_DB overridden by the study: %q", got)
	}
}
