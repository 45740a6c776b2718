package runner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/study"
)

// recordingPlatform stands in for a testbed or a cluster in the tests of runPlan's walk
// over the plan (which bring-ups, teardowns and measurements, in which order); what a
// real platform does at each step is the subject of the runner's other tests, which run
// the same walk on the local testbed, and of the Kubernetes tests on real nodes.
type recordingPlatform struct {
	events []string
	// failBringUp makes the bring-up of this mesh fail after creating its deployment.
	failBringUp string
	ups         int
}

type recorded struct{ name string }

func (p *recordingPlatform) BringUp(_ context.Context, t *study.Trial) (*recorded, error) {
	p.ups++
	d := &recorded{name: fmt.Sprintf("%s#%d", t.Mesh.Name, p.ups)}
	p.events = append(p.events, "up "+d.name)
	if t.Mesh.Name == p.failBringUp {
		return d, errors.New("its pods never became ready")
	}
	return d, nil
}

func (p *recordingPlatform) Measure(_ context.Context, d *recorded, t *study.Trial) error {
	p.events = append(p.events, fmt.Sprintf("measure %s r%d on %s", t.Mesh.Name, t.Repeat, d.name))
	return nil
}

func (p *recordingPlatform) TearDown(d *recorded, final bool) {
	if final {
		p.events = append(p.events, "down "+d.name+" (final)")
	} else {
		p.events = append(p.events, "down "+d.name)
	}
}
func (p *recordingPlatform) Finish() { p.events = append(p.events, "finish") }

func planRunner(t *testing.T, keepUp string) *runner {
	t.Helper()
	doc := `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: walk}
spec:
  workload: {graph: bookinfo}
  meshes:
    - {name: a, profile: none}
    - {name: b, profile: envoy-sidecar}
  experiments:
    - {name: latency, kind: fixed-rate, rate: 100, duration: 1s, warmup: 100ms}
  repeats: 2
  order: sequential
` + keepUp
	st, err := study.Parse("walk.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return &runner{study: st, plan: st.Plan(), run: &results.Run{}, progress: newProgress(nil, false, 0)}
}

// One mesh is up at a time: each is brought up once for its consecutive trials and torn
// down before the next comes up; the platform is finished after the last teardown.
func TestRunPlanBringsOneMeshUpAtATime(t *testing.T) {
	r, p := planRunner(t, ""), &recordingPlatform{}
	if err := runPlan(context.Background(), r, p); err != nil {
		t.Fatal(err)
	}
	want := []string{"up a#1", "measure a r0 on a#1", "measure a r1 on a#1", "down a#1",
		"up b#2", "measure b r0 on b#2", "measure b r1 on b#2", "down b#2 (final)", "finish"}
	if !slices.Equal(p.events, want) {
		t.Errorf("walk:\n  %s\nwant\n  %s", strings.Join(p.events, "\n  "), strings.Join(want, "\n  "))
	}
}

// Interleaved repeats bring each mesh up again: every teardown that makes way for a
// bring-up is not final (a cluster run with cleanup: false removes it all the same, or
// the next install would meet it), and only the deployment up when the run ends is.
func TestRunPlanKeepsOnlyWhatIsUpAtTheEnd(t *testing.T) {
	r, p := planRunner(t, ""), &recordingPlatform{}
	r.study.Spec.Order = "interleaved"
	r.plan = r.study.Plan()
	if err := runPlan(context.Background(), r, p); err != nil {
		t.Fatal(err)
	}
	ups := map[string]int{}
	for i, e := range p.events {
		if mesh, ok := strings.CutPrefix(e, "up "); ok {
			ups[mesh[:1]]++
		}
		final := strings.HasSuffix(e, "(final)")
		if last := i == len(p.events)-2; strings.HasPrefix(e, "down ") && final != last {
			t.Errorf("event %d %q: only the teardown at the run's end is final", i, e)
		}
	}
	if ups["a"] < 1 || ups["b"] < 1 || ups["a"]+ups["b"] < 3 || p.events[len(p.events)-1] != "finish" {
		t.Errorf("walk brought up %v; want a mesh brought up twice (its repeats interleaved with the other's):\n  %s", ups, strings.Join(p.events, "\n  "))
	}
}

// With keepMeshesUp the first mesh stays up while the second is measured, and both are
// torn down at the end.
func TestRunPlanKeepsMeshesUp(t *testing.T) {
	r, p := planRunner(t, "  keepMeshesUp: true\n"), &recordingPlatform{}
	if err := runPlan(context.Background(), r, p); err != nil {
		t.Fatal(err)
	}
	want := []string{"up a#1", "measure a r0 on a#1", "measure a r1 on a#1",
		"up b#2", "measure b r0 on b#2", "measure b r1 on b#2", "down a#1 (final)", "down b#2 (final)", "finish"}
	if !slices.Equal(p.events, want) {
		t.Errorf("walk:\n  %s\nwant\n  %s", strings.Join(p.events, "\n  "), strings.Join(want, "\n  "))
	}
}

// A bring-up that fails after creating its deployment stops the run, and what it created
// is torn down with the rest before the platform is finished.
func TestRunPlanTearsDownAFailedBringUp(t *testing.T) {
	r, p := planRunner(t, "  keepMeshesUp: true\n"), &recordingPlatform{failBringUp: "b"}
	err := runPlan(context.Background(), r, p)
	if err == nil || !strings.Contains(err.Error(), "never became ready") {
		t.Fatalf("run: %v, want the bring-up's error", err)
	}
	want := []string{"up a#1", "measure a r0 on a#1", "measure a r1 on a#1", "up b#2", "down a#1 (final)", "down b#2 (final)", "finish"}
	if !slices.Equal(p.events, want) {
		t.Errorf("walk:\n  %s\nwant\n  %s", strings.Join(p.events, "\n  "), strings.Join(want, "\n  "))
	}
}
