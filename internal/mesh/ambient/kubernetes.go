package ambient

import (
	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/istiohelm"
)

// RedirectionAnnotation is what istio-cni's node agent writes on a pod once it has
// redirected the pod's traffic to its node's ztunnel: ambient's own word that the pod is
// in the mesh.
const RedirectionAnnotation = "ambient.istio.io/redirection"

var _ mesh.KubernetesInstaller = (*Profile)(nil)

// Kubernetes describes Istio in ambient mode as Istio's Helm documentation installs it:
// base, istiod and istio-cni with the ambient profile, then ztunnel, into istio-system;
// namespaces labelled istio.io/dataplane-mode=ambient. The waypoint is not installed on
// Kubernetes yet, and options meshmark does not carry over are refused.
func (p *Profile) Kubernetes() (mesh.KubernetesInstall, error) {
	o, def := p.opts, mesh.DefaultOptions()
	switch {
	case p.withWaypoint:
		return mesh.KubernetesInstall{}, istiohelm.NotCarried("waypoint")
	case o.Concurrency != def.Concurrency:
		return mesh.KubernetesInstall{}, istiohelm.NotCarried("concurrency")
	case o.TrustDomain != def.TrustDomain:
		return mesh.KubernetesInstall{}, istiohelm.NotCarried("trust_domain")
	}
	ambient := map[string]any{"profile": "ambient"}
	istiod, cni := istiohelm.Istiod, istiohelm.CNI
	istiod.Values, cni.Values = ambient, ambient
	charts, err := istiohelm.Charts(o, istiohelm.Base, istiod, cni, istiohelm.Ztunnel)
	if err != nil {
		return mesh.KubernetesInstall{}, err
	}
	var manifests []string
	if p.mode == mesh.MTLSStrict {
		manifests = append(manifests, istiohelm.PeerAuthentication("STRICT"))
	}
	return mesh.KubernetesInstall{
		Charts:              charts,
		Manifests:           manifests,
		NamespaceLabels:     map[string]string{"istio.io/dataplane-mode": "ambient"},
		EnrolledAnnotations: map[string]string{RedirectionAnnotation: "enabled"},
		// Each node's ztunnel (the chart's DaemonSet, its pods labelled app=ztunnel)
		// serves its metrics on its pod's address.
		Proxies: []mesh.ProxyEndpoint{{Component: Component, Namespace: istiohelm.Namespace, Labels: map[string]string{"app": "ztunnel"},
			Port: MetricsPort, Path: "/metrics", Read: readKubeMetrics}},
	}, nil
}
