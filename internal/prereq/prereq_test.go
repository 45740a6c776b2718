package prereq

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestVersionOf(t *testing.T) {
	cases := map[string]string{
		"\n/work/main/.tools/envoy-venv/lib/python3.11/site-packages/envoy/_bin/envoy  version: 9e55/1.40.0/Clean/RELEASE/BoringSSL\n": "9e55/1.40.0/Clean/RELEASE/BoringSSL",
		"/usr/bin/chromium: 9: [: 25276502016: unexpected operator\nChromium 156.0.8078.79 built on Debian\n":                          "Chromium 156.0.8078.79 built on Debian",
		"nginx version: nginx/1.22.1\n": "nginx version: nginx/1.22.1",
		"no digits here\n":              "",
		"curl 7.88.1 (x86_64-pc-linux-gnu) libcurl/7.88.1 OpenSSL/3.0.17 zlib/1.2.13 brotli/1.0.9 OpenLDAP/2.5.13\n": "7.88.1",
	}
	for in, want := range cases {
		if got := versionOf(in); got != want {
			t.Errorf("versionOf(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestToolsDirOverride(t *testing.T) {
	d := t.TempDir()
	t.Setenv("MESHMARK_TOOLS", d)
	if got := ToolsDir(); got != d {
		t.Fatalf("ToolsDir() = %q, want %q", got, d)
	}
	t.Setenv("MESHMARK_ENVOY", filepath.Join(d, "nope"))
	if _, err := Envoy(); err == nil {
		t.Fatal("Envoy() with a missing MESHMARK_ENVOY should fail")
	}
}

// TestEnvoyPinned checks the Envoy that setup installed is the pinned release, the way
// doctor does; `make test` runs setup first, so a miss here is a real setup bug.
func TestEnvoyPinned(t *testing.T) {
	var envoy Item
	for _, it := range Items() {
		if it.Name == "envoy" {
			envoy = it
		}
	}
	st := Check(context.Background(), envoy)
	if !st.OK() {
		t.Fatalf("envoy: %v (install with: %s)", st.Err, envoy.Install)
	}
	if out, err := exec.Command(st.Path, "--version").Output(); err != nil || len(out) == 0 {
		t.Fatalf("%s --version: %v", st.Path, err)
	}
}

// TestProxyInstalledFromToolsSource installs a proxy the way setup does, from a tools
// source laid out like shared/tools, and finds it with its licence and provenance.
func TestProxyInstalledFromToolsSource(t *testing.T) {
	src, tools := t.TempDir(), t.TempDir()
	t.Setenv("MESHMARK_TOOLS", tools)
	t.Setenv(ToolsSourceEnv, src)
	// make puts the project's own tools dir on PATH, where a real traefik may be.
	t.Setenv("PATH", "/usr/bin:/bin")
	if _, err := ProxyBin("traefik"); err == nil || !strings.Contains(err.Error(), "meshmark setup") {
		t.Fatalf("ProxyBin before setup = %v, want an error saying how to install it", err)
	}
	dir := filepath.Join(src, "traefik")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// A script stands in for the 181 MB binary: setup copies whatever the folder holds.
	script := "#!/bin/sh\necho 'Version:      v3.7.9'\n"
	for name, body := range map[string]string{"traefik": script, "LICENSE.md": "MIT", "PROVENANCE.md": "built here"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var buf bytes.Buffer
	var item Item
	for _, it := range Items() {
		if it.Name == "traefik" {
			item = it
		}
	}
	if err := exec.Command("sh", "-c", item.Install).Run(); err != nil {
		t.Fatalf("install: %v (%s)", err, item.Install)
	}
	st := Check(context.Background(), item)
	if !st.OK() || st.Version != "v3.7.9" || st.Path != filepath.Join(tools, "bin", "traefik") {
		t.Fatalf("after install: %+v (%s)", st, buf.String())
	}
	for _, f := range []string{"LICENSE.md", "PROVENANCE.md"} {
		if _, err := os.Stat(filepath.Join(tools, "share", "traefik", f)); err != nil {
			t.Errorf("%s not installed beside the binary: %v", f, err)
		}
	}
	// Without a tools source, setup explains instead of failing.
	t.Setenv(ToolsSourceEnv, "")
	t.Setenv("MESHMARK_TOOLS", t.TempDir())
	for _, it := range Items() {
		if it.Name == "ztunnel" && (it.Install != "" || !it.Optional || !strings.Contains(it.Hint, ToolsSourceEnv)) {
			t.Errorf("ztunnel without a tools source: %+v", it)
		}
	}
}
