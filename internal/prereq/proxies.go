package prereq

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// ToolsSourceEnv names a directory holding release builds of the proxies no package
// registry ships, one folder each with the binary, its licence and PROVENANCE.md (the
// layout of the project's shared/tools). `meshmark setup` installs from it.
const ToolsSourceEnv = "MESHMARK_TOOLS_DIR"

// Proxy is a data-plane binary that no package registry serves.
type Proxy struct {
	// Name is the binary's name and its folder in the tools source.
	Name    string
	Purpose string
	// VersionArgs print the version; VersionRe picks it from the output (group 1).
	VersionArgs []string
	VersionRe   *regexp.Regexp
	// Obtain tells a user without a tools source where releases come from.
	Obtain string
}

// Proxies are the release-built proxies meshmark runs, in setup order.
var Proxies = []Proxy{
	{Name: "linkerd2-proxy", Purpose: "the linkerd profile's sidecar",
		VersionRe: regexp.MustCompile(`linkerd2_proxy: release (\S+)`),
		Obtain:    "Linkerd publishes linkerd2-proxy release tarballs on GitHub (linkerd/linkerd2-proxy, releases), or build it: cargo build --release -p linkerd2-proxy"},
	{Name: "ztunnel", Purpose: "the istio-ambient profile's node proxy",
		VersionArgs: []string{"version"}, VersionRe: regexp.MustCompile(`BuildInfo\{(Version:"[^"]*"[^}]*RustVersion:"[^"]*")`),
		Obtain: "Istio ships ztunnel in its ztunnel container image (copy /usr/local/bin/ztunnel out of it), or build it from github.com/istio/ztunnel: cargo build --release --bin ztunnel"},
	{Name: "traefik", Purpose: "the traefik-mesh profile's node proxy",
		VersionArgs: []string{"version"}, VersionRe: regexp.MustCompile(`Version:\s+(\S+)`),
		Obtain: "Traefik publishes release binaries on GitHub (traefik/traefik, releases, v3.7.9)"},
}

// ProxyBin returns the path of a release-built proxy: the tools dir, else PATH. The
// error says how to get it.
func ProxyBin(name string) (string, error) {
	if p, err := toolBin(name)(); err == nil {
		return p, nil
	}
	for _, px := range Proxies {
		if px.Name == name {
			return "", fmt.Errorf("%s not found in %s/bin or on PATH: %s", name, ToolsDir(), px.installHint())
		}
	}
	return "", fmt.Errorf("%s: not a known proxy", name)
}

func (px Proxy) installHint() string {
	if src := os.Getenv(ToolsSourceEnv); src != "" {
		return fmt.Sprintf("run `meshmark setup` (it installs it from %s=%s)", ToolsSourceEnv, src)
	}
	return fmt.Sprintf("set %s to a directory with %s/%s in it and run `meshmark setup`, or put %s on PATH. %s",
		ToolsSourceEnv, px.Name, px.Name, px.Name, px.Obtain)
}

// item is the proxy as a prerequisite: installed by copying from the tools source with
// its licence and provenance, or, without one, reported with how to obtain it.
func (px Proxy) item(tools string) Item {
	it := Item{Name: px.Name, Purpose: px.Purpose, Need: NeedRun, Optional: true,
		Find: toolBin(px.Name), VersionArgs: px.VersionArgs, VersionRe: px.VersionRe}
	src := os.Getenv(ToolsSourceEnv)
	if src == "" {
		it.Hint = px.installHint()
		return it
	}
	if abs, err := filepath.Abs(src); err == nil {
		src = abs
	}
	from := filepath.Join(src, px.Name)
	share := filepath.Join(tools, "share", px.Name)
	it.Install = fmt.Sprintf("install -D -m 0755 %s %s && mkdir -p %s && cp -f %s/*LICENSE* %s/PROVENANCE.md %s/",
		shellQuote(filepath.Join(from, px.Name)), shellQuote(filepath.Join(tools, "bin", px.Name)),
		shellQuote(share), shellQuote(from), shellQuote(from), shellQuote(share))
	return it
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// SHA256 fingerprints a binary, so a result names exactly which build it ran.
func SHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
