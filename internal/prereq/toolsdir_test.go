package prereq

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const helperEnv = "MESHMARK_PREREQ_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "tools-dir" {
		fmt.Print(ToolsDir())
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// toolsDirFromElsewhere runs this test binary (which go test builds outside the
// checkout) from a directory outside the checkout, as a copied meshmark would run, and
// returns the tools dir it finds.
func toolsDirFromElsewhere(t *testing.T, env ...string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Dir = t.TempDir()
	cmd.Env = append([]string{helperEnv + "=tools-dir", "PATH=" + os.Getenv("PATH")}, env...)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helper: %v", err)
	}
	return string(out)
}

// `meshmark setup` records where it installed the tools; meshmark run from outside the
// checkout finds them there instead of in its own per-user data dir, and falls back to
// that dir when the recorded one is gone.
func TestToolsDirRecordedBySetupIsFoundFromAnywhere(t *testing.T) {
	if sourceRoot() == "" {
		t.Skip("the test binary is expected to run inside the checkout")
	}
	cfg, home, data := t.TempDir(), t.TempDir(), t.TempDir()
	tools := filepath.Join(t.TempDir(), "checkout", ".tools")
	env := []string{"XDG_CONFIG_HOME=" + cfg, "HOME=" + home, "XDG_DATA_HOME=" + data}
	if got, want := toolsDirFromElsewhere(t, env...), filepath.Join(data, "meshmark", "tools"); got != want {
		t.Fatalf("before setup, from elsewhere: %q, want the data dir %q", got, want)
	}
	t.Setenv("XDG_CONFIG_HOME", cfg)
	t.Setenv("MESHMARK_TOOLS", tools) // where setup installs, as .tools of a checkout
	var log bytes.Buffer
	// A need nothing has: setup installs nothing and only records the dir.
	if err := Setup(context.Background(), &log, Need("nothing")); err != nil {
		t.Fatalf("setup: %v (%s)", err, log.String())
	}
	if got := toolsDirFromElsewhere(t, env...); got != tools {
		t.Errorf("after setup, from elsewhere: %q, want the recorded %q", got, tools)
	}
	b, err := os.ReadFile(filepath.Join(cfg, "meshmark", "tools-dir"))
	if err != nil || strings.TrimSpace(string(b)) != tools {
		t.Errorf("record: %q, %v", b, err)
	}
	if err := os.RemoveAll(tools); err != nil {
		t.Fatal(err)
	}
	if got, want := toolsDirFromElsewhere(t, env...), filepath.Join(data, "meshmark", "tools"); got != want {
		t.Errorf("recorded dir removed, from elsewhere: %q, want the data dir %q", got, want)
	}
}
