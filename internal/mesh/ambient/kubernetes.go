package ambient

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/envoysidecar"
	"github.com/meshmark/meshmark/internal/mesh/istiohelm"
	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	gatewayapicrds "github.com/meshmark/meshmark/third_party/gateway-api-crds"
)

// RedirectionAnnotation is what istio-cni's node agent writes on a pod once it has
// redirected the pod's traffic to its node's ztunnel: ambient's own word that the pod is
// in the mesh.
const RedirectionAnnotation = "ambient.istio.io/redirection"

const (
	// WaypointName names the namespace's waypoint: its Gateway, and the Deployment and
	// pods istiod makes for it, which take the Gateway's name.
	WaypointName = "waypoint"
	// WaypointComponent names the waypoint among a trial's counters, on either
	// substrate.
	WaypointComponent = "waypoint"
	// UseWaypointLabel on a namespace sends the traffic to its services through the
	// waypoint it names.
	UseWaypointLabel = "istio.io/use-waypoint"
	// GatewayNameLabel is what istiod labels a Gateway's pods with, as the Gateway API
	// asks of its implementations.
	GatewayNameLabel = "gateway.networking.k8s.io/gateway-name"
)

// waypointGateway is the namespace's waypoint as Istio's documentation deploys it
// (what `istioctl waypoint generate --for service` writes): a Gateway of class
// istio-waypoint whose HBONE listener on 15008 ztunnel sends the traffic for the
// namespace's services to. Its namespace is the app's, given when it is applied.
const waypointGateway = `apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: ` + WaypointName + `
  labels:
    istio.io/waypoint-for: service
spec:
  gatewayClassName: istio-waypoint
  listeners:
  - name: mesh
    port: 15008
    protocol: HBONE
`

var _ mesh.KubernetesInstaller = (*Profile)(nil)

// Kubernetes describes Istio in ambient mode as Istio's Helm documentation installs it:
// base, istiod and istio-cni with the ambient profile, then ztunnel, into istio-system;
// namespaces labelled istio.io/dataplane-mode=ambient. With the waypoint, as Istio's
// waypoint documentation adds it: the Gateway API's CRDs (after base, as the Helm
// install does, from meshmark's copy of the release Istio is built against, where the
// cluster lacks them), a Gateway named waypoint in the app's namespace and that
// namespace labelled istio.io/use-waypoint=waypoint. Options meshmark does not carry
// over are refused.
func (p *Profile) Kubernetes() (meshkube.KubernetesInstall, error) {
	o, def := p.opts, mesh.DefaultOptions()
	switch {
	case o.Concurrency != def.Concurrency:
		return meshkube.KubernetesInstall{}, istiohelm.NotCarried("concurrency")
	case o.TrustDomain != def.TrustDomain:
		return meshkube.KubernetesInstall{}, istiohelm.NotCarried("trust_domain")
	}
	ambient := map[string]any{"profile": "ambient"}
	istiod, cni := istiohelm.Istiod, istiohelm.CNI
	istiod.Values, cni.Values = ambient, ambient
	charts, err := istiohelm.Charts(o, istiohelm.Base, istiod, cni, istiohelm.Ztunnel)
	if err != nil {
		return meshkube.KubernetesInstall{}, err
	}
	var manifests []string
	if p.mode == mesh.MTLSStrict {
		manifests = append(manifests, istiohelm.PeerAuthentication("STRICT"))
	}
	install := meshkube.KubernetesInstall{
		Charts:          charts,
		Manifests:       manifests,
		NamespaceLabels: map[string]string{"istio.io/dataplane-mode": "ambient"},
		// istio-cni's node agent and ztunnel need host paths and capabilities beyond
		// Pod Security's baseline; Istio's docs label istio-system privileged. The app's
		// pods need nothing: istio-cni redirects them.
		PrivilegedNamespaces: []string{istiohelm.Namespace},
		EnrolledAnnotations:  map[string]string{RedirectionAnnotation: "enabled"},
		// Each node's ztunnel (the chart's DaemonSet, its pods labelled app=ztunnel)
		// serves its metrics on its pod's address.
		Proxies: []meshkube.ProxyEndpoint{{Component: Component, Namespace: istiohelm.Namespace, Labels: map[string]string{"app": "ztunnel"},
			Port: MetricsPort, Path: "/metrics", Read: readKubeMetrics}},
		ForLocalCluster: istiohelm.ForLocalCluster,
	}
	if !p.withWaypoint {
		return install, nil
	}
	dir, err := gatewayapicrds.Dir()
	if err != nil {
		return meshkube.KubernetesInstall{}, fmt.Errorf("%s: %w", Name, err)
	}
	crds := meshkube.HelmChart{Release: gatewayapicrds.Chart, Namespace: istiohelm.Namespace, Chart: dir}
	install.Charts = slices.Insert(install.Charts, 1, crds)
	install.NamespaceLabels[UseWaypointLabel] = WaypointName
	install.Gateways = []meshkube.AppGateway{{Manifest: waypointGateway, Deployment: WaypointName}}
	// The waypoint is istio-proxy's Envoy, serving its stats where a sidecar's does.
	install.Proxies = append(install.Proxies, meshkube.ProxyEndpoint{Component: WaypointComponent,
		AppLabels: map[string]string{GatewayNameLabel: WaypointName},
		Port:      envoysidecar.IstioStatsPort, Path: "/stats/prometheus", Read: readKubeWaypoint})
	return install, nil
}

