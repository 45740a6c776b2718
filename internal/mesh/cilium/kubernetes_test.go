package cilium

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/meshkube"
)

func kubernetesInstall(t *testing.T, raw map[string]any) meshkube.KubernetesInstall {
	t.Helper()
	p, err := mesh.New(Name, raw)
	if err != nil {
		t.Fatal(err)
	}
	in, err := p.(mesh.KubernetesInstaller).Kubernetes()
	if err != nil {
		t.Fatal(err)
	}
	return in
}

func TestKubernetesInstallIsCiliumsChart(t *testing.T) {
	in := kubernetesInstall(t, nil)
	if len(in.Charts) != 1 {
		t.Fatalf("charts %+v: want cilium's one", in.Charts)
	}
	ch := in.Charts[0]
	if ch.Release != "cilium" || ch.Namespace != "kube-system" || ch.Chart != "cilium" || ch.Repo != "https://helm.cilium.io" || ch.Version != "1.19.6" {
		t.Errorf("chart %+v: want cilium/cilium 1.19.6 from helm.cilium.io into kube-system", ch)
	}
	// A stock install but for the agent's metrics, with WireGuard.
	want := map[string]any{
		"prometheus": map[string]any{"enabled": true},
		"encryption": map[string]any{"enabled": true, "type": "wireguard"},
	}
	if !reflect.DeepEqual(ch.Values, want) {
		t.Errorf("values %v, want %v", ch.Values, want)
	}
	if len(in.Manifests) != 0 || in.Sidecar != "" || len(in.EnrolledAnnotations) != 0 || len(in.NamespaceLabels) != 0 ||
		len(in.NamespaceAnnotations) != 0 || len(in.PodAnnotations) != 0 {
		t.Errorf("Cilium enrolls no pod by a label, an annotation or a sidecar: %+v", in)
	}
	agent := meshkube.NodeAgent{Component: "cilium-agent", Namespace: "kube-system", Labels: map[string]string{"k8s-app": "cilium"}}
	if !reflect.DeepEqual(in.NodeAgents, []meshkube.NodeAgent{agent}) {
		t.Errorf("node agents %+v, want the cilium DaemonSet's pods", in.NodeAgents)
	}
	if !in.ClusterNetwork || in.OwnPodLabels["app.kubernetes.io/part-of"] != "cilium" {
		t.Errorf("cluster network %v, own pod labels %v", in.ClusterNetwork, in.OwnPodLabels)
	}

	// Every known pod network's DaemonSet refuses the cluster, in any namespace; nothing
	// else is required of it.
	refused := map[string]string{}
	for _, r := range in.Requires {
		if r.Kind != "DaemonSet" || !r.Absent || r.Namespace != "" {
			t.Errorf("requirement %+v: want the absence of a DaemonSet, in any namespace", r)
		}
		refused[r.Name] = r.Why
	}
	for _, ds := range []string{"kindnet", "calico-node", "kube-flannel-ds", "aws-node", "weave-net", "cilium"} {
		if why := refused[ds]; !strings.Contains(why, "networking.disableDefaultCNI: true") || !strings.Contains(why, "breaks both") {
			t.Errorf("DaemonSet %s: refusal %q, want why and the kind setting that avoids it", ds, why)
		}
	}

	if len(in.Proxies) != 2 {
		t.Fatalf("proxies %+v: want the agent's and cilium-envoy's metrics", in.Proxies)
	}
	for i, want := range []struct {
		component, app string
		port           int
	}{{"cilium-agent", "cilium", 9962}, {"cilium-envoy", "cilium-envoy", 9964}} {
		ep := in.Proxies[i]
		if ep.Component != want.component || ep.Namespace != "kube-system" || ep.Labels["k8s-app"] != want.app || ep.Container != "" ||
			ep.Port != want.port || ep.Path != "/metrics" || ep.Read == nil {
			t.Errorf("proxy %d: %+v, want %s's per node at :%d/metrics", i, ep, want.component, want.port)
		}
	}
}

