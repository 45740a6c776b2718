package podcmd

import (
	"fmt"
	"os"
	"runtime/debug"
)

// Version is set at build time with -ldflags "-X github.com/meshmark/meshmark/internal/podcmd.Version=..."
// (`make build` gives it the commit, as it does meshmark's). A build without it is
// "dev", with the commit Go recorded when it recorded one (BuildVersion).
var Version = "dev"

func init() { Version = BuildVersion(Version) }

// BuildVersion adds the commit a "dev" build was built from, when Go recorded one
// ("dev+1a2b3c4d5e6f", ".dirty" for uncommitted changes), so that two unstamped builds
// of different sources are told apart. A stamped version is returned as it is. The
// linker's -X sets only a variable initialised to a constant, so a Version is stamped
// first and passed through this in init.
func BuildVersion(v string) string {
	info, ok := debug.ReadBuildInfo()
	if v != "dev" || !ok {
		return v
	}
	var rev, dirty string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = ".dirty"
			}
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev == "" {
		return v
	}
	return v + "+" + rev + dirty
}

// RunnerVersionEnv is set, in every pod the Kubernetes substrate starts, to the
// version of the meshmark that starts it.
const RunnerVersionEnv = "MESHMARK_RUNNER_VERSION"

// CheckRunnerVersion refuses to run in a pod started by a meshmark of another version
// than self, which would send it plans, flags and a protocol it may not mean. A bare
// "dev" (a test binary, or a build Go recorded no commit for) matches anything: it
// names no version to hold the other to.
func CheckRunnerVersion(self string) error {
	runner := os.Getenv(RunnerVersionEnv)
	if runner == "" || runner == self || runner == "dev" || self == "dev" {
		return nil
	}
	return fmt.Errorf("this image's meshmark is %s, but the meshmark that started this pod is %s: build the image from the runner's own binary (`meshmark image build`) and give the cluster that one (a cluster from `meshmark cluster up`: `meshmark cluster load`)", self, runner)
}
