package cli

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// `make build` stamps the commit into meshmark with the linker's -X, and the version
// it prints, stores in provenance and gives its pods is that stamp. The linker sets
// only a variable initialised to a constant string: Version once was initialised by a
// function call, and every `make build` binary said "dev".
func TestTheLinkersStampIsTheVersion(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "meshmark")
	const stamp = "v9.8.7-stamped"
	ldflags := "-X github.com/meshmark/meshmark/internal/cli.Version=" + stamp +
		" -X github.com/meshmark/meshmark/internal/podcmd.Version=" + stamp
	if out, err := exec.Command("go", "build", "-ldflags", ldflags, "-o", bin, "github.com/meshmark/meshmark/cmd/meshmark").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "meshmark version "+stamp {
		t.Errorf("meshmark --version: %v, %q; want the stamp %s", err, out, stamp)
	}
	// The pod roles meshmark offers hold a pod's runner to the same stamp.
	cmd := exec.Command(bin, "service", "--graph", "chain-1", "--print")
	cmd.Env = append(cmd.Environ(), "MESHMARK_RUNNER_VERSION=v0.0.1")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "this image's meshmark is "+stamp) {
		t.Errorf("a pod started by another runner: %v\n%s", err, out)
	}
}
