package store

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/results"
)

func openTemp(t *testing.T) (*Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "results.db")
	s, err := Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, path
}

func sampleRun() *results.Run {
	return &results.Run{
		Study: "s1-bookinfo", StudyPath: "/tmp/s1.yaml", StudyFile: []byte("name: s1-bookinfo\n"), Seed: 42, Substrate: "local",
		Provenance: results.Provenance{Kernel: "6.1.0", CPUModel: "Test CPU", Cores: 2, MeshmarkVersion: "test",
			Components: map[string]string{"envoy": "1.40.0"}, Placement: map[string]string{"generator": "cpu0"},
			Configs: []results.GeneratedConfig{results.NewGeneratedConfig("envoy-productpage.yaml", "sidecar", "envoy", []byte("static_resources: {}\n"))}},
		Meshes: []results.Mesh{
			{Label: "none", Profile: "none"},
			{Label: "sidecar", Profile: "envoy-sidecar", Options: map[string]string{"mtls": "strict", "concurrency": "2"}},
		},
	}
}

// syntheticTrial draws n latencies from an exponential distribution with the given
// mean plus a fixed floor, in microseconds, spread over one-second intervals.
func syntheticTrial(rng *rand.Rand, mesh string, repeat, n int, start time.Time) *results.Trial {
	const seconds = 5
	lat, svc, lag := results.NewLatencyHistogram(), results.NewLatencyHistogram(), results.NewLatencyHistogram()
	ivs := make([]results.Interval, seconds)
	for i := range ivs {
		ivs[i] = results.Interval{Start: start.Add(time.Duration(i) * time.Second), Duration: time.Second,
			RequestedRate: float64(n) / seconds, Histogram: results.NewLatencyHistogram()}
	}
	for i := 0; i < n; i++ {
		v := 200 + int64(rng.ExpFloat64()*500)
		_ = lat.RecordValue(v)
		_ = svc.RecordValue(v - 20)
		_ = lag.RecordValue(1 + int64(rng.IntN(40)))
		iv := &ivs[i*seconds/n]
		_ = iv.Histogram.RecordValue(v)
		iv.Count++
	}
	for i := range ivs {
		ivs[i].AchievedRate = float64(ivs[i].Count)
	}
	return &results.Trial{Repeat: repeat, Mesh: mesh, Experiment: "fixed-1000", Kind: results.KindFixedRate,
		Params:        results.TrialParams{RequestedRate: float64(n) / seconds, Connections: 16, KeepAlive: true, Path: "internal"},
		WarmupTrimmed: 2 * time.Second, Start: start, End: start.Add(seconds * time.Second),
		Result: results.TrialResult{Requests: int64(n), Errors: 2, Latency: lat, ServiceTime: svc, Intervals: ivs,
			StatusCodes: map[int]int64{200: int64(n - 2), 503: 2}, ErrorsByKind: map[string]int64{"http-5xx": 2},
			Generator: results.GeneratorHealth{SendLag: lag, LateSends: 3, PeakInFlight: 17, CPUUserSeconds: 0.5},
			Resources: []results.ResourceSample{{Component: "envoy", Role: "proxy", Pod: "productpage-0", Node: "node-1", Mesh: mesh,
				T: start.Add(time.Second), CPUUserSeconds: 1.25, CPUSysSeconds: 0.5, RSSBytes: 50 << 20, PSSBytes: 40 << 20, Threads: 9,
				VoluntaryCtx: 100, InvoluntaryCtx: 7}},
			ProxyStats: []results.ProxyStats{{Component: "envoy", Pod: "productpage-0", Mesh: mesh, T: start.Add(5 * time.Second),
				Stats: json.RawMessage(`{"stats":[{"name":"http.inbound.downstream_rq_total","value":5000}]}`)}},
			Network: []results.NetSample{
				{Pod: "productpage-0", Node: "node-1", Mesh: mesh, Interface: "eth0", T: start, RxBytes: 1 << 33, TxBytes: 12345,
					RxPackets: 100, TxPackets: 90, RxDropped: 1, TxDropped: 2},
				{Pod: "productpage-0", Node: "node-1", Mesh: mesh, Interface: "eth0", T: start.Add(5 * time.Second), RxBytes: 1<<33 + 500000,
					TxBytes: 912345, RxPackets: 600, TxPackets: 590, RxDropped: 1, TxDropped: 3},
				{Pod: "productpage-0", Node: "node-1", Mesh: mesh, Interface: "lo", T: start.Add(5 * time.Second)}}}}
}