func TestOptionsBecomeCiliumsValues(t *testing.T) {
	// A plain Cilium: the CNI with its mesh features off, the baseline of a Cilium study.
	in := kubernetesInstall(t, map[string]any{"encryption": "none", "l7": false})
	if want := map[string]any{"prometheus": map[string]any{"enabled": true}, "l7Proxy": false}; !reflect.DeepEqual(in.Charts[0].Values, want) {
		t.Errorf("plain Cilium's values %v, want %v", in.Charts[0].Values, want)
	}
	if len(in.Proxies) != 1 || in.Proxies[0].Component != "cilium-agent" {
		t.Errorf("without the L7 proxy, proxies %+v: want the agent's alone (no cilium-envoy runs)", in.Proxies)
	}

	// IPsec reads the key Secret the user makes: the cluster must have it.
	in = kubernetesInstall(t, map[string]any{"encryption": "ipsec"})
	if enc := in.Charts[0].Values["encryption"]; !reflect.DeepEqual(enc, map[string]any{"enabled": true, "type": "ipsec"}) {
		t.Errorf("ipsec: encryption values %v", enc)
	}
	var secret *meshkube.ClusterRequirement
	for i, r := range in.Requires {
		if r.Kind == "Secret" {
			secret = &in.Requires[i]
		}
	}
	if secret == nil || secret.Absent || secret.Namespace != "kube-system" || secret.Name != "cilium-ipsec-keys" || !strings.Contains(secret.Why, "kubectl create -n kube-system secret generic cilium-ipsec-keys") {
		t.Errorf("ipsec: requirement %+v, want the key Secret, with how to make it", secret)
	}

	// SPIRE mutual authentication, which Cilium's chart refuses without
	// authentication.enabled, and the policy that requires it of meshmark's pods.
	in = kubernetesInstall(t, map[string]any{"mutual_auth": "spire"})
	wantAuth := map[string]any{"enabled": true, "mutual": map[string]any{"spire": map[string]any{"enabled": true, "install": map[string]any{"enabled": true}}}}
	if auth := in.Charts[0].Values["authentication"]; !reflect.DeepEqual(auth, wantAuth) {
		t.Errorf("mutual_auth: values %v, want %v", auth, wantAuth)
	}
	if len(in.Manifests) != 1 || !strings.Contains(in.Manifests[0], "kind: CiliumClusterwideNetworkPolicy") || !strings.Contains(in.Manifests[0], "mode: required") ||
		!strings.Contains(in.Manifests[0], "app.kubernetes.io/managed-by: meshmark") {
		t.Errorf("mutual_auth: manifests %q, want a cluster-wide policy requiring authentication between meshmark's pods", in.Manifests)
	}

	// The study's values go over meshmark's, key by key.
	in = kubernetesInstall(t, map[string]any{"cilium_version": "1.20.0", "helm_values": map[string]any{"cilium": map[string]any{
		"ipam": map[string]any{"mode": "kubernetes"}, "encryption": map[string]any{"nodeEncryption": true}}}})
	ch := in.Charts[0]
	want := map[string]any{
		"prometheus": map[string]any{"enabled": true},
		"encryption": map[string]any{"enabled": true, "type": "wireguard", "nodeEncryption": true},
		"ipam":       map[string]any{"mode": "kubernetes"},
	}
	if ch.Version != "1.20.0" || ch.Repo != Repo || !reflect.DeepEqual(ch.Values, want) {
		t.Errorf("version %s from %s, values %v; want 1.20.0 from %s, values %v", ch.Version, ch.Repo, ch.Values, Repo, want)
	}
	in = kubernetesInstall(t, map[string]any{"cilium_chart": "/charts/cilium"})
	if ch := in.Charts[0]; ch.Chart != "/charts/cilium" || ch.Repo != "" || ch.Version != "" {
		t.Errorf("a local chart: %+v", ch)
	}
}

