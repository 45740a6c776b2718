package runner

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/load"
	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/store"
	"github.com/meshmark/meshmark/internal/study"
)

// loopbackPlatform is a platform of the test's own, written against the seam alone as
// a package of its own would be (kubeplatform is the real one): its deployment of a
// mesh is an HTTP server on loopback, and it drives load with the real engine in this
// process. It stands in for a platform no machine here offers, to show that the
// runner's walk, translation and trial assembly need nothing more of one.
type loopbackPlatform struct {
	h      *Host
	events []string
}

type loopbackDeployment struct {
	mesh string
	srv  *httptest.Server
}

func (p *loopbackPlatform) BringUp(ctx context.Context, t *study.Trial) (*loopbackDeployment, error) {
	d := &loopbackDeployment{mesh: t.Mesh.Name, srv: httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))}
	p.events = append(p.events, "up "+d.mesh)
	return d, p.h.StoreEnrollment(ctx, d.mesh, mesh.Enrollment{Mesh: d.mesh, Pass: true})
}

func (p *loopbackPlatform) Measure(ctx context.Context, d *loopbackDeployment, t *study.Trial) error {
	return p.h.RunLoad(t, Load{
		Target: func(_ *study.Experiment, path string) string { return d.srv.URL + path },
		Measure: func(spec load.Spec, params results.TrialParams) (*load.Result, error) {
			return p.h.MeasureOn(ctx, t, driveInProcess, spec, params)
		},
	})
}

func (p *loopbackPlatform) TearDown(d *loopbackDeployment, _ bool) {
	d.srv.Close()
	p.events = append(p.events, "down "+d.mesh)
}

func (p *loopbackPlatform) Finish() { p.events = append(p.events, "finish") }

const seamStudy = `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: seam}
spec:
  substrate:
    kubernetes: {image: meshmark:dev}
  workload: {graph: bookinfo}
  meshes:
    - {name: a, profile: none}
    - {name: b, profile: none}
  experiments:
    - {name: latency, kind: fixed-rate, rate: 100, duration: 1s, warmup: 200ms}
    - {name: conns, kind: connections, connections: [2, 4], duration: 1s, warmup: 200ms}
  repeats: 2
`

// localSeamStudy is seamStudy on the local testbed.
var localSeamStudy = strings.Replace(seamStudy, "kubernetes: {image: meshmark:dev}", "local: {nodes: 2}", 1)

// withPlatforms runs f with only the given platforms registered.
func withPlatforms(t *testing.T, kinds []PlatformKind, f func()) {
	t.Helper()
	platformsMu.Lock()
	saved := platforms
	platforms = map[string]PlatformKind{}
	platformsMu.Unlock()
	defer func() {
		platformsMu.Lock()
		platforms = saved
		platformsMu.Unlock()
	}()
	for _, k := range kinds {
		RegisterPlatform(k)
	}
	f()
}

// A platform registered from outside the runner runs a whole study through Run: the
// runner's plan walk, its one translation of experiments into load and its one
// assembly of trials, over the platform's bring-ups and load, store every trial as they
// do on the local testbed and on a cluster.
func TestARegisteredPlatformRunsAStudy(t *testing.T) {
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "results.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var p *loopbackPlatform
	kind := PlatformKind{
		Substrate: "kubernetes",
		Check:     func(*Host) error { return nil },
		Open: func(_ context.Context, h *Host) (func(context.Context) error, error) {
			h.Describe("loopback", nil)
			p = &loopbackPlatform{h: h}
			return func(ctx context.Context) error { return Walk(ctx, h, p) }, nil
		},
	}
	withPlatforms(t, []PlatformKind{kind}, func() {
		run, err := Run(context.Background(), parseStudy(t, seamStudy), Options{Store: db, Progress: testWriter{t}})
		if err != nil {
			t.Fatal(err)
		}
		stored, err := db.LoadRun(context.Background(), run.ID)
		if err != nil {
			t.Fatal(err)
		}
		// 2 meshes × 2 repeats × (1 latency run + 2 connection counts).
		if stored.Substrate != "loopback" || stored.Status != results.StatusComplete || len(stored.Trials) != 12 {
			t.Fatalf("run on %s, %s, %d trials; want complete on loopback with 12", stored.Substrate, stored.Status, len(stored.Trials))
		}
		for _, tr := range stored.Trials {
			if tr.Result.Requests == 0 || tr.Result.Errors != 0 || tr.End.Sub(tr.Start) <= 0 {
				t.Errorf("%s %s repeat %d: %d requests, %d errors, window %s", tr.Mesh, tr.Experiment, tr.Repeat, tr.Result.Requests, tr.Result.Errors, tr.End.Sub(tr.Start))
			}
		}
		for _, m := range []string{"a", "b"} {
			if rm := stored.Mesh(m); rm == nil || len(rm.Enrollment) == 0 {
				t.Errorf("mesh %s: no enrollment stored", m)
			}
		}
		if got := strings.Join(p.events, ", "); !strings.HasSuffix(got, "finish") || strings.Count(got, "up ") != strings.Count(got, "down ") {
			t.Errorf("bring-ups and teardowns: %s; want each torn down, then the platform finished", got)
		}
	})
	// A study that names a substrate no package of this build registered is refused at
	// its field, not run on the local testbed.
	withPlatforms(t, nil, func() {
		_, err := Run(context.Background(), parseStudy(t, seamStudy), Options{Store: db})
		if err == nil || !strings.Contains(err.Error(), "spec.substrate.kubernetes") || !strings.Contains(err.Error(), "no platform for substrate kubernetes") {
			t.Errorf("unregistered substrate: %v", err)
		}
		if err := Check(parseStudy(t, seamStudy)); err == nil || !strings.Contains(err.Error(), "no platform for substrate kubernetes") {
			t.Errorf("validate of an unregistered substrate: %v", err)
		}
		// The local testbed is a registered platform like any other, not a fallback
		// of the runner's: without its registration a local study is refused too.
		if _, err := Run(context.Background(), parseStudy(t, localSeamStudy), Options{Store: db}); err == nil || !strings.Contains(err.Error(), "spec.substrate.local") {
			t.Errorf("local study with no platform registered: %v", err)
		}
	})
	if kind, err := platformFor(parseStudy(t, localSeamStudy)); err != nil || kind.Substrate != "local" {
		t.Errorf("the local testbed's platform: %+v, %v; want it registered by the runner", kind, err)
	}
}
