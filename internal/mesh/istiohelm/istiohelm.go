// Package istiohelm is Istio's Helm install as Istio's documentation gives it, shared by
// the profiles that are Istio on Kubernetes (envoy-sidecar: sidecar mode; istio-ambient:
// ambient mode): which charts, from where, at which release, with the study's values,
// and the mesh-wide mTLS setting.
package istiohelm

import (
	"fmt"
	"maps"
	"path/filepath"
	"regexp"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/meshkube"
)

const (
	// Version is the Istio release installed unless VersionOption says otherwise.
	Version = "1.31.1"
	// Repo is Istio's Helm repository.
	Repo = "https://istio-release.storage.googleapis.com/charts"
	// Namespace is where Istio's control plane and node agents run.
	Namespace = "istio-system"

	VersionOption = "istio_version"
	ChartsOption  = "istio_charts"
	ValuesOption  = "helm_values"
)

// SMPType is Istio in the Service Mesh Performance spec's mesh types.
const SMPType = "istio"

// OnCluster is how Istio shows on a cluster, in either mode, for a profile's
// registration: sidecar is the container its injection adds ("" in ambient mode). Its
// opt-outs cover both modes, sidecar injection and ambient capture, since one istiod
// serves both; its classic ingress gateway's pods are labelled istio=ingressgateway.
func OnCluster(sidecar string) meshkube.ClusterMarks {
	return meshkube.ClusterMarks{
		Sidecar:          sidecar,
		GatewayPodLabels: map[string]string{"istio": "ingressgateway"},
		Outside: meshkube.OptOut{
			NamespaceLabels: map[string]string{"istio-injection": "disabled", "istio.io/dataplane-mode": "none"},
			PodLabels:       map[string]string{"sidecar.istio.io/inject": "false", "istio.io/dataplane-mode": "none"},
			PodAnnotations:  map[string]string{"sidecar.istio.io/inject": "false"},
		},
	}
}

// Options documents the options every Istio profile takes on Kubernetes, for its
// registration.
var Options = map[string]string{
	VersionOption: "on Kubernetes: the Istio release whose charts are installed (default " + Version + ")",
	ChartsOption:  "on Kubernetes: a local copy of an Istio release's manifests/charts to install from instead of Istio's Helm repository",
	ValuesOption:  "on Kubernetes: chart values by release, {istio-base: {...}, istiod: {...}, ...}, over meshmark's own",
}

// WithOptions adds Options to a profile's own options.
func WithOptions(own map[string]string) map[string]string {
	maps.Copy(own, Options)
	return own
}

// Chart is one of Istio's charts: its release name, its name in the repository, and its
// directory in a release's manifests/charts.
type Chart struct {
	Release, Name, Dir string
	Values             map[string]any
}

// The charts of Istio's Helm install, in install order.
var (
	Base    = Chart{Release: "istio-base", Name: "base", Dir: "base"}
	Istiod  = Chart{Release: "istiod", Name: "istiod", Dir: filepath.Join("istio-control", "istio-discovery")}
	CNI     = Chart{Release: "istio-cni", Name: "cni", Dir: "istio-cni"}
	Ztunnel = Chart{Release: "ztunnel", Name: "ztunnel", Dir: "ztunnel"}
)

var release = regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$`)

// Charts pins the charts to the release the options name (or a local copy of it) and
// lays the study's values over the given ones.
func Charts(o mesh.Options, charts ...Chart) ([]meshkube.HelmChart, error) {
	version := Version
	if v, ok := o.Own[VersionOption]; ok {
		version = fmt.Sprint(v)
	}
	if !release.MatchString(version) {
		return nil, &mesh.OptionError{Key: VersionOption, Msg: fmt.Sprintf("%q is not an Istio release like %s", version, Version)}
	}
	dir, _ := o.Own[ChartsOption].(string)
	var out []meshkube.HelmChart
	for _, ch := range charts {
		hc := meshkube.HelmChart{Release: ch.Release, Namespace: Namespace, Chart: ch.Name, Repo: Repo, Version: version, Values: ch.Values}
		if dir != "" {
			hc.Chart, hc.Repo, hc.Version = filepath.Join(dir, ch.Dir), "", ""
		}
		out = append(out, hc)
	}
	if err := mesh.MergeHelmValues(out, o.Own[ValuesOption], ValuesOption); err != nil {
		return nil, err
	}
	return out, nil
}

// PeerAuthentication is the mesh-wide mTLS mode, as Istio's security docs set it: one
// PeerAuthentication named default in the root namespace.
func PeerAuthentication(mode string) string {
	return fmt.Sprintf(`apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata:
  name: default
  namespace: %s
spec:
  mtls:
    mode: %s
`, Namespace, mode)
}

// NotCarried is the error for an option that Istio on Kubernetes does not get yet.
func NotCarried(key string) error {
	return &mesh.OptionError{Key: key, Msg: "not carried over to Istio yet"}
}