var quantiles = []float64{0, 1, 10, 50, 75, 90, 99, 99.9, 99.99, 100}

func TestRoundTripIsLossless(t *testing.T) {
	ctx := context.Background()
	s, path := openTemp(t)
	run := sampleRun()
	if err := s.CreateRun(ctx, run); err != nil {
		t.Fatal(err)
	}
	if err := s.SetEnrollment(ctx, run.ID, "sidecar", json.RawMessage(`{"mtls_on_wire":true,"pods_enrolled":6}`)); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 7))
	start := time.Date(2026, 11, 22, 4, 0, 0, 123456789, time.UTC)
	var written []*results.Trial
	for rep := 0; rep < 2; rep++ {
		for _, m := range []string{"none", "sidecar"} {
			tr := syntheticTrial(rng, m, rep, 5000, start)
			if err := s.AddTrial(ctx, run.ID, tr); err != nil {
				t.Fatal(err)
			}
			if tr.ID == 0 {
				t.Fatal("AddTrial did not set the trial id")
			}
			written = append(written, tr)
			start = start.Add(10 * time.Second)
		}
	}
	if err := s.FinishRun(ctx, run.ID, results.StatusComplete, ""); err != nil {
		t.Fatal(err)
	}
	s.Close()

	s2, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	got, err := s2.LoadRun(ctx, run.ID[:5])
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != results.StatusComplete || got.Ended.IsZero() {
		t.Errorf("status %s ended %v, want complete with an end time", got.Status, got.Ended)
	}
	if got.Study != run.Study || string(got.StudyFile) != string(run.StudyFile) || got.Seed != 42 || got.Provenance.Components["envoy"] != "1.40.0" {
		t.Errorf("run fields lost: %+v", got)
	}
	if len(got.Provenance.Configs) != 1 || got.Provenance.Configs[0].SHA256 != results.SHA256Hex([]byte("static_resources: {}\n")) {
		t.Errorf("configs: %+v", got.Provenance.Configs)
	}
	if len(got.Meshes) != 2 || got.Meshes[1].Options["mtls"] != "strict" || !strings.Contains(string(got.Meshes[1].Enrollment), "mtls_on_wire") {
		t.Errorf("meshes: %+v", got.Meshes)
	}
	if len(got.Trials) != len(written) {
		t.Fatalf("%d trials loaded, %d written", len(got.Trials), len(written))
	}
	for i, w := range written {
		g := got.Trials[i]
		if g.ID != w.ID || g.Mesh != w.Mesh || g.Repeat != w.Repeat || !g.Start.Equal(w.Start) || !g.End.Equal(w.End) ||
			g.WarmupTrimmed != w.WarmupTrimmed || !reflect.DeepEqual(g.Params, w.Params) {
			t.Errorf("trial %d header differs:\n got %+v\nwant %+v", i, g, w)
		}
		for _, q := range quantiles {
			if a, b := w.Result.Latency.ValueAtQuantile(q), g.Result.Latency.ValueAtQuantile(q); a != b {
				t.Errorf("trial %d latency p%v: wrote %d, read %d", i, q, a, b)
			}
			if a, b := w.Result.ServiceTime.ValueAtQuantile(q), g.Result.ServiceTime.ValueAtQuantile(q); a != b {
				t.Errorf("trial %d service p%v: wrote %d, read %d", i, q, a, b)
			}
			if a, b := w.Result.Generator.SendLag.ValueAtQuantile(q), g.Result.Generator.SendLag.ValueAtQuantile(q); a != b {
				t.Errorf("trial %d send lag p%v: wrote %d, read %d", i, q, a, b)
			}
		}
		if g.Result.Latency.TotalCount() != 5000 || g.Result.Requests != 5000 || g.Result.Errors != 2 {
			t.Errorf("trial %d counts: %d recorded, %d requests, %d errors", i, g.Result.Latency.TotalCount(), g.Result.Requests, g.Result.Errors)
		}
		if len(g.Result.Intervals) != 5 {
			t.Fatalf("trial %d: %d intervals", i, len(g.Result.Intervals))
		}
		for j, iv := range g.Result.Intervals {
			wi := w.Result.Intervals[j]
			if !iv.Histogram.Equals(wi.Histogram) || iv.Count != wi.Count || iv.P99 != wi.Histogram.ValueAtQuantile(99) || iv.P99 == 0 {
				t.Errorf("trial %d interval %d differs: %+v", i, j, iv)
			}
		}
		if g.Result.StatusCodes[503] != 2 || g.Result.ErrorsByKind["http-5xx"] != 2 || g.Result.Generator.LateSends != 3 ||
			g.Result.Generator.SendLagP99 != w.Result.Generator.SendLag.ValueAtQuantile(99) {
			t.Errorf("trial %d result fields: %+v", i, g.Result)
		}
		if len(g.Result.Resources) != 1 || g.Result.Resources[0] != w.Result.Resources[0] {
			t.Errorf("trial %d resources: %+v", i, g.Result.Resources)
		}
		if len(g.Result.ProxyStats) != 1 || string(g.Result.ProxyStats[0].Stats) != string(w.Result.ProxyStats[0].Stats) {
			t.Errorf("trial %d proxy stats: %+v", i, g.Result.ProxyStats)
		}
		if !reflect.DeepEqual(g.Result.Network, w.Result.Network) {
			t.Errorf("trial %d network samples:\n got %+v\nwant %+v", i, g.Result.Network, w.Result.Network)
		}
	}
	var exp bytes.Buffer
	if err := WriteJSON(&exp, got); err != nil {
		t.Fatal(err)
	}
	back, err := ReadJSON(&exp)
	if err != nil {
		t.Fatal(err)
	}
	for i := range got.Trials {
		if len(back.Trials[i].Result.Network) != 3 || !reflect.DeepEqual(back.Trials[i].Result.Network, got.Trials[i].Result.Network) {
			t.Errorf("trial %d network samples lost in the JSON export: %+v", i, back.Trials[i].Result.Network)
		}
	}
	list, err := s2.ListRuns(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Trials != 4 || strings.Join(list[0].Meshes, ",") != "none,sidecar" || strings.Join(list[0].Experiments, ",") != "fixed-1000" {
		t.Errorf("list: %+v", list)
	}
}

