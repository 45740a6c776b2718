package linkerd

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/meshmark/meshmark/internal/image"
	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	"github.com/meshmark/meshmark/internal/prereq"
	linkerdcharts "github.com/meshmark/meshmark/third_party/linkerd-charts"
)

// A local cluster (meshmark cluster up) reaches no registry. There Linkerd runs from
// images made on this machine, under the names the vendored charts ask for: its control
// plane built from the linkerd2 release the charts come from (scripts/build-linkerd.sh),
// and the linkerd2-proxy release build the local profile runs.
const (
	ControllerImage = "cr.l5d.io/linkerd/controller"
	ProxyImage      = "cr.l5d.io/linkerd/proxy"
)

// The binaries scripts/build-linkerd.sh builds, by the names they have in the tools
// directory.
const (
	controllerBin       = "linkerd-controller"
	policyControllerBin = "linkerd-policy-controller"
	proxyIdentityBin    = "linkerd2-proxy-identity"
	proxyInitBin        = "linkerd2-proxy-init"
)

// LocalBinaries are the parts of Linkerd's control plane and proxy image that setup
// builds from Linkerd's source for a local cluster.
var LocalBinaries = []string{controllerBin, policyControllerBin, proxyIdentityBin, proxyInitBin}

// LocalImages are Linkerd's images for a local cluster, laid out as the release's
// Dockerfile.controller and Dockerfile.proxy lay them out:
//   - controller: /controller (destination, identity, proxy-injector, ...) and
//     /linkerd-policy-controller, with the policy controller's libraries;
//   - proxy: /usr/lib/linkerd/linkerd2-proxy-identity as entrypoint (it makes the
//     proxy's key and CSR, then executes linkerd2-proxy), linkerd2-proxy with its
//     libraries, linkerd2-proxy-init (the linkerd-init container) with iptables.
//
// Left out, as nothing the local install runs calls them: linkerd-await (only for a
// proxy that is not a native sidecar) and linkerd2-network-validator (only with
// Linkerd's CNI plugin).
func LocalImages() ([]image.Named, error) {
	bins := map[string]string{}
	for _, name := range LocalBinaries {
		p, err := prereq.Tool(name)
		if err != nil {
			return nil, fmt.Errorf("%w: %s not found: `meshmark setup --for linkerd` builds Linkerd %s from its source (tens of minutes)", mesh.ErrImagesNotBuilt, name, linkerdcharts.Tag)
		}
		bins[name] = p
	}
	proxy, err := prereq.ProxyBin("linkerd2-proxy")
	if err != nil {
		return nil, err
	}
	tag := linkerdcharts.Tag
	labels := map[string]string{"org.opencontainers.image.version": tag, "org.opencontainers.image.source": "https://github.com/linkerd/linkerd2"}
	env := []string{"LINKERD_CONTAINER_VERSION_OVERRIDE=" + tag}
	base := []image.File{
		{Path: "/etc/passwd", Data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n")},
		{Path: "/etc/group", Data: []byte("root:x:0:\nnobody:x:65534:\n")},
		{Path: "/tmp", Dir: true, Mode: 0o1777},
		{Path: "/run", Dir: true},
	}
	controller := image.Named{Name: ControllerImage + ":" + tag, Build: func() (v1.Image, error) {
		policy, err := filepath.EvalSymlinks(bins[policyControllerBin])
		if err != nil {
			return nil, err
		}
		libs, err := image.SharedLibraries(policy)
		if err != nil {
			return nil, err
		}
		files := append(append([]image.File(nil), base...),
			image.File{Path: "/controller", Source: bins[controllerBin]},
			image.File{Path: "/linkerd-policy-controller", Source: policy})
		return image.FromFiles(dedupe(append(files, libs...)),
			image.Config{Entrypoint: []string{"/controller"}, Env: env, Labels: labels})
	}}
	proxyImage := image.Named{Name: ProxyImage + ":" + tag, Build: func() (v1.Image, error) {
		real, err := filepath.EvalSymlinks(proxy)
		if err != nil {
			return nil, err
		}
		libs, err := image.SharedLibraries(real)
		if err != nil {
			return nil, err
		}
		iptables, err := image.HostIptables()
		if err != nil {
			return nil, err
		}
		files := append(append([]image.File(nil), base...),
			image.File{Path: "/usr/lib/linkerd/linkerd2-proxy", Source: real},
			image.File{Path: "/usr/lib/linkerd/linkerd2-proxy-identity", Source: bins[proxyIdentityBin]},
			image.File{Path: "/usr/lib/linkerd/linkerd2-proxy-init", Source: bins[proxyInitBin]})
		return image.FromFiles(dedupe(append(append(files, libs...), iptables...)), image.Config{
			Entrypoint: []string{"/usr/lib/linkerd/linkerd2-proxy-identity"},
			Env:        append(env, "LINKERD2_PROXY_LOG=warn,linkerd=info", "LINKERD2_PROXY_LOG_FORMAT=plain"),
			User:       "65534", Labels: labels})
	}}
	return []image.Named{controller, proxyImage}, nil
}

// dedupe keeps the first file of each path: executables' libraries overlap.
func dedupe(files []image.File) []image.File {
	seen := map[string]bool{}
	var out []image.File
	for _, f := range files {
		if !seen[f.Path] {
			seen[f.Path] = true
			out = append(out, f)
		}
	}
	return out
}

// ForLocalCluster adapts Linkerd's install to a local cluster (meshkube.KubernetesInstall
// .ForLocalCluster). The vendored charts already install from this machine and name the
// images LocalImages makes; what changes:
//   - clusterNetworks is the local cluster's 198.18.0.0/15: Linkerd's default lists
//     only the private ranges, and a proxy does no discovery (so no mTLS) for a
//     destination outside them;
//   - linkerd-init runs as root: the release image gives linkerd2-proxy-init and
//     iptables file capabilities (setcap) so that it runs as nobody, which an image
//     made here of plain files cannot; the container's capabilities are the chart's
//     (NET_ADMIN, NET_RAW);
//   - no heartbeat CronJob, which reports to versioncheck.linkerd.io, unreachable here.
//
// A study that installs Linkerd from a Helm repository (linkerd_repo) is left as it is:
// its images are not on the nodes, so it fails as it would on any cluster that cannot
// pull them.
func ForLocalCluster(in *meshkube.KubernetesInstall) (map[string]string, error) {
	for _, name := range LocalBinaries {
		if _, err := prereq.Tool(name); err != nil {
			return nil, fmt.Errorf("a local cluster runs Linkerd's control plane built by setup: %s not found (run `meshmark setup --for cluster`)", name)
		}
	}
	notes := map[string]string{}
	for i := range in.Charts {
		hc := &in.Charts[i]
		if hc.Release != controlPlaneRelease || hc.Repo != "" {
			continue
		}
		hc.Values = mesh.MergeValues(map[string]any{
			"clusterNetworks":  ClusterNetworks,
			"proxyInit":        map[string]any{"runAsRoot": true},
			"disableHeartBeat": true,
		}, hc.Values) // the study's values win
		notes["linkerd images"] = fmt.Sprintf("%s and %s:%s made on this machine: the control plane built from linkerd2 %s (%s), the linkerd2-proxy release build setup installed (its version is in each pod's proxy metrics), linkerd2-proxy-init %s",
			ControllerImage, ProxyImage, linkerdcharts.Tag, linkerdcharts.Tag, policyControllerNote(), proxyInitVersion())
		notes["linkerd local cluster"] = "clusterNetworks " + ClusterNetworks + "; linkerd-init as root (the image has no file capabilities); heartbeat off"
	}
	return notes, nil
}

// sources is what setup's build recorded of its sources (share/linkerd/SOURCES).
func sources() string {
	b, err := os.ReadFile(filepath.Join(prereq.ToolsDir(), "share", "linkerd", "SOURCES"))
	if err != nil {
		return ""
	}
	return string(b)
}

func sourceLine(prefix string) string {
	for _, l := range strings.Split(sources(), "\n") {
		if strings.HasPrefix(l, prefix) {
			return strings.TrimSpace(strings.TrimPrefix(l, prefix))
		}
	}
	return "unknown"
}

func policyControllerNote() string {
	return "policy controller by " + sourceLine("rustc: ")
}

func proxyInitVersion() string { return sourceLine("linkerd2-proxy-init ") }
