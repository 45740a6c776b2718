package ambient

import (
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/mesh"
)

func TestKubernetesInstallIsIstioAmbient(t *testing.T) {
	p, err := mesh.New(Name, map[string]any{"mtls": "strict", "helm_values": map[string]any{"ztunnel": map[string]any{"logLevel": "debug"}}})
	if err != nil {
		t.Fatal(err)
	}
	in, err := p.(mesh.KubernetesInstaller).Kubernetes()
	if err != nil {
		t.Fatal(err)
	}
	var releases []string
	for _, ch := range in.Charts {
		releases = append(releases, ch.Release+"="+ch.Chart)
	}
	if strings.Join(releases, " ") != "istio-base=base istiod=istiod istio-cni=cni ztunnel=ztunnel" {
		t.Errorf("charts %v: want Istio's ambient install order", releases)
	}
	if in.Charts[1].Values["profile"] != "ambient" || in.Charts[2].Values["profile"] != "ambient" || in.Charts[3].Values["logLevel"] != "debug" {
		t.Errorf("values: istiod %v, cni %v, ztunnel %v", in.Charts[1].Values, in.Charts[2].Values, in.Charts[3].Values)
	}
	if in.NamespaceLabels["istio.io/dataplane-mode"] != "ambient" || in.EnrolledAnnotations[RedirectionAnnotation] != "enabled" ||
		in.Sidecar != "" || len(in.Manifests) != 1 || !strings.Contains(in.Manifests[0], "mode: STRICT") {
		t.Errorf("install %+v", in)
	}
	p, err = mesh.New(Name, map[string]any{"waypoint": true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.(mesh.KubernetesInstaller).Kubernetes(); err == nil || !strings.Contains(err.Error(), `"waypoint": not carried over to Istio yet`) {
		t.Errorf("waypoint on Kubernetes: %v", err)
	}
}