// readKubeWaypoint reads the waypoint's Envoy stats on a cluster (meshkube.ProxyEndpoint):
// the requests it carried into each service of the app's namespace, which is Istio's
// istio_requests_total as a waypoint reports it (reporter="waypoint"), counted by the
// destination's canonical service and namespace as ztunnel's connections are (on a
// shared cluster another namespace may have a service of the same name); every counter
// and gauge; and its release from istio_build.
//
// A waypoint built on upstream Envoy has no Istio telemetry (istiohelm.ForLocalCluster):
// its requests are then Envoy's own counters of its inbound-vip clusters, one per
// service it fronts (inbound-vip|PORT|PROTOCOL|SERVICE.NAMESPACE.svc.DOMAIN).
func readKubeWaypoint(body io.Reader, of meshkube.ProxyScrape) (meshkube.ProxyCounters, error) {
	inbound := make(map[string]uint64, len(of.Services))
	envoyInbound := make(map[string]uint64, len(of.Services))
	for _, s := range of.Services {
		inbound[s], envoyInbound[s] = 0, 0
	}
	var version string
	telemetry := false
	pc, err := mesh.ReadPrometheusText(body, func(name string, labels map[string]string, v float64) {
		switch {
		case name == "istio_requests_total":
			telemetry = true
			if labels["reporter"] != "waypoint" || labels["destination_workload_namespace"] != of.Namespace {
				return
			}
			if n, ok := inbound[labels["destination_canonical_service"]]; ok {
				inbound[labels["destination_canonical_service"]] = n + uint64(v)
			}
		case name == "envoy_cluster_upstream_rq_total":
			if svc, ok := waypointClusterService(labels["cluster_name"], of.Namespace); ok {
				if n, known := envoyInbound[svc]; known {
					envoyInbound[svc] = n + uint64(v)
				}
			}
		case name == "istio_build" && labels["component"] == "proxy":
			version = labels["tag"]
		}
	})
	if err != nil {
		return meshkube.ProxyCounters{}, fmt.Errorf("waypoint stats: %w", err)
	}
	if !telemetry {
		inbound = envoyInbound
	}
	pc.Unit, pc.Version, pc.Inbound = meshkube.UnitRequests, version, inbound
	return pc, nil
}

// waypointClusterService is the service of namespace ns a waypoint's inbound-vip
// cluster leads to, if it is one.
func waypointClusterService(cluster, ns string) (string, bool) {
	parts := strings.Split(cluster, "|")
	if len(parts) != 4 || parts[0] != "inbound-vip" {
		return "", false
	}
	host := strings.Split(parts[3], ".")
	if len(host) < 3 || host[1] != ns || host[2] != "svc" {
		return "", false
	}
	return host[0], true
}