// A trial's failures timed apart from its answers, what completed inside its window and
// the evidence that its target saturated all come back from the store and from a JSON
// export as written.
func TestSaturationAndFailuresRoundTrip(t *testing.T) {
	ctx := context.Background()
	s, _ := openTemp(t)
	run := sampleRun()
	if err := s.CreateRun(ctx, run); err != nil {
		t.Fatal(err)
	}
	start := time.Date(2026, 11, 22, 4, 0, 0, 0, time.UTC)
	tr := syntheticTrial(rand.New(rand.NewPCG(5, 5)), "sidecar", 0, 1000, start)
	answered, failed := results.NewLatencyHistogram(), results.NewLatencyHistogram()
	answered.Merge(tr.Result.Latency)
	for range 7 {
		_ = failed.RecordValue(2_000_000) // timed out at 2 s
	}
	tr.Result.Latency.Merge(failed)
	tr.Result.AnsweredLatency, tr.Result.FailedLatency = answered, failed
	tr.Result.ErrorsByKind = map[string]int64{"timeout": 7, "non2xx": 2}
	tr.Result.Window = &results.WindowCount{Completed: 980, Succeeded: 971, After: 30}
	tr.Result.Saturation = &results.Saturation{Saturated: true, BacklogFrom: 3, BacklogTo: 240, BacklogLow: 120,
		IntendedRate: 200, CompletedRate: 196, LatencyFromUS: 2100, LatencyToUS: 1_200_000}
	tr.Result.Flags = []string{results.FlagTargetSaturated}
	if err := s.AddTrial(ctx, run.ID, tr); err != nil {
		t.Fatal(err)
	}
	got, err := s.LoadRun(ctx, run.ID)
	if err != nil {
		t.Fatal(err)
	}
	var exp bytes.Buffer
	if err := WriteJSON(&exp, got); err != nil {
		t.Fatal(err)
	}
	back, err := ReadJSON(&exp)
	if err != nil {
		t.Fatal(err)
	}
	for name, r := range map[string]results.TrialResult{"store": got.Trials[0].Result, "JSON export": back.Trials[0].Result} {
		if !r.AnsweredLatency.Equals(answered) || !r.FailedLatency.Equals(failed) || r.Latency.TotalCount() != 1007 {
			t.Errorf("%s: answered %d, failed %d, all %d latencies", name, r.AnsweredLatency.TotalCount(), r.FailedLatency.TotalCount(), r.Latency.TotalCount())
		}
		if !reflect.DeepEqual(r.Window, tr.Result.Window) || !reflect.DeepEqual(r.Saturation, tr.Result.Saturation) || !r.Saturated() ||
			r.Failures() != 7 || r.Served() != 971 {
			t.Errorf("%s: window %+v, saturation %+v, failures %d, served %d", name, r.Window, r.Saturation, r.Failures(), r.Served())
		}
	}
}

