package podcmd

import (
	"fmt"
	"os"
	"path/filepath"
)

// BinaryEnv names the environment variable that tells meshmark where its meshmark-pod
// is, when it is not beside the meshmark executable.
const BinaryEnv = "MESHMARK_POD_BINARY"

// Find returns the meshmark-pod that the running meshmark puts into pods and images:
// $MESHMARK_POD_BINARY, else meshmark-pod beside the running executable, where `make
// build` puts it. The error says how to build it.
func Find() (string, error) {
	if p := os.Getenv(BinaryEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("$%s: %w", BinaryEnv, err)
		}
		return p, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("finding %s beside the running meshmark: %w", Name, err)
	}
	if resolved, err := filepath.EvalSymlinks(exe); err == nil {
		exe = resolved
	}
	p := filepath.Join(filepath.Dir(exe), Name)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%s, the small binary that pods run, is not beside %s: build both with `make build` "+
			"(or `CGO_ENABLED=0 go build -o %s ./cmd/meshmark-pod`), or name it in $%s", Name, exe, p, BinaryEnv)
	}
	return p, nil
}
