package cli

import (
	"bytes"
	"context"
	"encoding/csv"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/load"
)

func TestLoadCommandBadInputExitsTwo(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer srv.Close()
	for _, args := range [][]string{
		{"load"},
		{"load", "http://8.8.8.8/"},
		{"load", "http://example.com/"},
		{"load", "ftp://127.0.0.1/"},
		{"load", srv.URL, "--rate", "abc"},
		{"load", srv.URL, "--rate", "10", "--poisson", "10"},
		{"load", srv.URL, "--steps", "1:2:3"},
		{"load", srv.URL, "--ramp", "x:1"},
		{"load", srv.URL, "--format", "xml"},
		{"load", srv.URL, "-H", "no colon"},
		{"load", srv.URL, "--users", "2", "--think", "5s-1s"},
		{"load", srv.URL, "--no-such-flag"},
		{"load", srv.URL, "--rate", "10", "--limit", "5"},
	} {
		if code := Main(args); code != 2 {
			t.Errorf("meshmark %v: exit code %d, want 2", args, code)
		}
	}
}

func TestLoadCommandWritesJSON(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Probe") != "yes" {
			w.WriteHeader(http.StatusBadRequest)
		}
	}))
	defer srv.Close()
	out := filepath.Join(t.TempDir(), "run.json")
	if code := Main([]string{"load", srv.URL, "-c", "2", "-n", "40", "-H", "X-Probe: yes", "--format", "json", "-o", out}); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := load.ReadJSON(f)
	if err != nil {
		t.Fatal(err)
	}
	if res.Succeeded != 40 || res.Latency.TotalCount() != 40 {
		t.Fatalf("succeeded %d, latencies %d, errors %+v", res.Succeeded, res.Latency.TotalCount(), res.Errors)
	}
}

// execLoad runs one meshmark command line under ctx, as Main would, and returns what it
// printed, its exit code and error.
func execLoad(ctx context.Context, args ...string) (string, int, error) {
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	code := 0
	if err != nil {
		code = 1
		var ee *exitError
		if errors.As(err, &ee) {
			code = ee.code
		}
	}
	return out.String(), code, err
}

// rawLogRows checks that path is a raw log and returns its rows.
func rawLogRows(t *testing.T, path string) [][]string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(data), load.RawLogHeader) {
		t.Fatalf("%s does not start with the raw log header: %.100q", path, data)
	}
	recs, err := csv.NewReader(bytes.NewReader(data)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	return recs[1:]
}

// onlyFiles fails unless dir holds exactly names: no temporary file may be left over.
func onlyFiles(t *testing.T, dir string, names ...string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	if !slices.Equal(got, names) {
		t.Errorf("%s holds %q, want %q", dir, got, names)
	}
}

func TestLoadCommandRawLog(t *testing.T) {
	var served atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		w.Write([]byte("hello"))
	}))
	defer srv.Close()
	dir := t.TempDir()
	raw, out := filepath.Join(dir, "raw.csv"), filepath.Join(dir, "run.json")
	printed, code, err := execLoad(context.Background(), "load", srv.URL, "-c", "2", "-n", "50", "--raw", raw, "--format", "json", "-o", out)
	if code != 0 {
		t.Fatalf("exit code %d: %v\n%s", code, err, printed)
	}
	rows := rawLogRows(t, raw)
	if len(rows) != 50 {
		t.Fatalf("%d rows, want 50", len(rows))
	}
	for _, r := range rows {
		if r[4] != "200" || r[5] != "none" || r[6] != "5" || r[7] != "false" {
			t.Fatalf("row %q", r)
		}
	}
	if !strings.Contains(printed, "raw log: "+raw+", 50 rows, times in ns from ") {
		t.Errorf("stderr does not give the log's time origin:\n%s", printed)
	}
	onlyFiles(t, dir, "raw.csv", "run.json")

	// A file that cannot be created stops the command before any load is sent.
	served.Store(0)
	for _, bad := range []struct{ raw, want string }{
		{filepath.Join(dir, "missing", "raw.csv"), "no such file or directory"},
		{dir, "is a directory"},
		{out, "-o names the same file"},
	} {
		_, code, err := execLoad(context.Background(), "load", srv.URL, "-n", "5", "--raw", bad.raw, "-o", out)
		if code != 2 || err == nil || !strings.Contains(err.Error(), "--raw "+bad.raw+": ") || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("--raw %s: exit code %d, error %v; want 2 naming the file and %q", bad.raw, code, err, bad.want)
		}
	}
	if n := served.Load(); n != 0 {
		t.Errorf("%d requests sent although the raw log could not be created", n)
	}
	onlyFiles(t, dir, "raw.csv", "run.json")
}