func TestResolveRun(t *testing.T) {
	ctx := context.Background()
	s, _ := openTemp(t)
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i, id := range []string{"abc111", "abc222", "def333"} {
		r := sampleRun()
		r.ID, r.Started = id, base.Add(time.Duration(i)*time.Hour)
		if err := s.CreateRun(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	for ref, want := range map[string]string{"last": "def333", "abc1": "abc111", "d": "def333", "abc222": "abc222"} {
		if got, err := s.ResolveRun(ctx, ref); err != nil || got != want {
			t.Errorf("ResolveRun(%q) = %q, %v; want %q", ref, got, err, want)
		}
	}
	if _, err := s.ResolveRun(ctx, "abc"); err == nil || !strings.Contains(err.Error(), "ambiguous") {
		t.Errorf("ambiguous prefix: %v", err)
	}
	if _, err := s.ResolveRun(ctx, "zzz"); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown prefix: %v", err)
	}
	if _, err := s.ResolveRun(ctx, "a%"); !errors.Is(err, ErrNotFound) {
		t.Errorf("LIKE wildcard in a reference must not match: %v", err)
	}
}

func TestTrialsOnlyGoIntoRunningRuns(t *testing.T) {
	ctx := context.Background()
	s, _ := openTemp(t)
	r := sampleRun()
	if err := s.CreateRun(ctx, r); err != nil {
		t.Fatal(err)
	}
	if err := s.FinishRun(ctx, r.ID, results.StatusFailed, "equivalence check failed"); err != nil {
		t.Fatal(err)
	}
	tr := syntheticTrial(rand.New(rand.NewPCG(1, 1)), "none", 0, 100, time.Now())
	if err := s.AddTrial(ctx, r.ID, tr); err == nil {
		t.Error("a trial was added to a failed run")
	}
	if err := s.AddTrial(ctx, "nope", tr); !errors.Is(err, ErrNotFound) {
		t.Errorf("trial into unknown run: %v", err)
	}
	if err := s.FinishRun(ctx, r.ID, results.StatusRunning, ""); err == nil {
		t.Error("FinishRun accepted status running")
	}
}

// A trial stored by a version 5 release kept its saturation evidence as in-flight
// counts under in_flight_* keys; after migrating, the same figures read back as the
// backlog, which is what they were a lower bound of.
func TestVersion5SaturationEvidenceMigrates(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "results.db")
	all := migrations
	migrations = all[:5]
	s, err := Open(ctx, path)
	if err != nil {
		migrations = all
		t.Fatal(err)
	}
	run := sampleRun()
	tr := syntheticTrial(rand.New(rand.NewPCG(6, 6)), "sidecar", 0, 300, time.Date(2026, 11, 24, 4, 0, 0, 0, time.UTC))
	err = s.CreateRun(ctx, run)
	if err == nil {
		err = s.AddTrial(ctx, run.ID, tr)
	}
	if err == nil {
		// the columns are version 5's; the saturation JSON as a version 5 release wrote it
		_, err = s.db.ExecContext(ctx, `UPDATE trials SET saturation = ?`,
			`{"saturated":true,"in_flight_from":3,"in_flight_to":240,"in_flight_low":120,"intended_rate":200,"completed_rate":150,"latency_p50_from_us":2100,"latency_p50_to_us":900000}`)
	}
	s.Close()
	migrations = all
	if err != nil {
		t.Fatal(err)
	}
	s2, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	got, err := s2.LoadRun(ctx, run.ID)
	if err != nil {
		t.Fatal(err)
	}
	want := &results.Saturation{Saturated: true, BacklogFrom: 3, BacklogTo: 240, BacklogLow: 120, IntendedRate: 200, CompletedRate: 150,
		LatencyFromUS: 2100, LatencyToUS: 900000}
	if len(got.Trials) != 1 || !reflect.DeepEqual(got.Trials[0].Result.Saturation, want) {
		t.Fatalf("saturation after migration: %+v, want %+v", got.Trials[0].Result.Saturation, want)
	}
}

