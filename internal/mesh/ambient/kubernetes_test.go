package ambient

import (
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	"sigs.k8s.io/yaml"
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
	// istio-cni's and ztunnel's host paths and capabilities are beyond Pod Security's
	// baseline; the app's pods need nothing.
	if len(in.PrivilegedNamespaces) != 1 || in.PrivilegedNamespaces[0] != "istio-system" || in.NamespaceLabels[meshkube.PodSecurityEnforce] != "" {
		t.Errorf("pod security: privileged namespaces %v, app namespace labels %v", in.PrivilegedNamespaces, in.NamespaceLabels)
	}
}

// TestKubernetesInstallWithWaypoint: the waypoint as Istio's documentation adds it. The
// Gateway API's CRDs come after base, from meshmark's copy of the release Istio is built
// against; the app's namespace gets the Gateway (class istio-waypoint, HBONE on 15008,
// for services) and the label that sends its services' traffic through it; and the
// waypoint's pods are read for what they carried, under the local profile's name.
func TestKubernetesInstallWithWaypoint(t *testing.T) {
	p, err := mesh.New(Name, map[string]any{"waypoint": true, "mtls": "strict"})
	if err != nil {
		t.Fatal(err)
	}
	in, err := p.(mesh.KubernetesInstaller).Kubernetes()
	if err != nil {
		t.Fatal(err)
	}
	var releases []string
	for _, ch := range in.Charts {
		releases = append(releases, ch.Release)
	}
	if strings.Join(releases, " ") != "istio-base gateway-api-crds istiod istio-cni ztunnel" {
		t.Errorf("charts %v: want the Gateway API's CRDs after base, as Istio's Helm install has them", releases)
	}
	crds := in.Charts[1]
	if crds.Namespace != "istio-system" || crds.Repo != "" || crds.Version != "" || len(crds.Values) != 0 {
		t.Errorf("Gateway API chart %+v: want meshmark's local copy, no values", crds)
	}
	for _, f := range []string{"Chart.yaml", filepath.Join("crds", "gateway.networking.k8s.io_gateways.yaml"), filepath.Join("crds", "gateway.networking.k8s.io_gatewayclasses.yaml")} {
		if _, err := os.Stat(filepath.Join(crds.Chart, f)); err != nil {
			t.Errorf("Gateway API chart: %v", err)
		}
	}
	if in.NamespaceLabels["istio.io/dataplane-mode"] != "ambient" || in.NamespaceLabels["istio.io/use-waypoint"] != "waypoint" {
		t.Errorf("namespace labels %v", in.NamespaceLabels)
	}
	if len(in.Manifests) != 1 || !strings.Contains(in.Manifests[0], "mode: STRICT") {
		t.Errorf("manifests %v: want the strict PeerAuthentication only (the Gateway goes into the app's namespace)", in.Manifests)
	}
	if len(in.Gateways) != 1 || in.Gateways[0].Deployment != "waypoint" {
		t.Fatalf("gateways %+v", in.Gateways)
	}
	var gw struct {
		APIVersion string `json:"apiVersion"`
		Kind       string
		Metadata   struct {
			Name      string
			Namespace string
			Labels    map[string]string
		}
		Spec struct {
			GatewayClassName string `json:"gatewayClassName"`
			Listeners        []struct {
				Name     string
				Port     int
				Protocol string
			}
		}
	}
	if err := yaml.Unmarshal([]byte(in.Gateways[0].Manifest), &gw); err != nil {
		t.Fatal(err)
	}
	if gw.APIVersion != "gateway.networking.k8s.io/v1" || gw.Kind != "Gateway" || gw.Metadata.Name != "waypoint" || gw.Metadata.Namespace != "" ||
		gw.Metadata.Labels["istio.io/waypoint-for"] != "service" || gw.Spec.GatewayClassName != "istio-waypoint" ||
		len(gw.Spec.Listeners) != 1 || gw.Spec.Listeners[0].Port != 15008 || gw.Spec.Listeners[0].Protocol != "HBONE" {
		t.Errorf("waypoint Gateway %+v", gw)
	}
	if len(in.Proxies) != 2 {
		t.Fatalf("proxies %+v: want ztunnel and the waypoint", in.Proxies)
	}
	wp := in.Proxies[1]
	if wp.Component != "waypoint" || wp.AppLabels["gateway.networking.k8s.io/gateway-name"] != "waypoint" ||
		wp.Namespace != "" || wp.Container != "" || wp.Port != 15090 || wp.Path != "/stats/prometheus" {
		t.Errorf("waypoint endpoint %+v", wp)
	}
}

