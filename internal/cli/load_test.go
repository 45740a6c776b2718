package cli

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

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