// TestVersion1DatabaseMigrates writes a run with the schema of version 1 (the
// migrations are append-only, so migrations[:1] is exactly what that release created),
// reopens it with this build and checks the run survived and network samples can be
// written and read.
func TestVersion1DatabaseMigrates(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "results.db")
	all := migrations
	migrations = all[:1]
	s, err := Open(ctx, path)
	if err != nil {
		migrations = all
		t.Fatal(err)
	}
	old := sampleRun()
	rng := rand.New(rand.NewPCG(3, 3))
	start := time.Date(2026, 11, 20, 4, 0, 0, 0, time.UTC)
	tr := syntheticTrial(rng, "sidecar", 0, 500, start)
	tr.Result.Network = nil // version 1 had nowhere to keep them
	err = s.CreateRun(ctx, old)
	if err == nil {
		// AddTrial writes today's columns; a version 1 release wrote these.
		err = insertVersion1Trial(ctx, s, old.ID, tr)
	}
	if err == nil {
		err = s.FinishRun(ctx, old.ID, results.StatusComplete, "")
	}
	s.Close()
	migrations = all
	if err != nil {
		t.Fatal(err)
	}
	if n := countRows(t, path, `SELECT COUNT(*) FROM sqlite_master WHERE name = 'net_samples'`); n != 0 {
		t.Fatalf("the version 1 database already has net_samples")
	}

	s, err = Open(ctx, path)
	if err != nil {
		t.Fatalf("opening a version 1 database: %v", err)
	}
	defer s.Close()
	var v int
	if err := s.db.QueryRowContext(ctx, `SELECT version FROM schema_version`).Scan(&v); err != nil || v != len(migrations) || SchemaVersion() != len(migrations) {
		t.Fatalf("schema version %d (%v) after migration, want %d", v, err, len(migrations))
	}
	got, err := s.LoadRun(ctx, old.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Trials) != 1 || got.Trials[0].Result.Requests != 500 || len(got.Trials[0].Result.Resources) != 1 || got.Trials[0].Result.Network != nil {
		t.Fatalf("version 1 run after migration: %+v", got.Trials)
	}
	// Before failures were timed, the latency held the answered requests only, and
	// nothing counted what completed inside the window.
	if r := got.Trials[0].Result; r.AnsweredLatency != r.Latency || r.FailedLatency != nil || r.Window != nil || r.Saturation != nil ||
		r.Served() != 498 || r.Saturated() {
		t.Errorf("version 1 trial: answered %p (latency %p), failed %v, window %v, saturation %v, served %d",
			r.AnsweredLatency, r.Latency, r.FailedLatency, r.Window, r.Saturation, r.Served())
	}
	fresh := sampleRun()
	tr = syntheticTrial(rng, "sidecar", 0, 500, start.Add(time.Hour))
	if err := s.CreateRun(ctx, fresh); err != nil {
		t.Fatal(err)
	}
	if err := s.AddTrial(ctx, fresh.ID, tr); err != nil {
		t.Fatalf("adding a trial with network samples after migration: %v", err)
	}
	back, err := s.LoadRun(ctx, fresh.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back.Trials[0].Result.Network, tr.Result.Network) {
		t.Errorf("network samples after migration:\n got %+v\nwant %+v", back.Trials[0].Result.Network, tr.Result.Network)
	}
	// Deleting a run cascades to its network samples.
	if err := s.DeleteRun(ctx, fresh.ID); err != nil {
		t.Fatal(err)
	}
	var left int
	if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM net_samples`).Scan(&left); err != nil || left != 0 {
		t.Errorf("%d network samples left after deleting their run (%v)", left, err)
	}
}

// insertVersion1Trial writes a trial and its resource samples with the columns of
// schema version 1.
func insertVersion1Trial(ctx context.Context, s *Store, runID string, tr *results.Trial) error {
	lat, err := results.EncodeHistogram(tr.Result.Latency)
	if err != nil {
		return err
	}
	res, err := s.db.ExecContext(ctx, `INSERT INTO trials (run_id, repeat, mesh, experiment, kind, params, start_ns, end_ns, requests, errors, latency_hdr)
		VALUES (?,?,?,?,?,?,?,?,?,?,?)`, runID, tr.Repeat, tr.Mesh, tr.Experiment, tr.Kind, mustJSON(tr.Params),
		unixNano(tr.Start), unixNano(tr.End), tr.Result.Requests, tr.Result.Errors, lat)
	if err != nil {
		return err
	}
	id, err := res.LastInsertId()
	if err != nil {
		return err
	}
	for i, rs := range tr.Result.Resources {
		if _, err := s.db.ExecContext(ctx, `INSERT INTO resource_samples VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`,
			id, i, rs.Component, rs.Role, rs.Pod, rs.Node, rs.Mesh, unixNano(rs.T), rs.CPUUserSeconds, rs.CPUSysSeconds,
			rs.RSSBytes, rs.PSSBytes, rs.Threads, rs.VoluntaryCtx, rs.InvoluntaryCtx); err != nil {
			return err
		}
	}
	return nil
}

func countRows(t *testing.T, path, query string) int {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRow(query).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestNewerSchemaIsRefused(t *testing.T) {
	ctx := context.Background()
	s, path := openTemp(t)
	if _, err := s.db.ExecContext(ctx, `UPDATE schema_version SET version = 999`); err != nil {
		t.Fatal(err)
	}
	s.Close()
	_, err := Open(ctx, path)
	if err == nil || !strings.Contains(err.Error(), "newer") || !strings.Contains(err.Error(), path) {
		t.Errorf("opening a newer schema: %v", err)
	}
}

func TestPragmas(t *testing.T) {
	s, _ := openTemp(t)
	var mode string
	var sync int
	if err := s.db.QueryRow(`PRAGMA journal_mode`).Scan(&mode); err != nil || mode != "wal" {
		t.Errorf("journal_mode %q %v", mode, err)
	}
	if err := s.db.QueryRow(`PRAGMA synchronous`).Scan(&sync); err != nil || sync != 2 {
		t.Errorf("synchronous %d %v, want 2 (FULL)", sync, err)
	}
}

const childEnv = "MESHMARK_STORE_KILL_CHILD_DB"

// TestMain lets the kill test re-execute this binary as a writer that gets SIGKILLed.
func TestMain(m *testing.M) {
	if path := os.Getenv(childEnv); path != "" {
		os.Exit(killChild(path))
	}
	os.Exit(m.Run())
}

// killChild writes trials forever, announcing each commit on stdout, until killed.
func killChild(path string) int {
	ctx := context.Background()
	s, err := Open(ctx, path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	run := sampleRun()
	run.Study = "killed"
	if err := s.CreateRun(ctx, run); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	rng := rand.New(rand.NewPCG(3, 3))
	start := time.Now()
	for i := 0; i < 10000; i++ {
		tr := syntheticTrial(rng, run.Meshes[i%2].Label, i/2, 3000, start.Add(time.Duration(i)*time.Second))
		if err := s.AddTrial(ctx, run.ID, tr); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Printf("committed %s %d\n", run.ID, i+1)
	}
	return 0
}

func TestKill9LeavesEarlierRunsIntactAndMarksRunIncomplete(t *testing.T) {
	ctx := context.Background()
	s, path := openTemp(t)
	done := sampleRun()
	if err := s.CreateRun(ctx, done); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(9, 9))
	want := syntheticTrial(rng, "none", 0, 4000, time.Now())
	if err := s.AddTrial(ctx, done.ID, want); err != nil {
		t.Fatal(err)
	}
	if err := s.FinishRun(ctx, done.ID, results.StatusComplete, ""); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+path)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	sc := bufio.NewScanner(out)
	var killedID string
	committed := 0
	deadline := time.AfterFunc(2*time.Minute, func() { _ = cmd.Process.Kill() })
	defer deadline.Stop()
	for committed < 5 && sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 3 || f[0] != "committed" {
			t.Fatalf("child said %q", sc.Text())
		}
		killedID = f[1]
		committed, _ = strconv.Atoi(f[2])
	}
	if committed < 5 {
		t.Fatalf("child stopped after %d commits", committed)
	}
	// While it runs the run must be reported as running: its owner is alive.
	if n, err := s.MarkAbandoned(ctx); err != nil || len(n) != 0 {
		t.Fatalf("live run marked abandoned: %v %v", n, err)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// The child kept writing while we read; drain what it reported before it died.
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 3 && f[0] == "committed" {
			committed, _ = strconv.Atoi(f[2])
		}
	}
	_ = cmd.Wait()
	s.Close()

	s2, err := Open(ctx, path)
	if err != nil {
		t.Fatalf("database does not open after kill -9: %v", err)
	}
	defer s2.Close()
	var check string
	if err := s2.db.QueryRow(`PRAGMA integrity_check`).Scan(&check); err != nil || check != "ok" {
		t.Fatalf("integrity_check: %q %v", check, err)
	}
	got, err := s2.LoadRun(ctx, done.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != results.StatusComplete || len(got.Trials) != 1 || !got.Trials[0].Result.Latency.Equals(want.Result.Latency) {
		t.Errorf("earlier complete run damaged: status %s, %d trials", got.Status, len(got.Trials))
	}
	killed, err := s2.LoadRun(ctx, killedID)
	if err != nil {
		t.Fatal(err)
	}
	if killed.Status != results.StatusIncomplete {
		t.Errorf("killed run is %s, want incomplete", killed.Status)
	}
	// The child may have committed one more trial between its last report and the kill.
	t.Logf("child reported %d commits before SIGKILL", committed)
	if n := len(killed.Trials); n < committed || n > committed+1 {
		t.Errorf("killed run has %d trials, child reported %d commits", n, committed)
	}
	for _, tr := range killed.Trials {
		if tr.Result.Latency.TotalCount() != 3000 || len(tr.Result.Intervals) != 5 || len(tr.Result.Resources) != 1 {
			t.Errorf("trial %d of the killed run is half-written: %d values, %d intervals", tr.ID, tr.Result.Latency.TotalCount(), len(tr.Result.Intervals))
		}
	}
	if killed.Ended.IsZero() || killed.StatusReason == "" {
		t.Errorf("incomplete run lacks end time or reason: %v %q", killed.Ended, killed.StatusReason)
	}
}

func TestOwnerLiveness(t *testing.T) {
	self := currentOwner()
	if !self.alive(self) {
		t.Error("this process is reported dead")
	}
	reused := self
	reused.start++
	if reused.alive(self) {
		t.Error("a reused pid (different start time) is reported alive")
	}
	rebooted := self
	rebooted.boot = "other-boot"
	if rebooted.alive(self) {
		t.Error("an owner from before a reboot is reported alive")
	}
	elsewhere := self
	elsewhere.host, elsewhere.pid = "other-host", 1<<22+1
	if !elsewhere.alive(self) {
		t.Error("an owner on another host must be assumed alive")
	}
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	gone := owner{pid: cmd.Process.Pid, host: self.host, boot: self.boot}
	if gone.alive(self) {
		t.Error("an exited process is reported alive")
	}
}

// A fault trial keeps which process exited, when and its log tail, and a trial its
// request mix; FlagTrials marks
// stored trials of a running run, once per flag, and both survive a reload.
func TestFaultsAndAddedFlagsRoundTrip(t *testing.T) {
	ctx := context.Background()
	s, _ := openTemp(t)
	run := sampleRun()
	if err := s.CreateRun(ctx, run); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 3))
	start := time.Date(2026, 11, 22, 4, 0, 0, 0, time.UTC)
	first := syntheticTrial(rng, "sidecar", 0, 100, start)
	faulted := syntheticTrial(rng, "sidecar", 0, 100, start.Add(10*time.Second))
	fault := results.Fault{Pod: "reviews-v1-0", Process: "envoy", Role: "sidecar", PID: 4242, At: start.Add(12 * time.Second).UTC(),
		Exit: "signal: killed", LogPath: "/tmp/reviews-v1-0.envoy.log", LogTail: "[info] starting workers\n"}
	faulted.Result.Flags = []string{results.FlagFault}
	faulted.Result.Faults = []results.Fault{fault}
	mix := []results.VersionShare{{Service: "reviews", Version: "v1", Requests: 0, Share: 0, Intended: 1.0 / 3},
		{Service: "reviews", Version: "v2", Requests: 600, Share: 0.5, Intended: 1.0 / 3}}
	faulted.Result.Mix = mix
	for _, tr := range []*results.Trial{first, faulted} {
		if err := s.AddTrial(ctx, run.ID, tr); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 { // the second call must not add the flag twice
		if err := s.FlagTrials(ctx, run.ID, results.FlagSuperseded, first.ID); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.FlagTrials(ctx, run.ID, results.FlagSuperseded, 999999); err == nil {
		t.Error("FlagTrials accepted a trial id that is not in the run")
	}
	got, err := s.LoadRun(ctx, run.ID)
	if err != nil {
		t.Fatal(err)
	}
	if f := got.Trials[0].Result.Flags; !reflect.DeepEqual(f, []string{results.FlagSuperseded}) || !got.Trials[0].Result.Excluded() {
		t.Errorf("first trial flags %v, want [superseded] and excluded", f)
	}
	g := got.Trials[1].Result
	if !g.Excluded() || len(g.Faults) != 1 || !g.Faults[0].At.Equal(fault.At) {
		t.Fatalf("fault trial: flags %v, faults %+v", g.Flags, g.Faults)
	}
	g.Faults[0].At = fault.At
	if g.Faults[0] != fault {
		t.Errorf("fault read back as %+v, wrote %+v", g.Faults[0], fault)
	}
	if !reflect.DeepEqual(g.Mix, mix) {
		t.Errorf("mix read back as %+v, wrote %+v", g.Mix, mix)
	}
}

// A security trial has no latency at all, only its probes' verdicts and evidence; both
// survive a reload, and an older database gains the column empty.
func TestSecurityTrialRoundTrip(t *testing.T) {
	ctx := context.Background()
	s, _ := openTemp(t)
	run := sampleRun()
	if err := s.CreateRun(ctx, run); err != nil {
		t.Fatal(err)
	}
	start := time.Date(2026, 11, 22, 4, 0, 0, 0, time.UTC)
	probes := []results.SecurityProbe{
		{Probe: results.ProbeEncryption, Outcome: results.SecurityFail, Promised: "mTLS between meshed pods",
			Summary: "1 of 6 flows plaintext", Checks: []results.SecurityCheck{
				{Target: "198.18.1.2:40000 -> 198.18.2.3:9080", Observed: "http: GET /reviews/0", Held: false},
				{Target: "198.18.1.2:40002 -> 198.18.2.4:9080", Observed: "tls 1.3, alpn istio", Held: true}}},
		{Probe: results.ProbeIdentity, Outcome: results.SecurityNotApplicable, Summary: "no workload certificates"},
	}
	tr := &results.Trial{Mesh: "sidecar", Experiment: "security", Kind: results.KindSecurity, Start: start, End: start.Add(3 * time.Second),
		Result: results.TrialResult{Security: probes}}
	if err := s.AddTrial(ctx, run.ID, tr); err != nil {
		t.Fatal(err)
	}
	got, err := s.LoadRun(ctx, run.ID)
	if err != nil {
		t.Fatal(err)
	}
	g := got.Trials[0]
	if g.Result.Latency != nil || g.Kind != results.KindSecurity {
		t.Errorf("security trial read back with kind %q, latency %v", g.Kind, g.Result.Latency)
	}
	if !reflect.DeepEqual(g.Result.Security, probes) {
		t.Errorf("probes read back as %+v, wrote %+v", g.Result.Security, probes)
	}
}
