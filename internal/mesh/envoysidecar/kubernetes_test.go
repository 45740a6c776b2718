package envoysidecar

import (
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/istiohelm"
)

func kubernetesInstall(t *testing.T, raw map[string]any) (mesh.KubernetesInstall, error) {
	t.Helper()
	p, err := mesh.New(Name, raw)
	if err != nil {
		t.Fatal(err)
	}
	return p.(mesh.KubernetesInstaller).Kubernetes()
}

func TestKubernetesInstallIsIstioAsConfigured(t *testing.T) {
	in, err := kubernetesInstall(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(in.Charts) != 2 || in.Charts[0].Chart != "base" || in.Charts[1].Chart != "istiod" ||
		in.Charts[1].Version != istiohelm.Version || in.Charts[1].Repo != istiohelm.Repo || in.Charts[1].Values != nil {
		t.Errorf("stock Istio: charts %+v", in.Charts)
	}
	if len(in.Manifests) != 0 || in.NamespaceLabels["istio-injection"] != "enabled" || in.Sidecar != "istio-proxy" {
		t.Errorf("stock Istio (permissive, no configuration): %+v", in)
	}

	in, err = kubernetesInstall(t, map[string]any{"mtls": "strict", "concurrency": 4, "access_log": true,
		"istio_charts": "/opt/istio/manifests/charts",
		"helm_values": map[string]any{"istiod": map[string]any{"pilot": map[string]any{"resources": map[string]any{"requests": map[string]any{"cpu": "1"}}},
			"meshConfig": map[string]any{"accessLogEncoding": "JSON"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(in.Manifests) != 1 || !strings.Contains(in.Manifests[0], "kind: PeerAuthentication") || !strings.Contains(in.Manifests[0], "mode: STRICT") {
		t.Errorf("strict mTLS: manifests %q", in.Manifests)
	}
	if in.Charts[0].Chart != "/opt/istio/manifests/charts/base" || in.Charts[1].Chart != "/opt/istio/manifests/charts/istio-control/istio-discovery" || in.Charts[1].Repo != "" {
		t.Errorf("local charts: %+v", in.Charts)
	}
	mc := in.Charts[1].Values["meshConfig"].(map[string]any)
	if mc["accessLogFile"] != "/dev/stdout" || mc["accessLogEncoding"] != "JSON" || mc["defaultConfig"].(map[string]any)["concurrency"] != 4 {
		t.Errorf("meshConfig %v: want the options and the study's values merged", mc)
	}
	if in.Charts[1].Values["pilot"] == nil {
		t.Errorf("istiod values %v lack the study's pilot values", in.Charts[1].Values)
	}

	for _, tc := range []struct {
		raw  map[string]any
		want string
	}{
		{map[string]any{"telemetry": "off"}, `"telemetry": not carried over to Istio yet`},
		{map[string]any{"istio_version": "latest"}, `"istio_version": "latest" is not an Istio release`},
		{map[string]any{"helm_values": map[string]any{"pilot": map[string]any{}}}, `"helm_values.pilot": no such release (releases: istio-base, istiod)`},
		{map[string]any{"helm_values": "x=1"}, `"helm_values": want a map of release name to values`},
	} {
		if _, err := kubernetesInstall(t, tc.raw); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.raw, err, tc.want)
		}
	}
}
