package runner

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/study"
)

// Every shipped example study runs to completion on this machine, shrunk in time (one
// repeat, seconds instead of minutes, fewer steps and users) but not in shape: the same
// meshes, experiment kinds, relative rates and placement.
func TestExamplesRun(t *testing.T) {
	needRoot(t)
	if testing.Short() {
		t.Skip("runs every example study")
	}
	files, err := filepath.Glob("../../examples/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			st, err := study.ParseFile(f)
			if err != nil {
				t.Fatal(err)
			}
			shrink(st)
			run, _ := runStudy(t, st)
			seen := map[string]bool{}
			for _, tr := range run.Trials {
				seen[tr.Mesh+"/"+tr.Experiment] = true
				if tr.Kind == results.KindSecurity {
					if e := st.Experiment(tr.Experiment); len(tr.Result.Security) != len(e.Probes) {
						t.Errorf("security trial on %s: %d probe results, want %d", tr.Mesh, len(tr.Result.Security), len(e.Probes))
					}
					continue
				}
				if tr.Result.Requests == 0 {
					t.Errorf("trial %s/%s step %d completed no request", tr.Mesh, tr.Experiment, tr.Params.Step)
				}
			}
			for _, m := range st.Spec.Meshes {
				for _, e := range st.Spec.Experiments {
					if !seen[m.Name+"/"+e.Name] {
						t.Errorf("no trial of %s on %s", e.Name, m.Name)
					}
				}
			}
		})
	}
}

// shrink keeps a study's shape and cuts its time to seconds.
func shrink(st *study.Study) {
	cap := func(d *study.Duration, limit time.Duration) {
		if d.D() > limit {
			*d = study.Duration(limit)
		}
	}
	st.Spec.Repeats = 1
	for i := range st.Spec.Experiments {
		e := &st.Spec.Experiments[i]
		// An experiment's own repeats stay in shape (more than one where the file
		// asks for many short blocks) but few; a capacity search is the costly one.
		if e.Repeats > 0 {
			e.Repeats = min(e.Repeats, 2)
		}
		if e.Kind == study.KindCapacity {
			e.Repeats = 0
		}
		cap(&e.Duration, 2*time.Second)
		cap(&e.Warmup, 500*time.Millisecond)
		cap(&e.Each, time.Second)
		if e.Kind == study.KindSteps && e.To > e.From+2*e.Step {
			e.To = e.From + 2*e.Step
		}
		if len(e.Connections) > 2 {
			e.Connections = e.Connections[:2]
		}
		if e.Requests > 500 {
			e.Requests = 500
		}
		if e.Kind == study.KindUsers {
			e.Users = min(e.Users, 20)
			e.SpawnRate = max(e.SpawnRate, 20)
			e.ThinkTime = study.DurationRange{Min: 10 * time.Millisecond, Max: 50 * time.Millisecond}
		}
		if e.Search != nil {
			e.Search.Precision = 25
		}
	}
}