// TestLoadCommandRawLogInterrupted: an interrupted run still names its log FILE, with a
// row for every request the partial result counts.
func TestLoadCommandRawLogInterrupted(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer srv.Close()
	dir := t.TempDir()
	raw, out := filepath.Join(dir, "raw.csv"), filepath.Join(dir, "run.json")
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, _, err := execLoad(ctx, "load", srv.URL, "--rate", "100", "-d", "1m", "--raw", raw, "--format", "json", "-o", out)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error %v, want the interruption", err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := load.ReadJSON(f)
	if err != nil {
		t.Fatal(err)
	}
	if rows := rawLogRows(t, raw); !res.Incomplete || res.Completed < 10 || int64(len(rows)) != res.Completed {
		t.Errorf("incomplete %v, completed %d, %d rows; want a row per completed request", res.Incomplete, res.Completed, len(rows))
	}
	onlyFiles(t, dir, "raw.csv", "run.json")
}

// TestRawFileIncomplete: a log that misses rows is removed, not named FILE, and the
// error says which file and why.
func TestRawFileIncomplete(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "raw.csv")
	r, err := createRawFile(path, "")
	if err != nil {
		t.Fatal(err)
	}
	r.f.WriteString(load.RawLogHeader + "1,2,,3,,refused,0,false\n")
	err = r.finish(&load.RawLogStatus{Rows: 1, Lost: 5, Error: "writing failed after 1 rows: no space left on device"})
	if err == nil || !strings.Contains(err.Error(), "raw log "+path+" not written: writing failed after 1 rows") {
		t.Errorf("error %v", err)
	}
	onlyFiles(t, dir)
}

// TestLoadCommandRawLogWriteFails runs meshmark in a child process whose files may not
// grow past 64 KiB (as on a full disk): the run completes and its result is printed,
// but the log is not created and the command fails, naming it.
func TestLoadCommandRawLogWriteFails(t *testing.T) {
	if args := os.Getenv("MESHMARK_TEST_LOAD_ARGS"); args != "" {
		os.Exit(Main(strings.Split(args, "\n")))
	}
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		t.Skip("prlimit (util-linux) is not installed")
	}
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer srv.Close()
	dir := t.TempDir()
	raw := filepath.Join(dir, "raw.csv")
	cmd := exec.Command(prlimit, "--fsize=65536", os.Args[0], "-test.run=^TestLoadCommandRawLogWriteFails$")
	cmd.Env = append(os.Environ(), "MESHMARK_TEST_LOAD_ARGS="+strings.Join([]string{"load", srv.URL, "-c", "2", "-n", "3000", "--raw", raw}, "\n"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("exit %v, want code 1\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	if !strings.Contains(stdout.String(), "completed 3000  ok 3000") || !strings.Contains(stdout.String(), "WARNING: raw log: writing failed") {
		t.Errorf("the result must be printed whole, with a warning:\n%s", stdout.String())
	}
	if want := "raw log " + raw + " not written: writing failed after "; !strings.Contains(stderr.String(), want) || !strings.Contains(stderr.String(), "file too large") {
		t.Errorf("stderr does not say %q ... file too large:\n%s", want, stderr.String())
	}
	onlyFiles(t, dir)
}
