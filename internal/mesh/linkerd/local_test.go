package linkerd

import (
	"archive/tar"
	"errors"
	"io"
	"path"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	"github.com/meshmark/meshmark/internal/prereq"
	linkerdcharts "github.com/meshmark/meshmark/third_party/linkerd-charts"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// localBuild skips the test when Linkerd has not been built for a local cluster: that
// build is made only on request (`meshmark setup --for linkerd`: Linkerd's repositories
// and a Rust build of tens of minutes), so make test does not make it, in CI neither.
func localBuild(t *testing.T) {
	t.Helper()
	proxyBinary(t)
	for _, name := range LocalBinaries {
		if _, err := prereq.Tool(name); err != nil {
			t.Skipf("Linkerd's images for a local cluster are made of `meshmark setup --for linkerd`'s build (scripts/build-linkerd.sh): %v", err)
		}
	}
}

// TestLocalImagesRunWhatTheChartsAsk renders the vendored control-plane chart with the
// values a local cluster gets, and checks every container it renders (the controllers,
// and the proxy and linkerd-init the control plane's own pods carry, as the injector
// adds them to the app's) against the images LocalImages makes: the image is one of
// them, by the exact name, and the executable the container runs is in it.
func TestLocalImagesRunWhatTheChartsAsk(t *testing.T) {
	localBuild(t)
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	in, err := kubernetesInstall(t, map[string]any{"mtls": "strict"})
	if err != nil {
		t.Fatal(err)
	}
	notes, err := in.ForLocalCluster(&in)
	if err != nil {
		t.Fatal(err)
	}
	if notes["linkerd images"] == "" || !strings.Contains(notes["linkerd local cluster"], ClusterNetworks) {
		t.Errorf("provenance notes %v: want the images' sources and what the install changed", notes)
	}
	images, err := LocalImages()
	if err != nil {
		t.Fatal(err)
	}
	contents := map[string]imageContents{}
	for _, im := range images {
		img, err := im.Build()
		if err != nil {
			t.Fatalf("%s: %v", im.Name, err)
		}
		contents[im.Name] = readImage(t, img)
	}

	pods := renderPods(t, in.Charts[1])
	containers := 0
	for name, spec := range pods {
		for _, c := range append(append([]corev1.Container(nil), spec.InitContainers...), spec.Containers...) {
			containers++
			im, ok := contents[c.Image]
			if !ok {
				t.Errorf("%s/%s: image %s is not one a local cluster's nodes hold", name, c.Name, c.Image)
				continue
			}
			exe := im.entrypoint
			if len(c.Command) > 0 {
				exe = c.Command[0]
			}
			if !im.executable(exe) {
				t.Errorf("%s/%s: %s runs %s, which is not an executable in it", name, c.Name, c.Image, exe)
			}
			if c.Name == "linkerd-init" && (c.SecurityContext == nil || c.SecurityContext.RunAsUser == nil || *c.SecurityContext.RunAsUser != 0) {
				t.Errorf("%s/linkerd-init: want it run as root (no file capabilities in the image)", name)
			}
		}
	}
	if containers < 8 {
		t.Fatalf("rendered %d containers in %d pods: the chart did not render the control plane", containers, len(pods))
	}
	// The proxy's entrypoint executes the proxy by this path (linkerd2's
	// proxy-identity/run_proxy_unix.go).
	if !contents[ProxyImage+":"+linkerdcharts.Tag].executable("/usr/lib/linkerd/linkerd2-proxy") {
		t.Error("the proxy image has no /usr/lib/linkerd/linkerd2-proxy for linkerd2-proxy-identity to execute")
	}
}

// TestForLocalClusterKeepsTheStudysValues: what a study sets in helm_values wins over
// what a local cluster fills in.
func TestForLocalClusterKeepsTheStudysValues(t *testing.T) {
	localBuild(t)
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	in, err := kubernetesInstall(t, map[string]any{ValuesOption: map[string]any{
		"linkerd-control-plane": map[string]any{"clusterNetworks": "10.0.0.0/8", "proxyInit": map[string]any{"logLevel": "debug"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := in.ForLocalCluster(&in); err != nil {
		t.Fatal(err)
	}
	v := in.Charts[1].Values
	pi, _ := v["proxyInit"].(map[string]any)
	if v["clusterNetworks"] != "10.0.0.0/8" || pi["logLevel"] != "debug" || pi["runAsRoot"] != true || v["disableHeartBeat"] != true {
		t.Errorf("values %v: want the study's clusterNetworks and proxyInit.logLevel, and the local cluster's runAsRoot and disableHeartBeat", v)
	}
}

type imageContents struct {
	entrypoint string
	modes      map[string]int64 // regular files by path
	links      map[string]string
}

func (ic imageContents) executable(p string) bool {
	for range 8 {
		if target, ok := ic.links[p]; ok {
			if !path.IsAbs(target) {
				target = path.Join(path.Dir(p), target)
			}
			p = target
			continue
		}
		break
	}
	return ic.modes[p]&0o111 != 0
}

func readImage(t *testing.T, img v1.Image) imageContents {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	ic := imageContents{modes: map[string]int64{}, links: map[string]string{}}
	if len(cf.Config.Entrypoint) > 0 {
		ic.entrypoint = cf.Config.Entrypoint[0]
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			p := "/" + strings.TrimPrefix(path.Clean(h.Name), "/")
			switch h.Typeflag {
			case tar.TypeReg:
				ic.modes[p] = h.Mode
			case tar.TypeSymlink:
				ic.links[p] = h.Linkname
			}
		}
		rc.Close()
	}
	return ic
}

// renderPods renders the chart as Helm would install it, without a cluster, and returns
// the pod templates of its Deployments by name.
func renderPods(t *testing.T, hc meshkube.HelmChart) map[string]corev1.PodSpec {
	t.Helper()
	ch, err := loader.Load(hc.Chart)
	if err != nil {
		t.Fatal(err)
	}
	// The chart's dependency on file://../partials, which Helm resolves at package time.
	partials, err := loader.Load(filepath.Join(filepath.Dir(hc.Chart), "partials"))
	if err != nil {
		t.Fatal(err)
	}
	ch.AddDependency(partials)
	install := action.NewInstall(&action.Configuration{})
	install.DryRun, install.ClientOnly, install.Replace = true, true, true
	install.ReleaseName, install.Namespace = hc.Release, hc.Namespace
	install.KubeVersion = &chartutil.KubeVersion{Version: "v1.37.2", Major: "1", Minor: "37"}
	rel, err := install.Run(ch, hc.Values)
	if err != nil {
		t.Fatal(err)
	}
	pods := map[string]corev1.PodSpec{}
	for _, m := range releaseutil.SplitManifests(rel.Manifest) {
		var head struct{ Kind string }
		if err := yaml.Unmarshal([]byte(m), &head); err != nil || head.Kind != "Deployment" {
			continue
		}
		var d appsv1.Deployment
		if err := yaml.Unmarshal([]byte(m), &d); err != nil {
			t.Fatal(err)
		}
		pods[d.Name] = d.Spec.Template.Spec
	}
	return pods
}
