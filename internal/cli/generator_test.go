package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/load"
	"github.com/meshmark/meshmark/internal/loadgen"
	"github.com/meshmark/meshmark/internal/substrate/kube/kubetest"
)

// spawnedGenerator is a `meshmark generator` process of its own: the test binary run
// as meshmark (see TestMain).
type spawnedGenerator struct {
	addr, log string
	cmd       *exec.Cmd
}

// spawnGenerator starts a generator on a free loopback port, logging into dir.
func spawnGenerator(dir string, args ...string) (*spawnedGenerator, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	port, err := kubetest.FreePort()
	if err != nil {
		return nil, err
	}
	g := &spawnedGenerator{addr: "127.0.0.1:" + strconv.Itoa(port)}
	argv, _ := json.Marshal(append([]string{"generator", "--listen", g.addr}, args...))
	logf, err := os.CreateTemp(dir, "generator-*.log")
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	g.log = logf.Name()
	g.cmd = exec.Command(exe, "-test.run", "^$")
	g.cmd.Env = append(os.Environ(), "MESHMARK_CLI_ARGS="+string(argv))
	g.cmd.Stdout, g.cmd.Stderr = logf, logf
	return g, g.cmd.Start()
}

// startGenerator spawns a generator for the test and returns its address and process.
func startGenerator(t *testing.T, args ...string) (string, *exec.Cmd) {
	t.Helper()
	g, err := spawnGenerator(t.TempDir(), args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.cmd.Process.Kill(); _ = g.cmd.Wait() })
	return g.addr, g.cmd
}

// countingServer answers with a spread of service times and a few 503s, and counts.
func countingServer(t *testing.T) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i := n.Add(1)
		time.Sleep(time.Duration(i%7) * 300 * time.Microsecond)
		if i%50 == 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_, _ = w.Write([]byte("ok"))
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

