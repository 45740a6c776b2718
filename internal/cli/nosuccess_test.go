package cli

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/meshmark/meshmark/internal/substrate/kube"
)

// TestLoadWithNoSuccessExitsOne: `meshmark load` writes the result of a run in which no
// request succeeded, then exits 1 saying so, rather than 0 with a table that may show no
// error at all; a run with some successes exits 0 whatever its errors.
func TestLoadWithNoSuccessExitsOne(t *testing.T) {
	var n atomic.Int64
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) }))
	defer failing.Close()
	half := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if n.Add(1)%2 == 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer half.Close()
	for _, tc := range []struct {
		name  string
		args  []string
		code  int
		table *regexp.Regexp
		want  string
	}{
		{"every answer a 503", []string{failing.URL, "--rate", "40", "-d", "1s"}, 1,
			regexp.MustCompile(`errors: 40 \(refused 0, reset 0, timeout 0, non-2xx 40, other 0, lookup 0\)`),
			"no request succeeded: 40 completed, 40 failed (lookup 0, refused 0, reset 0, timeout 0, non-2xx 40, other 0), 0 sends dropped"},
		// No resolver knows .invalid (RFC 6761): it answers "no such host" at once, or,
		// where none answers, the lookup fails all the same.
		{"a name that does not resolve", []string{"http://nosuch.invalid:9080/", "--allow-any-target", "--rate", "20", "-d", "1s", "--timeout", "2s"}, 1,
			regexp.MustCompile(`errors: 20 \(refused 0, reset 0, timeout 0, non-2xx 0, other 0, lookup 20\)`),
			"no request succeeded: 20 completed, 20 failed (lookup 20,"},
		{"half of them a 503", []string{half.URL, "--rate", "40", "-d", "1s"}, 0,
			regexp.MustCompile(`errors: 20 \(refused 0, reset 0, timeout 0, non-2xx 20, other 0, lookup 0\)`), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, _, err := execCLI(append([]string{"load"}, tc.args...)...)
			code := 0
			var ee *exitError
			if errors.As(err, &ee) {
				code = ee.code
			} else if err != nil {
				code = -1
			}
			if code != tc.code || tc.want != "" && !strings.Contains(err.Error(), tc.want) {
				t.Errorf("exit code %d, error %v; want %d saying %q", code, err, tc.code, tc.want)
			}
			if !tc.table.MatchString(out) {
				t.Errorf("the result does not say %s:\n%s", tc.table, out)
			}
		})
	}
}

// TestPodRefusesAnotherRunnersVersion: meshmark in a pod that a meshmark of another
// version started (kube.RunnerVersionEnv) refuses to run, naming both versions and how
// to make the image match; the same version runs, and so does an unstamped "dev",
// which names no version to hold the runner to.
func TestPodRefusesAnotherRunnersVersion(t *testing.T) {
	defer func(v string) { Version = v }(Version)
	Version = "v0.3.0"
	t.Setenv(kube.RunnerVersionEnv, "v0.0.1-elsewhere")
	_, _, err := execCLI("service", "--graph", "chain-1", "--print")
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 2 || !strings.Contains(err.Error(), "this image's meshmark is v0.3.0, but the meshmark that started this pod is v0.0.1-elsewhere: build the image from the runner's own binary") {
		t.Errorf("another runner's version: %v", err)
	}
	for _, ours := range []string{"v0.3.0", "dev"} {
		t.Setenv(kube.RunnerVersionEnv, ours)
		if out, _, err := execCLI("service", "--graph", "chain-1", "--print"); err != nil || !strings.Contains(out, "name: chain-1") {
			t.Errorf("the runner's version %s: %v\n%s", ours, err, out)
		}
	}
}