// The waypoint's stats as istio-proxy serves them on :15090 (Istio's standard metrics,
// the waypoint reporting as reporter="waypoint"), cut to a few series: requests into
// front (two response codes) and back of the app's namespace, and into a front of
// another namespace, which must not be counted.
const waypointStats = `# TYPE istio_requests_total counter
istio_requests_total{reporter="waypoint",source_workload="meshmark-loadgen",source_workload_namespace="app",destination_workload="front-v1",destination_workload_namespace="app",destination_service="front.app.svc.cluster.local",destination_service_name="front",destination_service_namespace="app",destination_canonical_service="front",request_protocol="http",response_code="200",response_flags="-",connection_security_policy="mutual_tls"} 120
istio_requests_total{reporter="waypoint",source_workload="meshmark-loadgen",source_workload_namespace="app",destination_workload="front-v1",destination_workload_namespace="app",destination_service="front.app.svc.cluster.local",destination_service_name="front",destination_service_namespace="app",destination_canonical_service="front",request_protocol="http",response_code="503",response_flags="UF",connection_security_policy="mutual_tls"} 3
istio_requests_total{reporter="waypoint",source_workload="front-v1",source_workload_namespace="app",destination_workload="back-v2",destination_workload_namespace="app",destination_service="back.app.svc.cluster.local",destination_service_name="back",destination_service_namespace="app",destination_canonical_service="back",request_protocol="http",response_code="200",response_flags="-",connection_security_policy="mutual_tls"} 40
istio_requests_total{reporter="waypoint",source_workload="client",source_workload_namespace="other",destination_workload="front",destination_workload_namespace="other",destination_service="front.other.svc.cluster.local",destination_service_name="front",destination_service_namespace="other",destination_canonical_service="front",request_protocol="http",response_code="200",response_flags="-",connection_security_policy="mutual_tls"} 999
# TYPE istio_build gauge
istio_build{component="proxy",tag="1.31.1"} 1
# TYPE envoy_server_live gauge
envoy_server_live{} 1
`

func TestKubeWaypointStatsCountTheAppsServices(t *testing.T) {
	pc, err := readKubeWaypoint(strings.NewReader(waypointStats), meshkube.ProxyScrape{Namespace: "app", Services: []string{"front", "back", "idle"}})
	if err != nil {
		t.Fatal(err)
	}
	if pc.Unit != meshkube.UnitRequests || pc.Version != "1.31.1" || pc.Gauges["envoy_server_live"] != 1 {
		t.Errorf("unit %q, version %q, gauges %v", pc.Unit, pc.Version, pc.Gauges)
	}
	if want := map[string]uint64{"front": 123, "back": 40, "idle": 0}; !maps.Equal(pc.Inbound, want) {
		t.Errorf("inbound %v, want %v: every request the waypoint carried into the app's services, none of another namespace's", pc.Inbound, want)
	}
	if _, err := readKubeWaypoint(strings.NewReader("istio_requests_total{reporter=\"waypoint\" 1\n"), meshkube.ProxyScrape{}); err == nil ||
		!strings.Contains(err.Error(), "waypoint stats") {
		t.Errorf("garbled stats: %v", err)
	}
}

// A waypoint of upstream Envoy (a local cluster's, see istiohelm.ForLocalCluster) has no
// istio_requests_total: its requests are Envoy's counters of its inbound-vip clusters,
// one per service it fronts, those of another namespace and its other clusters left out.
const upstreamWaypointStats = `# TYPE envoy_cluster_upstream_rq_total counter
envoy_cluster_upstream_rq_total{cluster_name="inbound-vip|80|http|front.app.svc.cluster.local"} 123
envoy_cluster_upstream_rq_total{cluster_name="inbound-vip|9090|http|back.app.svc.cluster.local"} 40
envoy_cluster_upstream_rq_total{cluster_name="inbound-vip|80|http|front.other.svc.cluster.local"} 999
envoy_cluster_upstream_rq_total{cluster_name="main_internal"} 163
envoy_cluster_upstream_rq_total{cluster_name="inbound|80||"} 7
`

