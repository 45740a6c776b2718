package envoysidecar

import (
	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/istiohelm"
)

// IstioSidecar is the container istiod's injection adds to every enrolled pod.
const IstioSidecar = "istio-proxy"

var _ mesh.KubernetesInstaller = (*Profile)(nil)

// Kubernetes describes the Istio install this configuration stands for: Istio in
// sidecar mode as Istio's Helm documentation installs it (the base chart, then istiod,
// into istio-system), namespaces labelled istio-injection=enabled. Options that
// meshmark does not carry over to Istio yet are refused rather than dropped, so that a
// result never claims a setting the cluster did not have.
func (p *Profile) Kubernetes() (mesh.KubernetesInstall, error) {
	o, def := p.opts, mesh.DefaultOptions()
	switch {
	case len(p.exempt) > 0:
		return mesh.KubernetesInstall{}, istiohelm.NotCarried(PlaintextServicesOption)
	case o.Telemetry != def.Telemetry:
		return mesh.KubernetesInstall{}, istiohelm.NotCarried("telemetry")
	case o.RequestID != def.RequestID:
		return mesh.KubernetesInstall{}, istiohelm.NotCarried("request_id")
	case o.Retries != def.Retries:
		return mesh.KubernetesInstall{}, istiohelm.NotCarried("retries")
	case o.CircuitBreakers != def.CircuitBreakers:
		return mesh.KubernetesInstall{}, istiohelm.NotCarried("circuit_breakers")
	case o.TrustDomain != def.TrustDomain:
		return mesh.KubernetesInstall{}, istiohelm.NotCarried("trust_domain")
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
		manifests = append(manifests, istiohelm.PeerAuthentication("STRICT"))
	case mesh.MTLSOff:
		manifests = append(manifests, istiohelm.PeerAuthentication("DISABLE"))
		meshConfig["enableAutoMtls"] = false
	}
	istiod := istiohelm.Istiod
	if len(meshConfig) > 0 {
		istiod.Values = map[string]any{"meshConfig": meshConfig}
	}
	charts, err := istiohelm.Charts(o, istiohelm.Base, istiod)
	if err != nil {
		return mesh.KubernetesInstall{}, err
	}
	return mesh.KubernetesInstall{
		Charts:          charts,
		Manifests:       manifests,
		NamespaceLabels: map[string]string{"istio-injection": "enabled"},
		Sidecar:         IstioSidecar,
	}, nil
}