func TestBadOptionsAreRefusedNamingTheOption(t *testing.T) {
	for _, tc := range []struct {
		raw       map[string]any
		key, want string
	}{
		{map[string]any{"mtls": "strict"}, "mtls", "not supported by cilium: Cilium has no mTLS between pods"},
		{map[string]any{"concurrency": 4}, "concurrency", "not supported by cilium"},
		{map[string]any{"encryption": "tls"}, "encryption", `"tls" is not one of wireguard, ipsec, none`},
		{map[string]any{"l7": "sometimes"}, "l7", "not on/off"},
		{map[string]any{"mutual_auth": "tls"}, "mutual_auth", `"tls" is not one of off, spire`},
		{map[string]any{"cilium_version": "v1.19"}, "cilium_version", `"v1.19" is not a Cilium release like 1.19.6`},
		{map[string]any{"cilium_chart": ""}, "cilium_chart", "want the directory of a copy of the cilium chart"},
		{map[string]any{"helm_values": map[string]any{"cilum": map[string]any{}}}, "helm_values.cilum", "no such release (releases: cilium)"},
		{map[string]any{"waypoint": true}, "waypoint", "unknown option for cilium"},
	} {
		_, err := mesh.New(Name, tc.raw)
		var oe *mesh.OptionError
		if !errors.As(err, &oe) || oe.Key != tc.key || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("options %v: %v; want an error on %s saying %q", tc.raw, err, tc.key, tc.want)
		}
	}
}