// TestGeneratorsStreamAndMergeExactly drives four generator processes through
// `meshmark load --generators`: the merged result must hold, bucket for bucket, every
// request the four logged, and their sends must add up to the one schedule asked for.
func TestGeneratorsStreamAndMergeExactly(t *testing.T) {
	srv, served := countingServer(t)
	dir := t.TempDir()
	var addrs []string
	for g := 0; g < 4; g++ {
		addr, _ := startGenerator(t, "--raw-dir", filepath.Join(dir, fmt.Sprintf("g%d", g)))
		addrs = append(addrs, addr)
	}
	merged := filepath.Join(dir, "merged.json")
	out, code, err := execLoad(context.Background(), "load", srv.URL, "--rate", "400", "-d", "3s", "--warmup", "1s",
		"--format", "json", "-o", merged, "--generators", strings.Join(addrs, ","))
	if err != nil {
		t.Fatalf("exit %d: %v\n%s", code, err, out)
	}
	got := readResult(t, merged)

	want := load.NewHistogram()
	var rows, completed, succeeded int64
	var intended []int64
	for g := 0; g < 4; g++ {
		logs, _ := filepath.Glob(filepath.Join(dir, fmt.Sprintf("g%d", g), "*.csv"))
		if len(logs) != 1 {
			t.Fatalf("generator %d kept %d raw logs, want 1", g, len(logs))
		}
		for _, row := range rawLogRows(t, logs[0]) {
			rows++
			at, _ := strconv.ParseInt(row[0], 10, 64)
			intended = append(intended, at)
			if row[7] == "true" {
				continue
			}
			completed++
			if row[5] == "none" {
				succeeded++
			}
			if row[5] != "none" && row[5] != "non2xx" {
				continue
			}
			done, _ := strconv.ParseInt(row[3], 10, 64)
			if err := want.RecordValue(min(max((done-at)/1000, load.HistLowest), load.HistHighest)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got.Completed != completed || got.Succeeded != succeeded || got.RequestedRate != 400 {
		t.Errorf("merged: completed %d, succeeded %d, requested %.1f/s; the raw logs: %d, %d; asked 400/s", got.Completed, got.Succeeded, got.RequestedRate, completed, succeeded)
	}
	if n := served.Load(); n != rows {
		t.Errorf("the server answered %d requests, the generators logged %d", n, rows)
	}
	if !slices.Equal(got.Latency.Export().Counts, want.Export().Counts) || got.Latency.TotalCount() != want.TotalCount() {
		t.Errorf("merged latency histogram (%d values) differs from the raw logs' (%d values)", got.Latency.TotalCount(), want.TotalCount())
	}
	// Four shares of 400/s, phased: together one send every 2.5 ms, as one generator
	// at 400/s would send (each logged from its own start, which is the same instant).
	slices.Sort(intended)
	if len(intended) != 1200 {
		t.Fatalf("%d sends, want 3 s at 400/s = 1200", len(intended))
	}
	for i, at := range intended {
		if d := at - int64(i)*2_500_000; d < -1000 || d > 1000 {
			t.Fatalf("send %d intended at %dns, want %dns: the shares do not interleave into one schedule", i, at, int64(i)*2_500_000)
		}
	}
	var ivSum int64
	for _, iv := range got.Intervals {
		ivSum += iv.Completed
	}
	if len(got.Intervals) < 3 || ivSum != rows {
		t.Errorf("%d merged intervals hold %d requests; want every request of the run (%d)", len(got.Intervals), ivSum, rows)
	}
}

// TestGeneratorFailuresAndRefusals: a generator killed mid-plan fails the run naming it
// and the others stop; a driver that goes away stops the load; a busy generator, bad
// flags and forbidden targets are refused with the generator's reason.
func TestGeneratorFailuresAndRefusals(t *testing.T) {
	srv, served := countingServer(t)
	a, _ := startGenerator(t)
	b, victim := startGenerator(t)
	ctx := context.Background()
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	pool, err := loadgen.Dial(dctx, []string{a, b})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	// Killed: the run fails, names b, and a stops sending.
	go func() {
		time.Sleep(2500 * time.Millisecond)
		_ = victim.Process.Signal(syscall.SIGKILL)
	}()
	_, _, err = pool.Run(ctx, openSpec(srv.URL, 200, 20*time.Second), nil)
	if err == nil || !strings.Contains(err.Error(), "generator "+b) {
		t.Fatalf("run with a generator killed: %v; want an error naming %s", err, b)
	}
	if stillSending(served) {
		t.Error("the surviving generator kept sending after the run failed")
	}

	// The survivor takes the next plan.
	solo, err := loadgen.Dial(ctx, []string{a})
	if err != nil {
		t.Fatal(err)
	}
	defer solo.Close()
	res, _, err := solo.Run(ctx, openSpec(srv.URL, 100, time.Second), nil)
	if err != nil || res.Completed != 100 {
		t.Fatalf("the survivor's next plan: %v, %+v", err, res)
	}

	// The driver goes away: the load stops.
	rctx, stop := context.WithCancel(ctx)
	go func() { time.Sleep(2 * time.Second); stop() }()
	if _, _, err := solo.Run(rctx, openSpec(srv.URL, 200, 20*time.Second), nil); err == nil {
		t.Error("a cancelled run returned no error")
	}
	if stillSending(served) {
		t.Error("the generator kept sending after its driver went away")
	}

	// Busy, then refusals in the generator's words.
	busy := make(chan error, 1)
	go func() {
		_, _, err := solo.Run(ctx, openSpec(srv.URL, 50, 3*time.Second), nil)
		busy <- err
	}()
	time.Sleep(1500 * time.Millisecond)
	other, err := loadgen.Dial(ctx, []string{a})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, _, err := other.Run(ctx, closedSpec(srv.URL, 1, 1), nil); err == nil || !strings.Contains(err.Error(), "busy: running a plan from") {
		t.Errorf("a second plan while one runs: %v", err)
	}
	if err := <-busy; err != nil {
		t.Errorf("the first plan: %v", err)
	}
	future := openSpec(srv.URL, 10, time.Second)
	future.Version = load.SpecVersion + 1
	h3 := closedSpec(srv.URL, 1, 1)
	h3.Protocol = "h3"
	for _, tc := range []struct {
		spec load.Spec
		want string
	}{
		{future, fmt.Sprintf("load spec version %d: this meshmark reads version %d only", load.SpecVersion+1, load.SpecVersion)},
		{closedSpec("http://8.8.8.8/", 1, 1), "8.8.8.8 is neither loopback nor in 198.18.0.0/15"},
		{h3, `protocol "h3": want http1, h2, h2c or grpc`},
	} {
		if _, _, err := other.Run(ctx, tc.spec, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.spec, err, tc.want)
		}
	}
}

// openSpec is a constant rate at url for length.
func openSpec(url string, rate float64, length time.Duration) load.Spec {
	return load.NewSpec(load.Config{Request: load.Request{URL: url}, Duration: length,
		Open: &load.OpenModel{Schedule: load.ScheduleSpec{Arrival: load.Constant, Rate: rate}}})
}

// closedSpec is n requests at url over conns connections.
func closedSpec(url string, n int64, conns int) load.Spec {
	return load.NewSpec(load.Config{Request: load.Request{URL: url}, Count: n, Closed: &load.ClosedModel{Connections: conns}})
}

// TestGeneratorLoadsOnlyItsNamespace: a generator pod's rules, with the cluster's name
// of a service resolved to a local server.
func TestGeneratorLoadsOnlyItsNamespace(t *testing.T) {
	srv, served := countingServer(t)
	port := srv.Listener.Addr().String()
	g, _ := startGenerator(t, "--allow-namespace", "shop", "--resolve", "front.shop.svc.cluster.local:9080:"+port)
	ctx := context.Background()
	pool, err := loadgen.Dial(ctx, []string{g})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	res, _, err := pool.Run(ctx, closedSpec("http://front.shop.svc.cluster.local:9080/", 20, 2), nil)
	if err != nil || res.Completed != 20 || served.Load() != 20 {
		t.Fatalf("a service of its namespace: %v, completed %v, served %d", err, res, served.Load())
	}
	if _, _, err := pool.Run(ctx, closedSpec("http://front.other.svc:9080/", 1, 1), nil); err == nil ||
		!strings.Contains(err.Error(), "this generator also loads the services of namespace shop") {
		t.Errorf("a service of another namespace: %v", err)
	}
	if served.Load() != 20 {
		t.Errorf("the refused plan sent %d requests", served.Load()-20)
	}
}

// stillSending reports whether the server's count still grows a moment after the load
// should have stopped.
func stillSending(served *atomic.Int64) bool {
	time.Sleep(500 * time.Millisecond)
	before := served.Load()
	time.Sleep(time.Second)
	return served.Load() != before
}
