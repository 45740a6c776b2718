package podcmd

import (
	"bytes"
	"strings"
	"testing"
)

// The small binary a pod runs refuses a runner of another version before its role
// starts, with exit code 2 and both versions named; the runner's own version runs the
// role, and `version` answers whoever asks.
func TestMainRefusesAnotherRunnersVersion(t *testing.T) {
	defer func(v string) { Version = v }(Version)
	Version = "v0.3.0"
	serviceArgs := []string{"service", "--graph", "chain-1", "--print"}

	t.Setenv(RunnerVersionEnv, "v0.2.9")
	var out, errOut bytes.Buffer
	if code := Main(serviceArgs, &out, &errOut); code != 2 || out.Len() != 0 ||
		!strings.Contains(errOut.String(), "this image's meshmark is v0.3.0, but the meshmark that started this pod is v0.2.9") {
		t.Errorf("another runner's version: exit %d, stdout %q, stderr %q", code, out.String(), errOut.String())
	}
	out.Reset()
	errOut.Reset()
	if code := Main([]string{"version"}, &out, &errOut); code != 0 || out.String() != Name+" v0.3.0\n" {
		t.Errorf("version: exit %d, %q %q", code, out.String(), errOut.String())
	}

	for _, runner := range []string{"v0.3.0", "dev", ""} {
		t.Setenv(RunnerVersionEnv, runner)
		out.Reset()
		errOut.Reset()
		if code := Main(serviceArgs, &out, &errOut); code != 0 || !strings.Contains(out.String(), "name: chain-1") {
			t.Errorf("runner %q: exit %d, stdout %q, stderr %q", runner, code, out.String(), errOut.String())
		}
	}
}

func TestBuildVersionKeepsAStampedVersion(t *testing.T) {
	for _, v := range []string{"v1.2.3", "965ac52", "965ac52-dirty"} {
		if got := BuildVersion(v); got != v {
			t.Errorf("BuildVersion(%q) = %q", v, got)
		}
	}
	// A test binary records no commit: an unstamped build stays "dev".
	if got := BuildVersion("dev"); got != "dev" && !strings.HasPrefix(got, "dev+") {
		t.Errorf(`BuildVersion("dev") = %q`, got)
	}
}
