package runner

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/load"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/store"
	"github.com/meshmark/meshmark/internal/study"
)

// Every platform's load run becomes a stored trial through measureOn: the platform
// drives the load and reads the system under test around it (Drive), and measureOn
// alone decides the trial's window, flags, warnings, faults and errors. Here the load
// is the real engine against a real HTTP server on loopback and the store real SQLite;
// what a platform would read of its system under test (a kubelet's shortfall, a
// version's share, a fault) is given as that platform's reading would give it, since
// making a real kubelet fail on cue is the subject of the Kubernetes tests
// (TestKubernetesTrialStoresContainerResources, TestKilledSidecarIsAFaultOnBothPlatforms).
func TestOneTrialAssemblyForEveryPlatform(t *testing.T) {
	ctx := context.Background()
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(status) }))
	defer srv.Close()

	db, err := store.Open(ctx, filepath.Join(t.TempDir(), "results.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var out bytes.Buffer
	r := &runner{study: parseStudy(t, `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: assembly}
spec:
  workload: {graph: bookinfo}
  meshes: [{name: a, profile: none}]
  experiments: [{name: latency, kind: fixed-rate, rate: 200, duration: 1s, warmup: 200ms}]
`), opts: Options{Store: db, Progress: &out}}
	if err := r.prepare(); err != nil {
		t.Fatal(err)
	}
	if err := r.createRun(ctx); err != nil {
		t.Fatal(err)
	}
	trial := &r.plan[0]
	spec, err := r.loadSpec(trial, Load{Target: func(_ *study.Experiment, path string) string { return srv.URL + path }},
		loadRun{rate: 200, conns: 2, length: time.Second, warmup: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// drive runs the load for real and hands measureOn what the platform read beside it.
	drive := func(read func(*Evidence)) Drive {
		return func(ctx context.Context, spec load.Spec, progress func(load.Progress)) Evidence {
			ev := driveInProcess(ctx, spec, progress)
			read(&ev)
			return ev
		}
	}
	params := func() results.TrialParams { return results.TrialParams{RequestedRate: 200} }

	// ownFlags are a trial's flags but the engine's own generator-behind, which a loaded
	// machine may raise on any of these runs: what the engine judges is the load
	// package's subject, not measureOn's.
	ownFlags := func(tr results.Trial) []string {
		return slices.DeleteFunc(slices.Clone(tr.Result.Flags), func(f string) bool { return f == results.FlagGeneratorBehind })
	}

	// A clean run: stored with its measured window and no flag.
	res, err := r.measureOn(ctx, trial, drive(func(*Evidence) {}), spec, params())
	if err != nil {
		t.Fatal(err)
	}
	clean := r.run.Trials[0]
	if clean.Result.Requests != res.Completed || len(ownFlags(clean)) != 0 || clean.WarmupTrimmed != spec.Warmup ||
		!clean.Start.Equal(res.Start.Add(spec.Warmup)) || clean.End.Sub(clean.Start) != res.Elapsed {
		t.Errorf("clean trial: %d requests of %d, flags %v, window %s–%s; want every measured request, no flag, the window after the warm-up",
			clean.Result.Requests, res.Completed, clean.Result.Flags, clean.Start, clean.End)
	}

	// What a cluster reads short, a skewed mix and a generator behind: each flags the
	// trial, and each is said.
	_, err = r.measureOn(ctx, trial, drive(func(ev *Evidence) {
		ev.Via = ", through 2 load generators"
		ev.Warnings = []Warning{{Flag: "resources-incomplete", Key: "resource_warning", Msg: "resources incomplete: node b did not answer"}}
		// bookinfo's reviews splits its requests evenly over v1, v2 and v3.
		ev.Served, ev.ServedRead = map[Version]int64{{"reviews", "v1"}: 900, {"reviews", "v2"}: 50, {"reviews", "v3"}: 50}, true
		ev.Behind = []string{"its process used 0.99 of its core"}
	}), spec, params())
	if err != nil {
		t.Fatal(err)
	}
	flagged := r.run.Trials[1]
	for _, f := range []string{"resources-incomplete", results.FlagMixSkewed, results.FlagGeneratorBehind} {
		if !flagged.Result.HasFlag(f) {
			t.Errorf("flags %v: want %s", flagged.Result.Flags, f)
		}
	}
	if flagged.Params.Extra["resource_warning"] != "resources incomplete: node b did not answer" || !flagged.Result.Generator.Behind {
		t.Errorf("params %v, generator %+v: want the warning kept and the generator behind", flagged.Params.Extra, flagged.Result.Generator)
	}
	for _, said := range []string{
		"warning: resources incomplete: node b did not answer in latency 200 req/s on a; this trial is flagged",
		"warning: request mix off by more than",
		"warning: a load generator fell behind in latency 200 req/s on a (its process used 0.99 of its core",
	} {
		if !strings.Contains(out.String(), said) {
			t.Errorf("progress does not say %q:\n%s", said, out.String())
		}
	}

	// A fault: the trial is stored flagged, and the walk is told to measure again.
	fault := results.Fault{Pod: "productpage-v1-0", Process: "istio-proxy", At: time.Now(), Exit: "exit code 137 (Error)"}
	_, err = r.measureOn(ctx, trial, drive(func(ev *Evidence) { ev.Faults = []results.Fault{fault} }), spec, params())
	var fe *faultError
	if !errors.As(err, &fe) || len(fe.faults) != 1 || fe.faults[0].Process != "istio-proxy" {
		t.Fatalf("a run with a fault returned %v; want a fault error naming istio-proxy", err)
	}
	if got := r.run.Trials[2]; !got.Result.HasFlag(results.FlagFault) || len(got.Result.Faults) != 1 {
		t.Errorf("fault trial: flags %v, faults %v; want it flagged with the fault", got.Result.Flags, got.Result.Faults)
	}

	// No request succeeded: nothing stored, and the error says through what and how the
	// generator ended.
	status = http.StatusInternalServerError
	_, err = r.measureOn(ctx, trial, drive(func(ev *Evidence) {
		ev.Via, ev.Ended = ", through 2 load generators", "; the load generator exited: exit status 1"
	}), spec, params())
	if err == nil || !regexp.MustCompile(`^latency 200 req/s on a, repeat 1, through 2 load generators: no request succeeded: \d+ measured, all failed \(non-2xx \d+\).*; the load generator exited: exit status 1$`).MatchString(err.Error()) {
		t.Errorf("no success: %v", err)
	}
	stored, err := db.LoadRun(ctx, r.run.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(stored.Trials) != 3 {
		t.Fatalf("%d trials stored, want 3 (the failed run stores none)", len(stored.Trials))
	}
	for i, want := range [][]string{nil, ownFlags(flagged), {results.FlagFault}} {
		if got := ownFlags(stored.Trials[i]); !slices.Equal(got, want) {
			t.Errorf("stored trial %d: flags %v, want %v", i, got, want)
		}
	}
}

// driveInProcess runs a load run with the real engine in this process, as a platform's
// Drive with nothing of a system under test to read.
func driveInProcess(ctx context.Context, spec load.Spec, progress func(load.Progress)) Evidence {
	cfg, err := spec.Config(nil)
	if err != nil {
		return Evidence{Err: err}
	}
	cfg.Progress = progress
	res, err := load.Run(ctx, cfg)
	return Evidence{Result: res, Err: err}
}