func TestKubeWaypointOfUpstreamEnvoyCountsItsInboundClusters(t *testing.T) {
	pc, err := readKubeWaypoint(strings.NewReader(upstreamWaypointStats), meshkube.ProxyScrape{Namespace: "app", Services: []string{"front", "back", "idle"}})
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]uint64{"front": 123, "back": 40, "idle": 0}; !maps.Equal(pc.Inbound, want) {
		t.Errorf("inbound %v, want %v", pc.Inbound, want)
	}
	// With Istio's telemetry present, it alone counts: Envoy's clusters would count the
	// same requests again.
	pc, err = readKubeWaypoint(strings.NewReader(waypointStats+upstreamWaypointStats), meshkube.ProxyScrape{Namespace: "app", Services: []string{"front", "back"}})
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]uint64{"front": 123, "back": 40}; !maps.Equal(pc.Inbound, want) {
		t.Errorf("with telemetry: inbound %v, want %v", pc.Inbound, want)
	}
}

// A ztunnel's inbound connections on a cluster are split by the destination's
// connection_security_policy: HBONE's mTLS, or plaintext it accepted.
func TestKubeZtunnelCountersSayWhatCameOverMTLS(t *testing.T) {
	const metrics = `# TYPE istio_tcp_connections_opened counter
istio_tcp_connections_opened_total{reporter="destination",destination_canonical_service="front",destination_workload_namespace="app",connection_security_policy="mutual_tls"} 5
istio_tcp_connections_opened_total{reporter="destination",destination_canonical_service="front",destination_workload_namespace="app",connection_security_policy="unknown"} 2
istio_tcp_connections_opened_total{reporter="destination",destination_canonical_service="front",destination_workload_namespace="other",connection_security_policy="unknown"} 50
istio_tcp_connections_opened_total{reporter="source",destination_canonical_service="front",destination_workload_namespace="app",connection_security_policy="mutual_tls"} 9
# TYPE istio_tcp_received_bytes counter
istio_tcp_received_bytes_total{reporter="destination",destination_canonical_service="front",destination_workload_namespace="app",connection_security_policy="mutual_tls"} 4000
istio_tcp_received_bytes_total{reporter="destination",destination_canonical_service="front",destination_workload_namespace="app",connection_security_policy="unknown"} 96
istio_tcp_received_bytes_total{reporter="destination",destination_canonical_service="front",destination_workload_namespace="other",connection_security_policy="unknown"} 999
istio_tcp_received_bytes_total{reporter="source",destination_canonical_service="front",destination_workload_namespace="app",connection_security_policy="mutual_tls"} 777
`
	pc, err := readKubeMetrics(strings.NewReader(metrics), meshkube.ProxyScrape{Namespace: "app", Services: []string{"front", "idle"}})
	if err != nil {
		t.Fatal(err)
	}
	if pc.Inbound["front"] != 7 || pc.WireUnit != meshkube.UnitConnections || pc.InboundMTLS["front"] != 5 || pc.InboundPlaintext["front"] != 2 ||
		pc.InboundMTLS["idle"] != 0 || pc.InboundPlaintext["idle"] != 0 {
		t.Errorf("inbound %v, wire %s: mTLS %v, plaintext %v; want front's 7 connections of app, 5 over mTLS and 2 not, idle none", pc.Inbound, pc.WireUnit, pc.InboundMTLS, pc.InboundPlaintext)
	}
	// The bytes received into front, in app's pods, as the destination counted them.
	if pc.InboundBytes["front"] != 4096 || pc.InboundBytes["idle"] != 0 {
		t.Errorf("inbound bytes %v, want front's 4096 in app, idle none", pc.InboundBytes)
	}
}
