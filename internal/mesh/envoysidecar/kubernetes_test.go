package envoysidecar

import (
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/istiohelm"
	"github.com/meshmark/meshmark/internal/mesh/meshkube"
)

func kubernetesInstall(t *testing.T, raw map[string]any) (meshkube.KubernetesInstall, error) {
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
	// istio-init's NET_ADMIN is beyond Pod Security's baseline; istiod needs nothing.
	if in.NamespaceLabels[meshkube.PodSecurityEnforce] != meshkube.PodSecurityPrivileged || len(in.PrivilegedNamespaces) != 0 {
		t.Errorf("pod security: app namespace labels %v, privileged namespaces %v", in.NamespaceLabels, in.PrivilegedNamespaces)
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

// ReadIstioStats counts as arrived at the pod's service only what its sidecar reported
// as the destination (not the requests its app sent, which it reports as the source),
// keeps every counter and gauge by series, leaves histograms out, and says which line
// of a garbled answer is wrong.
func TestReadIstioStatsCountsWhatArrivesAtThePod(t *testing.T) {
	const stats = `# TYPE istio_requests_total counter
istio_requests_total{reporter="destination",destination_canonical_service="front",response_code="200"} 40
istio_requests_total{reporter="destination",destination_canonical_service="front",response_code="503"} 2
istio_requests_total{reporter="source",destination_canonical_service="back",response_code="200"} 70
# TYPE envoy_server_live gauge
envoy_server_live{} 1
# TYPE istio_build gauge
istio_build{component="proxy",tag="1.31.1"} 1
# TYPE istio_request_duration_milliseconds histogram
istio_request_duration_milliseconds_bucket{reporter="destination",le="+Inf"} 42
istio_request_duration_milliseconds_sum{reporter="destination"} 84
istio_request_duration_milliseconds_count{reporter="destination"} 42
`
	pc, err := ReadIstioStats(strings.NewReader(stats), meshkube.ProxyScrape{Service: "front"})
	if err != nil {
		t.Fatal(err)
	}
	if len(pc.Inbound) != 1 || pc.Inbound["front"] != 42 || pc.Unit != meshkube.UnitRequests || pc.Version != "1.31.1" {
		t.Errorf("inbound %v %s, version %q; want front: 42 requests (both codes, not back's 70), 1.31.1", pc.Inbound, pc.Unit, pc.Version)
	}
	if pc.Counters["istio_requests_total{destination_canonical_service=back,reporter=source,response_code=200}"] != 70 || pc.Gauges["envoy_server_live"] != 1 {
		t.Errorf("counters %v, gauges %v", pc.Counters, pc.Gauges)
	}
	for k := range pc.Counters {
		if strings.HasPrefix(k, "istio_request_duration") {
			t.Errorf("histogram kept as a counter: %s", k)
		}
	}
	// A load generator's sidecar belongs to no service: nothing arrives for one.
	if pc, err := ReadIstioStats(strings.NewReader(stats), meshkube.ProxyScrape{}); err != nil || pc.Inbound != nil {
		t.Errorf("no service: inbound %v, %v", pc.Inbound, err)
	}
	if _, err := ReadIstioStats(strings.NewReader("envoy_server_live 1\nistio_requests_total{reporter=destination} x\n"), meshkube.ProxyScrape{Service: "front"}); err == nil ||
		!strings.Contains(err.Error(), "istio-proxy stats") || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("garbled stats: %v; want an error naming istio-proxy's stats and line 2", err)
	}
}

// ReadIstioStats splits what arrived at the pod by the wire: with Istio's telemetry, by
// the destination's connection_security_policy, in requests; on upstream Envoy, by the
// inbound listener's TLS handshakes against its connections, labelled as istio-proxy
// labels them (seen on a local cluster). Another listener's figures (the stats port's,
// say) are not the app's.
func TestReadIstioStatsSaysWhatCameOverMTLS(t *testing.T) {
	const telemetry = `istio_requests_total{reporter="destination",connection_security_policy="mutual_tls",response_code="200"} 40
istio_requests_total{reporter="destination",connection_security_policy="none",response_code="200"} 3
istio_requests_total{reporter="source",connection_security_policy="unknown",response_code="200"} 70
`
	pc, err := ReadIstioStats(strings.NewReader(telemetry), meshkube.ProxyScrape{Service: "front"})
	if err != nil {
		t.Fatal(err)
	}
	if pc.WireUnit != meshkube.UnitRequests || pc.InboundMTLS["front"] != 40 || pc.InboundPlaintext["front"] != 3 || pc.Inbound["front"] != 43 {
		t.Errorf("telemetry: %s, mTLS %v, plaintext %v, inbound %v; want requests, 40 over mTLS and 3 in plaintext of 43", pc.WireUnit, pc.InboundMTLS, pc.InboundPlaintext, pc.Inbound)
	}
	const upstream = `envoy_cluster_upstream_rq_total{cluster_name="inbound|9080||"} 120
envoy_listener_downstream_cx_total{listener_address="0.0.0.0_15006"} 9
envoy_listener_ssl_handshake{listener_address="0.0.0.0_15006"} 7
envoy_listener_downstream_cx_total{listener_address="0.0.0.0_15090"} 30
`
	pc, err = ReadIstioStats(strings.NewReader(upstream), meshkube.ProxyScrape{Service: "front"})
	if err != nil {
		t.Fatal(err)
	}
	if pc.Unit != meshkube.UnitRequests || pc.Inbound["front"] != 120 || pc.WireUnit != meshkube.UnitConnections || pc.InboundMTLS["front"] != 7 || pc.InboundPlaintext["front"] != 2 {
		t.Errorf("upstream Envoy: inbound %v %s, wire %s: mTLS %v, plaintext %v; want 120 requests, and of 9 connections 7 over mTLS, 2 not",
			pc.Inbound, pc.Unit, pc.WireUnit, pc.InboundMTLS, pc.InboundPlaintext)
	}
	// Neither: the wire is not told.
	pc, err = ReadIstioStats(strings.NewReader(`envoy_cluster_upstream_rq_total{cluster_name="inbound|9080||"} 120`+"\n"), meshkube.ProxyScrape{Service: "front"})
	if err != nil || pc.WireUnit != "" || pc.InboundMTLS != nil {
		t.Errorf("no listener stats: wire %q %v, %v; want none", pc.WireUnit, pc.InboundMTLS, err)
	}
}
