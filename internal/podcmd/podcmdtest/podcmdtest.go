// Package podcmdtest builds the small in-pod binary for tests that run pods: go test
// builds only the test binary, and meshmark-pod is another program (cmd/meshmark-pod).
package podcmdtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/meshmark/meshmark/internal/podcmd"
)

// Build compiles meshmark-pod into dir, statically (as `make build` does, so that an
// image can hold it), and returns its path. Go's build cache makes it quick after the
// first time.
func Build(dir string) (string, error) {
	out := filepath.Join(dir, podcmd.Name)
	cmd := exec.Command("go", "build", "-o", out, "github.com/meshmark/meshmark/cmd/meshmark-pod")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", podcmd.Name, err, b)
	}
	return out, nil
}
