package linkerd

import (
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/mesh/meshkube"
)

// sample is linkerd2-proxy 2.366 /metrics output, cut to a few series (as scraped in
// TestLinkerdMeshInNamespaces): requests to the admin port are counted inbound too. The
// route_name="probe" series is a kubelet's readiness probes, in plaintext, as scraped
// from a details pod on a real cluster (meshmark cluster up, edge-26.8.3): Linkerd's
// default policy admits them unauthenticated, on the application's port.
const sample = `# HELP request_total Total count of HTTP requests.
# TYPE request_total counter
request_total{direction="inbound",target_addr="0.0.0.0:4191",target_ip="0.0.0.0",target_port="4191",tls="no_identity",no_tls_reason="no_tls_from_remote",srv_group="",srv_kind="default",srv_name="all-unauthenticated",srv_port="4191",route_group="",route_kind="default",route_name="default",authz_group="",authz_kind="default",authz_name="all-unauthenticated"} 10
request_total{direction="inbound",target_addr="198.18.1.3:9080",target_ip="198.18.1.3",target_port="9080",tls="true",client_id="productpage.bookinfo.serviceaccount.identity.linkerd.cluster.local",srv_group="",srv_kind="default",srv_name="all-unauthenticated",srv_port="9080",route_group="",route_kind="default",route_name="default",authz_group="",authz_kind="default",authz_name="all-unauthenticated"} 108
request_total{direction="inbound",target_addr="198.18.1.3:9080",target_ip="198.18.1.3",target_port="9080",tls="no_identity",no_tls_reason="no_tls_from_remote",srv_group="",srv_kind="default",srv_name="all-unauthenticated",srv_port="9080",route_group="",route_kind="default",route_name="default",authz_group="",authz_kind="default",authz_name="all-unauthenticated"} 1
request_total{direction="inbound",target_addr="198.19.72.23:9080",target_ip="198.19.72.23",target_port="9080",tls="no_identity",no_tls_reason="no_tls_from_remote",srv_group="",srv_kind="default",srv_name="all-authenticated",srv_port="9080",route_group="",route_kind="default",route_name="probe",authz_group="",authz_kind="default",authz_name="probe"} 9
request_total{direction="outbound",authority="productpage.bookinfo.svc.cluster.local:9080",target_addr="198.18.1.5:9080",target_ip="198.18.1.5",target_port="9080",tls="true",server_id="productpage.bookinfo.serviceaccount.identity.linkerd.cluster.local",dst_namespace="bookinfo",dst_pod="productpage-v1-0",dst_service="productpage",dst_version="v1"} 4
# HELP inbound_http_authz_deny_total The total number of inbound HTTP requests that could not be processed due to a proxy error.
# TYPE inbound_http_authz_deny_total counter
inbound_http_authz_deny_total{target_addr="198.18.1.3:9080",target_ip="198.18.1.3",target_port="9080",srv_group="",srv_kind="default",srv_name="all-authenticated",srv_port="9080",tls="no_identity",no_tls_reason="no_tls_from_remote"} 2
# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 0.58
# HELP control_destination_balancer_endpoints The number of endpoints.
# TYPE control_destination_balancer_endpoints gauge
control_destination_balancer_endpoints{addr="198.18.1.1:8086",endpoint_state="ready"} 1
# HELP proxy_build_info Proxy build info
# TYPE proxy_build_info gauge
proxy_build_info{version="2.366.0-meshmark.7.g29637b64f",git_sha="",profile="release",vendor="meshmark-build"} 1
`

func TestTrafficCountsApplicationRequestsOnly(t *testing.T) {
	ms, err := ParseMetrics(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	got := TrafficOf(ms)
	want := Traffic{InboundMTLS: 108, InboundPlaintext: 1, Outbound: 4, OutboundMTLS: 4, Denied: 2}
	if got != want {
		t.Errorf("traffic %+v, want %+v (the 10 admin requests and the 9 kubelet probes are not application traffic)", got, want)
	}
	if v := proxyVersion(ms); v != "2.366.0-meshmark.7.g29637b64f" {
		t.Errorf("version %q", v)
	}
	counters, gauges := flatten(ms)
	if counters["process_cpu_microseconds_total"] != 580000 {
		t.Errorf("cpu %d µs, want 580000", counters["process_cpu_microseconds_total"])
	}
	if gauges["control_destination_balancer_endpoints{addr=198.18.1.1:8086,endpoint_state=ready}"] != 1 {
		t.Errorf("gauges %v", gauges)
	}
	if d := (Traffic{InboundMTLS: 3}).Sub(Traffic{InboundMTLS: 5}); d.InboundMTLS != 3 {
		t.Errorf("a restarted proxy's reading should stand alone, got %+v", d)
	}
}

func TestParseMetricsNamesTheBadLine(t *testing.T) {
	_, err := ParseMetrics(strings.NewReader("request_total{direction=\"inbound\"} 1\nrequest_total{direction=inbound} x\n"))
	if err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("got %v, want an error naming line 2", err)
	}
}

// On a cluster the proxy's inbound requests are split by their tls label: what came
// over the mesh's mTLS and what did not, admin requests left out as before, and the
// kubelet's probes too: strict mTLS admits them in plaintext by design, and a proxy
// that counted only probes has carried none of the burst.
func TestKubeCountersSayWhatCameOverMTLS(t *testing.T) {
	pc, err := readKubeMetrics(strings.NewReader(sample), meshkube.ProxyScrape{Service: "reviews"})
	if err != nil {
		t.Fatal(err)
	}
	if pc.Inbound["reviews"] != 109 || pc.WireUnit != meshkube.UnitRequests || pc.InboundMTLS["reviews"] != 108 || pc.InboundPlaintext["reviews"] != 1 {
		t.Errorf("inbound %v, wire %s: mTLS %v, plaintext %v; want 109 requests, 108 over mTLS, 1 not", pc.Inbound, pc.WireUnit, pc.InboundMTLS, pc.InboundPlaintext)
	}
}