// The registry says the profile runs on Kubernetes only, which the study validator and
// the preflight read; the local substrate's calls are refused all the same.
func TestLocalSubstrateIsRefused(t *testing.T) {
	reg, ok := mesh.Lookup(Name)
	if !ok || !strings.Contains(reg.KubernetesOnly, "eBPF") {
		t.Fatalf("registration %+v: want why cilium runs on Kubernetes only", reg)
	}
	p, err := mesh.New(Name, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Install(context.Background(), nil, nil); err == nil || !strings.Contains(err.Error(), "runs on spec.substrate.kubernetes only") {
		t.Errorf("local install: %v", err)
	}
	if _, err := p.Check(context.Background(), nil, nil); err == nil {
		t.Error("local check did not refuse")
	}
}

// What a cilium agent serves at :9962/metrics, cut to a few series and written after
// the metric names, labels and types in Cilium's metrics reference
// (Documentation/observability/metrics.rst) and its registry (pkg/metrics), since no
// Cilium runs here: cilium_version is a gauge labelled version, revision and arch;
// cilium_policy_l7_total counts what the L7 proxy received and forwarded per rule and
// proxy type. %d is a count the test moves.
const agentMetrics = `# HELP cilium_version Cilium version
# TYPE cilium_version gauge
cilium_version{arch="linux/amd64",revision="9a89824332",version="1.19.6"} 1
# HELP cilium_forward_count_total Total forwarded packets, tagged by ingress/egress direction
# TYPE cilium_forward_count_total counter
cilium_forward_count_total{direction="EGRESS"} %[1]d
cilium_forward_count_total{direction="INGRESS"} 5120
# HELP cilium_forward_bytes_total Total forwarded bytes, tagged by ingress/egress direction
# TYPE cilium_forward_bytes_total counter
cilium_forward_bytes_total{direction="INGRESS"} 1.048576e+06
# HELP cilium_drop_count_total Total dropped packets, tagged by drop reason and ingress/egress direction
# TYPE cilium_drop_count_total counter
cilium_drop_count_total{direction="INGRESS",reason="Policy denied"} 3
# HELP cilium_policy_l7_total Number of total proxy requests handled
# TYPE cilium_policy_l7_total counter
cilium_policy_l7_total{proxy_type="http",rule="forwarded"} 0
cilium_policy_l7_total{proxy_type="http",rule="received"} 0
# HELP cilium_endpoint_state Count of all endpoints, tagged by different endpoint states
# TYPE cilium_endpoint_state gauge
cilium_endpoint_state{endpoint_state="ready"} 7
# HELP cilium_endpoint_regeneration_time_stats_seconds Endpoint regeneration time stats labeled by the scope
# TYPE cilium_endpoint_regeneration_time_stats_seconds histogram
cilium_endpoint_regeneration_time_stats_seconds_bucket{scope="total",le="0.005"} 1
cilium_endpoint_regeneration_time_stats_seconds_bucket{scope="total",le="+Inf"} 4
cilium_endpoint_regeneration_time_stats_seconds_sum{scope="total"} 0.02
cilium_endpoint_regeneration_time_stats_seconds_count{scope="total"} 4
`

// What cilium-envoy serves at :9964/metrics: Envoy's /stats/prometheus, which the
// chart's metrics listener rewrites /metrics to, in Envoy's Prometheus format (an
// empty label set written {}).
const envoyMetrics = `# TYPE envoy_http_downstream_rq_total counter
envoy_http_downstream_rq_total{envoy_http_conn_manager_prefix="envoy-prometheus-metrics-listener"} %[1]d
# TYPE envoy_listener_downstream_cx_total counter
envoy_listener_downstream_cx_total{envoy_listener_address="0.0.0.0_9964"} 12
# TYPE envoy_server_live gauge
envoy_server_live{} 1
# TYPE envoy_server_memory_allocated gauge
envoy_server_memory_allocated{} 5400000
`

func TestAgentAndEnvoyMetricsAreRead(t *testing.T) {
	of := meshkube.ProxyScrape{Namespace: "meshmark-run-cilium", Services: []string{"front", "back"}}
	agent, err := ReadAgentMetrics(strings.NewReader(fmt.Sprintf(agentMetrics, 4711)), of)
	if err != nil {
		t.Fatal(err)
	}
	if agent.Version != "1.19.6" || agent.Inbound != nil || agent.Unit != "" {
		t.Errorf("agent: version %q, inbound %v (unit %q); want 1.19.6 and no per-service count", agent.Version, agent.Inbound, agent.Unit)
	}
	for key, want := range map[string]uint64{
		"cilium_forward_count_total{direction=EGRESS}":                    4711,
		"cilium_forward_count_total{direction=INGRESS}":                   5120,
		"cilium_forward_bytes_total{direction=INGRESS}":                   1 << 20,
		"cilium_drop_count_total{direction=INGRESS,reason=Policy denied}": 3,
	} {
		if got := agent.Counters[key]; got != want {
			t.Errorf("agent counter %s = %d, want %d (counters %v)", key, got, want, agent.Counters)
		}
	}
	if agent.Gauges["cilium_endpoint_state{endpoint_state=ready}"] != 7 ||
		agent.Gauges["cilium_version{arch=linux/amd64,revision=9a89824332,version=1.19.6}"] != 1 {
		t.Errorf("agent gauges %v", agent.Gauges)
	}
	for key := range agent.Counters {
		if strings.HasPrefix(key, "cilium_endpoint_regeneration_time_stats_seconds") || strings.HasPrefix(key, "cilium_policy_l7_total") {
			t.Errorf("agent counter %s kept: histograms are left out, and so are counters at zero", key)
		}
	}

	// Two reads a trial apart: what the agent counted over it.
	later, err := ReadAgentMetrics(strings.NewReader(fmt.Sprintf(agentMetrics, 4811)), of)
	if err != nil {
		t.Fatal(err)
	}
	agent.Component, agent.Pod, later.Component, later.Pod = AgentComponent, "node-a", AgentComponent, "node-a"
	d := mesh.DiffCounters([]meshkube.ProxyCounters{agent}, []meshkube.ProxyCounters{later})
	if len(d) != 1 || d[0].Err != "" || !reflect.DeepEqual(d[0].Counters, map[string]uint64{"cilium_forward_count_total{direction=EGRESS}": 100}) {
		t.Errorf("difference of two reads: %+v", d)
	}

	envoy, err := ReadEnvoyMetrics(strings.NewReader(fmt.Sprintf(envoyMetrics, 12)), of)
	if err != nil {
		t.Fatal(err)
	}
	if envoy.Counters["envoy_http_downstream_rq_total{envoy_http_conn_manager_prefix=envoy-prometheus-metrics-listener}"] != 12 ||
		envoy.Gauges["envoy_server_live"] != 1 || envoy.Gauges["envoy_server_memory_allocated"] != 5400000 || envoy.Inbound != nil {
		t.Errorf("cilium-envoy: counters %v, gauges %v, inbound %v", envoy.Counters, envoy.Gauges, envoy.Inbound)
	}

	if _, err := ReadAgentMetrics(strings.NewReader("cilium_version{version=\"1.19.6\" 1\n"), of); err == nil || !strings.Contains(err.Error(), "cilium agent metrics") {
		t.Errorf("garbled agent metrics: %v", err)
	}
}
