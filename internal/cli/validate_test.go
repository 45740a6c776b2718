package cli

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/study"
)

func runValidate(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	root := newRoot()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(append([]string{"validate"}, args...))
	err = root.Execute()
	return out.String(), errOut.String(), err
}

func TestValidateCommand(t *testing.T) {
	good := "../../examples/demo.yaml"
	out, _, err := runValidate(t, good, "demo")
	if err != nil {
		t.Fatalf("valid studies rejected: %v", err)
	}
	if !strings.Contains(out, "examples/demo.yaml: ok (3 meshes, 2 experiments, 132 trials)") ||
		!strings.Contains(out, "builtin:demo: ok") {
		t.Errorf("output:\n%s", out)
	}

	// --print output is itself a valid study with the defaults written out.
	out, _, err = runValidate(t, "--print", good)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "seed: ") || !strings.Contains(out, "arrival: constant") {
		t.Errorf("--print lacks defaults:\n%s", out)
	}
	printed := filepath.Join(t.TempDir(), "printed.yaml")
	if err := os.WriteFile(printed, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := study.ParseFile(printed); err != nil {
		t.Errorf("--print output does not parse: %v", err)
	}

	bad := filepath.Join(t.TempDir(), "bad.yaml")
	doc, _ := os.ReadFile(good)
	doc = bytes.Replace(doc, []byte("rate: 50% of lowest capacity"), []byte(`rate: "50% of fastest capacity"`), 1)
	doc = bytes.Replace(doc, []byte("order: interleaved"), []byte("order: interleave"), 1)
	if err := os.WriteFile(bad, doc, 0o644); err != nil {
		t.Fatal(err)
	}
	_, errOut, err := runValidate(t, good, bad)
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 2 {
		t.Fatalf("invalid study: want exit code 2, got %v", err)
	}
	rateLine := 1 + bytes.Count(doc[:bytes.Index(doc, []byte("rate: \"50%"))], []byte("\n"))
	lines := strings.Split(strings.TrimSpace(errOut), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], fmt.Sprintf("bad.yaml:%d:13: spec.experiments[1].rate:", rateLine)) ||
		!strings.Contains(lines[1], `spec.order: "interleave": expected interleaved or sequential (did you mean "interleaved"?)`) {
		t.Errorf("every problem, one per line, with position:\n%s", errOut)
	}
}
