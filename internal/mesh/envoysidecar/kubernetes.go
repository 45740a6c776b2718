package envoysidecar

import (
	"fmt"
	"path/filepath"
	"regexp"

	"github.com/meshmark/meshmark/internal/mesh"
)

// On Kubernetes the envoy-sidecar profile is Istio itself in sidecar mode, installed as
// Istio's Helm documentation does: the base chart (CRDs), then istiod, into
// istio-system; namespaces labelled istio-injection=enabled get the sidecar from
// istiod's injection webhook.
const (
	// IstioVersion is the Istio release installed unless istio_version says otherwise.
	IstioVersion = "1.31.1"
	// IstioRepo is Istio's Helm repository.
	IstioRepo = "https://istio-release.storage.googleapis.com/charts"
	// IstioNamespace is where istiod runs.
	IstioNamespace = "istio-system"
	// IstioSidecar is the container istiod's injection adds to every enrolled pod.
	IstioSidecar = "istio-proxy"

	IstioVersionOption = "istio_version"
	IstioChartsOption  = "istio_charts"
	HelmValuesOption   = "helm_values"
)

var istioVersion = regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$`)

var _ mesh.KubernetesInstaller = (*Profile)(nil)

// Kubernetes describes the Istio install this configuration stands for. Options that
// meshmark does not yet carry over to Istio are refused rather than dropped, so that a
// result never claims a setting the cluster did not have.
func (p *Profile) Kubernetes() (mesh.KubernetesInstall, error) {
	o, def := p.opts, mesh.DefaultOptions()
	switch {
	case len(p.exempt) > 0:
		return mesh.KubernetesInstall{}, &mesh.OptionError{Key: PlaintextServicesOption, Msg: "not carried over to Istio yet"}
	case o.Telemetry != def.Telemetry:
		return mesh.KubernetesInstall{}, &mesh.OptionError{Key: "telemetry", Msg: "not carried over to Istio yet"}
	case o.RequestID != def.RequestID:
		return mesh.KubernetesInstall{}, &mesh.OptionError{Key: "request_id", Msg: "not carried over to Istio yet"}
	case o.Retries != def.Retries:
		return mesh.KubernetesInstall{}, &mesh.OptionError{Key: "retries", Msg: "not carried over to Istio yet"}
	case o.CircuitBreakers != def.CircuitBreakers:
		return mesh.KubernetesInstall{}, &mesh.OptionError{Key: "circuit_breakers", Msg: "not carried over to Istio yet"}
	case o.TrustDomain != def.TrustDomain:
		return mesh.KubernetesInstall{}, &mesh.OptionError{Key: "trust_domain", Msg: "not carried over to Istio yet"}
	}
	version := IstioVersion
	if v, ok := o.Own[IstioVersionOption]; ok {
		version = fmt.Sprint(v)
	}
	if !istioVersion.MatchString(version) {
		return mesh.KubernetesInstall{}, &mesh.OptionError{Key: IstioVersionOption, Msg: fmt.Sprintf("%q is not an Istio release like %s", version, IstioVersion)}
	}
	base := mesh.HelmChart{Release: "istio-base", Namespace: IstioNamespace, Chart: "base", Repo: IstioRepo, Version: version}
	istiod := mesh.HelmChart{Release: "istiod", Namespace: IstioNamespace, Chart: "istiod", Repo: IstioRepo, Version: version}
	if dir, ok := o.Own[IstioChartsOption].(string); ok && dir != "" {
		// The layout of an Istio release's manifests/charts, for clusters that cannot
		// reach the repository.
		base.Chart, base.Repo, base.Version = filepath.Join(dir, "base"), "", ""
		istiod.Chart, istiod.Repo, istiod.Version = filepath.Join(dir, "istio-control", "istio-discovery"), "", ""
	}
	meshConfig := map[string]any{}
	if o.Concurrency != def.Concurrency {
		meshConfig["defaultConfig"] = map[string]any{"concurrency": o.Concurrency}
	}
	if o.AccessLog {
		meshConfig["accessLogFile"] = "/dev/stdout"
	}
	var manifests []string
	switch p.mode {
	case mesh.MTLSStrict:
		manifests = append(manifests, peerAuthentication("STRICT"))
	case mesh.MTLSOff:
		manifests = append(manifests, peerAuthentication("DISABLE"))
		meshConfig["enableAutoMtls"] = false
	}
	if len(meshConfig) > 0 {
		istiod.Values = map[string]any{"meshConfig": meshConfig}
	}
	charts := []mesh.HelmChart{base, istiod}
	if err := mesh.MergeHelmValues(charts, o.Own[HelmValuesOption], HelmValuesOption); err != nil {
		return mesh.KubernetesInstall{}, err
	}
	return mesh.KubernetesInstall{
		Charts:          charts,
		Manifests:       manifests,
		NamespaceLabels: map[string]string{"istio-injection": "enabled"},
		Sidecar:         IstioSidecar,
	}, nil
}

// peerAuthentication is the mesh-wide mTLS mode, as Istio's security docs set it: one
// PeerAuthentication named default in the root namespace.
func peerAuthentication(mode string) string {
	return fmt.Sprintf(`apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata:
  name: default
  namespace: %s
spec:
  mtls:
    mode: %s
`, IstioNamespace, mode)
}
