package cli

import (
	"bytes"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"
)

func runImageBuild(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	root := newRoot()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(append([]string{"image", "build"}, args...))
	err = root.Execute()
	return out.String(), errOut.String(), err
}

func TestImageBuildUsage(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"--tag", "meshmark:v1"},
		{"--out", "x.tar", "extra"},
		{"--out", "x.tar", "--tag", "Bad Tag"},
		{"--push", "registry.example/UPPER:v1"},
		{"--out", "x.tar", "--no-such-flag"},
	} {
		_, _, err := runImageBuild(t, args...)
		var ee *exitError
		if !errors.As(err, &ee) || ee.code != 2 {
			t.Errorf("image build %q: want exit code 2, got %v", args, err)
		}
	}
	_, _, err := runImageBuild(t)
	if err == nil || !strings.Contains(err.Error(), "--out FILE, --push REF") {
		t.Errorf("no output named: %v", err)
	}
}

func TestImageBuild(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module tiny\n\ngo 1.26\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte("package main\n\nfunc main() {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "tiny")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = dir
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOWORK=off", "GOFLAGS=-buildvcs=false")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	ref := strings.TrimPrefix(srv.URL, "http://") + "/meshmark:t"
	archive := filepath.Join(dir, "meshmark.tar")

	out, errOut, err := runImageBuild(t, "--binary", bin, "--out", archive, "--push", ref, "--insecure")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "built image sha256:") ||
		lines[1] != "wrote "+archive+" (OCI archive, meshmark:"+Version+")" ||
		lines[2] != "pushed "+strings.TrimSuffix(ref, ":t")+"@"+strings.TrimPrefix(lines[0], "built image ") {
		t.Errorf("output:\n%s", out)
	}
	if !strings.Contains(errOut, "pushing "+ref+": ") {
		t.Errorf("no push progress on stderr:\n%s", errOut)
	}
	if _, err := os.Stat(archive); err != nil {
		t.Error(err)
	}

	_, _, err = runImageBuild(t, "--binary", "/bin/ls", "--out", archive)
	if err == nil || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
		t.Errorf("dynamic binary: %v", err)
	}
}
