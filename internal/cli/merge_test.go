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
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/load"
	"github.com/meshmark/meshmark/internal/localcluster"
	"github.com/meshmark/meshmark/internal/substrate/kube/kubetest"
)

// TestMain lets a test run meshmark as a separate process: the test binary re-executed
// with MESHMARK_CLI_ARGS set runs that command line and exits. The binary is also what
// a local cluster's nodes run (localcluster.RunRole), and the package's shared local
// cluster is taken down when the tests end.
func TestMain(m *testing.M) {
	localcluster.RunRole()
	if args := os.Getenv("MESHMARK_CLI_ARGS"); args != "" {
		var argv []string
		if err := json.Unmarshal([]byte(args), &argv); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		os.Exit(Main(argv))
	}
	os.Exit(kubetest.Main(m))
}

// TestMergeOfFourGeneratorsIsExact runs four generator processes against one server at
// the same time and checks that their merged latency histogram is, bucket for bucket,
// the histogram of every request all four logged.
func TestMergeOfFourGeneratorsIsExact(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A spread of service times, and a few errors, so that the histograms have
		// shape and the error rows are counted.
		i := n.Add(1)
		time.Sleep(time.Duration(i%7) * 300 * time.Microsecond)
		if i%50 == 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_, _ = w.Write([]byte("ok"))
	}))
	defer srv.Close()
	dir := t.TempDir()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	const generators = 4
	var wg sync.WaitGroup
	errs := make([]error, generators)
	for g := 0; g < generators; g++ {
		args, _ := json.Marshal([]string{"load", srv.URL, "--rate", "150", "-d", "3s", "--warmup", "1s",
			"--seed", strconv.Itoa(g + 1), "--format", "json",
			"-o", filepath.Join(dir, fmt.Sprintf("g%d.json", g)), "--raw", filepath.Join(dir, fmt.Sprintf("g%d.csv", g))})
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, exe, "-test.run", "^$")
			cmd.Env = append(os.Environ(), "MESHMARK_CLI_ARGS="+string(args))
			if out, err := cmd.CombinedOutput(); err != nil {
				errs[g] = fmt.Errorf("generator %d: %v\n%s", g, err, out)
			}
		}(g)
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}

	// What the four logged, request by request, counted as the engine counts.
	want := load.NewHistogram()
	var completed, succeeded int64
	var results []string
	for g := 0; g < generators; g++ {
		results = append(results, filepath.Join(dir, fmt.Sprintf("g%d.json", g)))
		for _, row := range rawLogRows(t, filepath.Join(dir, fmt.Sprintf("g%d.csv", g))) {
			if row[7] == "true" {
				continue // warm-up
			}
			completed++
			if row[5] == "none" {
				succeeded++
			}
			if row[5] != "none" && row[5] != "non2xx" {
				continue // no response, nothing timed
			}
			intended, _ := strconv.ParseInt(row[0], 10, 64)
			done, _ := strconv.ParseInt(row[3], 10, 64)
			us := min(max((done-intended)/1000, load.HistLowest), load.HistHighest)
			if err := want.RecordValue(us); err != nil {
				t.Fatal(err)
			}
		}
	}

	mergedPath := filepath.Join(dir, "merged.json")
	if out, code, err := execLoad(context.Background(), append([]string{"merge", "--format", "json", "-o", mergedPath}, results...)...); err != nil {
		t.Fatalf("merge exit %d: %v\n%s", code, err, out)
	}
	got := readResult(t, mergedPath)
	if got.Completed != completed || got.Succeeded != succeeded || got.Completed < 4*150*2*9/10 {
		t.Errorf("merged completed %d succeeded %d; the raw logs have %d and %d (about %d expected)", got.Completed, got.Succeeded, completed, succeeded, 4*150*2)
	}
	if got.Errors.Non2xx == 0 || got.StatusCodes[503] != got.Errors.Non2xx {
		t.Errorf("merged errors %+v, status codes %v: want the 503s counted", got.Errors, got.StatusCodes)
	}
	if got.Latency.TotalCount() != want.TotalCount() {
		t.Fatalf("merged latency histogram holds %d values, the raw logs %d", got.Latency.TotalCount(), want.TotalCount())
	}
	gotCounts, wantCounts := got.Latency.Export().Counts, want.Export().Counts
	if !slices.Equal(gotCounts, wantCounts) {
		diff := 0
		for i := range gotCounts {
			if i >= len(wantCounts) || gotCounts[i] != wantCounts[i] {
				diff++
			}
		}
		t.Errorf("merged latency histogram differs from the raw logs' in %d buckets", diff)
	}
	for _, q := range []float64{50, 90, 99, 99.9, 100} {
		if g, w := got.Latency.Quantile(q), (load.Histogram{Histogram: want}).Quantile(q); g != w {
			t.Errorf("p%g: merged %s, all requests %s", q, g, w)
		}
	}
	if got.AchievedRate < 4*150*0.9 {
		t.Errorf("merged rate %.0f/s: want the four generators' rates added (about 600/s)", got.AchievedRate)
	}

	var perGenerator, merged int64
	for _, p := range results {
		for _, iv := range readResult(t, p).Intervals {
			perGenerator += iv.Completed
		}
	}
	for _, iv := range got.Intervals {
		merged += iv.Completed
	}
	if merged != perGenerator || len(got.Intervals) < 3 {
		t.Errorf("merged %d intervals hold %d requests; the generators' hold %d", len(got.Intervals), merged, perGenerator)
	}

	// Results of different load models do not add up.
	closed := filepath.Join(dir, "closed.json")
	if out, _, err := execLoad(context.Background(), "load", srv.URL, "-c", "1", "-n", "5", "--format", "json", "-o", closed); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if _, code, err := execLoad(context.Background(), "merge", results[0], closed); code != 2 || err == nil {
		t.Errorf("merging open and closed results: exit %d, %v", code, err)
	}
}
