package kube

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/ambient"
	"github.com/meshmark/meshmark/internal/mesh/envoysidecar"
	"github.com/meshmark/meshmark/internal/mesh/linkerd"
	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	"github.com/meshmark/meshmark/internal/workload"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// What each mesh's proxy serves at its metrics endpoint, in its own format, cut to a
// few series; %[1]d is the count the stand-in is at, %[2]s the app's namespace. Each
// also counts something that is not the pod's inbound application traffic, which must
// not be taken for it: the sidecar's outbound requests, Linkerd's scrapes of its admin
// port, ztunnel's connections into a service of the same name in another namespace.
const (
	// istio-proxy's Envoy at :15090/stats/prometheus: Istio's standard metrics (tag
	// extracted from "reporter=..." stats), Envoy's own as Istio's stats matcher keeps
	// them (an empty label set written as {}), and a histogram.
	istioStats = `# TYPE envoy_cluster_upstream_cx_total counter
envoy_cluster_upstream_cx_total{cluster_name="xds-grpc"} 1
# TYPE istio_requests_total counter
istio_requests_total{reporter="destination",source_workload="meshmark-loadgen",source_canonical_service="meshmark-loadgen",source_workload_namespace="%[2]s",destination_workload="front-v1",destination_workload_namespace="%[2]s",destination_service="front.%[2]s.svc.cluster.local",destination_canonical_service="front",request_protocol="http",response_code="200",response_flags="-",connection_security_policy="mutual_tls"} %[1]d
istio_requests_total{reporter="source",source_workload="front-v1",source_canonical_service="front",source_workload_namespace="%[2]s",destination_workload="back-v1",destination_workload_namespace="%[2]s",destination_service="back.%[2]s.svc.cluster.local",destination_canonical_service="back",request_protocol="http",response_code="200",response_flags="-",connection_security_policy="mutual_tls"} %[1]d
# TYPE envoy_server_live gauge
envoy_server_live{} 1
# TYPE istio_build gauge
istio_build{component="proxy",tag="1.31.1"} 1
# TYPE istio_request_duration_milliseconds histogram
istio_request_duration_milliseconds_bucket{reporter="destination",le="1"} %[1]d
istio_request_duration_milliseconds_bucket{reporter="destination",le="+Inf"} %[1]d
istio_request_duration_milliseconds_sum{reporter="destination"} %[1]d
istio_request_duration_milliseconds_count{reporter="destination"} %[1]d
`
	// linkerd-proxy at :4191/metrics, as linkerd2-proxy 2.366 writes it.
	linkerdMetrics = `# HELP request_total Total count of HTTP requests.
# TYPE request_total counter
request_total{direction="inbound",target_addr="0.0.0.0:4191",target_ip="0.0.0.0",target_port="4191",tls="no_identity",no_tls_reason="no_tls_from_remote",srv_group="",srv_kind="default",srv_name="all-unauthenticated",srv_port="4191",route_group="",route_kind="default",route_name="default",authz_group="",authz_kind="default",authz_name="all-unauthenticated"} %[1]d
request_total{direction="inbound",target_addr="198.19.0.9:9080",target_ip="198.19.0.9",target_port="9080",tls="true",client_id="default.%[2]s.serviceaccount.identity.linkerd.cluster.local",srv_group="",srv_kind="default",srv_name="all-unauthenticated",srv_port="9080",route_group="",route_kind="default",route_name="default",authz_group="",authz_kind="default",authz_name="all-unauthenticated"} %[1]d
# HELP proxy_build_info Proxy build info
# TYPE proxy_build_info gauge
proxy_build_info{version="2.366.0",git_sha="",profile="release",vendor="linkerd"} 1
`
	// ztunnel at :15020/metrics: OpenMetrics-style, the TYPE line without the _total
	// its samples carry.
	ztunnelMetrics = `# HELP istio_tcp_connections_opened The total number of TCP connections opened.
# TYPE istio_tcp_connections_opened counter
istio_tcp_connections_opened_total{reporter="destination",source_workload="meshmark-loadgen",source_workload_namespace="%[2]s",destination_service="front.%[2]s.svc.cluster.local",destination_workload="front-v1",destination_canonical_service="front",destination_workload_namespace="%[2]s",request_protocol="tcp",response_flags="-",connection_security_policy="mutual_tls"} %[1]d
istio_tcp_connections_opened_total{reporter="destination",source_workload="client",source_workload_namespace="other",destination_service="front.other.svc.cluster.local",destination_workload="front",destination_canonical_service="front",destination_workload_namespace="other",request_protocol="tcp",response_flags="-",connection_security_policy="mutual_tls"} %[1]d
istio_tcp_connections_opened_total{reporter="source",source_workload="meshmark-loadgen",source_workload_namespace="%[2]s",destination_service="front.%[2]s.svc.cluster.local",destination_workload="front-v1",destination_canonical_service="front",destination_workload_namespace="%[2]s",request_protocol="tcp",response_flags="-",connection_security_policy="mutual_tls"} %[1]d
# HELP istio_build Istio component build info.
# TYPE istio_build gauge
istio_build{component="ztunnel",tag="1.31.1"} 1
# EOF
`
)

// standInProxy serves a proxy's metrics text at its count, which the test moves: kwok
// runs no container, so a server of the test stands in for the proxy behind its pod's
// address (kubetest.ReachPodPort).
type standInProxy struct {
	format, namespace string
	count             atomic.Int64
	srv               *httptest.Server
	paths             atomic.Value // the last path it was asked for
}

func newStandInProxy(t *testing.T, format, namespace string, start int64) *standInProxy {
	s := &standInProxy{format: format, namespace: namespace}
	s.count.Store(start)
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.paths.Store(r.URL.Path)
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprintf(w, s.format, s.count.Load(), s.namespace)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

// TestProxyCountersThroughThePodProxy reads every mesh's proxies on the cluster through
// the API server's pod proxy, with the endpoints the profiles give for Kubernetes:
// istio-proxy's Envoy (sidecar), linkerd-proxy (sidecar) and ztunnel (a DaemonSet, one
// per node). Stand-ins serve each proxy's real format at the pod's address; between two
// reads they count on, and the difference of the two reads must be exactly what they
// counted into each service, nothing else. A sidecar and a ztunnel that nothing serves
// are returned with the pod and the path that failed, not dropped; pods without a
// sidecar, and the ztunnel of a node without the app, are not read at all.
func TestProxyCountersThroughThePodProxy(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	onNode := func(i int) map[string]string { return map[string]string{"meshmark.dev/test-node": fmt.Sprint(i)} }
	c := connect(t, Config{AppNodeSelector: onNode(0), LoadgenNodeSelector: onNode(0)})
	client := c.Client()

	g, err := workload.Parse("graph.yaml", []byte("name: px\nservices:\n  - name: front\n    isEntrypoint: true\n    script: [call: back]\n  - name: back\n"))
	if err != nil {
		t.Fatal(err)
	}
	const run = "9c0a7e"
	app, err := c.Deploy(ctx, AppSpec{Run: run, Mesh: "mesh", Deployments: g.Deployments(), Generators: 1,
		Args: func(d workload.Deployment) []string { return g.ServiceArgs(d, PodNameArg) }})
	meshNS := "mmpx-istio-system"
	t.Cleanup(func() {
		_ = c.deleteNamespaces(context.Background(), []string{c.NamespaceFor(run, "mesh"), meshNS}, nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: meshNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The endpoints each profile describes for its install on Kubernetes; ztunnel's
	// namespace is the test's, so that no other test's istio-system is disturbed.
	endpoint := func(profile string) meshkube.ProxyEndpoint {
		p, err := mesh.New(profile, nil)
		if err != nil {
			t.Fatal(err)
		}
		in, err := p.(mesh.KubernetesInstaller).Kubernetes()
		if err != nil {
			t.Fatal(err)
		}
		if len(in.Proxies) != 1 {
			t.Fatalf("%s: %d proxy endpoints, want 1", profile, len(in.Proxies))
		}
		return in.Proxies[0]
	}
	istio, l5d, zt := endpoint(envoysidecar.Name), endpoint(linkerd.Name), endpoint(ambient.Name)
	if istio.Port != 15090 || istio.Path != "/stats/prometheus" || l5d.Port != 4191 || l5d.Path != "/metrics" ||
		zt.Port != 15020 || zt.Path != "/metrics" || zt.Namespace != "istio-system" || zt.Labels["app"] != "ztunnel" {
		t.Fatalf("endpoints: istio %d %s, linkerd %d %s, ztunnel %s/%v %d %s", istio.Port, istio.Path, l5d.Port, l5d.Path, zt.Namespace, zt.Labels, zt.Port, zt.Path)
	}
	zt.Namespace = meshNS

	// Pods as the meshes' injectors leave them, beside the app's own (which carry no
	// sidecar here and must not be read): front with istio-proxy on node 0, back with
	// linkerd-proxy on node 0, back with istio-proxy on node 1, whose endpoint nothing
	// serves. ztunnel runs on every node.
	deployment := func(name, service, node string, containers ...string) {
		labels := map[string]string{ManagedByLabel: ManagedBy, "app": service, "test-pod": name}
		spec := corev1.PodSpec{NodeSelector: onNode(0)}
		if node != "" {
			spec.NodeSelector = map[string]string{"kubernetes.io/hostname": node}
		}
		for _, cn := range containers {
			spec.Containers = append(spec.Containers, corev1.Container{Name: cn, Image: "registry.example/" + cn})
		}
		// Labelled as meshmark's own, so that the app's teardown takes it first.
		d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"test-pod": name}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: spec}}}
		if _, err := client.AppsV1().Deployments(app.Namespace).Create(ctx, d, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	deployment("istio-front", "front", cluster.Nodes[0], "app", "istio-proxy")
	deployment("linkerd-back", "back", cluster.Nodes[0], "app", "linkerd-proxy")
	deployment("istio-silent", "back", cluster.Nodes[1], "app", "istio-proxy")
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "ztunnel"}, Spec: appsv1.DaemonSetSpec{
		Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "ztunnel"}},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "ztunnel"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "istio-proxy", Image: "registry.example/ztunnel"}}}}}}
	if _, err := client.AppsV1().DaemonSets(meshNS).Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The app's 2 pods and its generator, the 3 above; a ztunnel per node.
	running := waitRunning(t, map[string]int{app.Namespace: 3 + 3, meshNS: len(cluster.Nodes)})

	standIns := map[string]*standInProxy{}
	serve := func(key string, p corev1.Pod, port int, format string, start int64) {
		s := newStandInProxy(t, format, app.Namespace, start)
		if err := cluster.ReachPodPort(p.Status.PodIP, port, s.srv.Listener.Addr().String()); err != nil {
			t.Fatal(err)
		}
		standIns[key] = s
	}
	var silentPod, node1Ztunnel string
	for _, p := range running {
		switch {
		case p.Labels["test-pod"] == "istio-front":
			serve("envoy/"+p.Name, p, istio.Port, istioStats, 1000)
		case p.Labels["test-pod"] == "linkerd-back":
			serve("linkerd2-proxy/"+p.Name, p, l5d.Port, linkerdMetrics, 50)
		case p.Labels["test-pod"] == "istio-silent":
			silentPod = p.Name
		case p.Namespace == meshNS && p.Spec.NodeName == cluster.Nodes[0]:
			serve("ztunnel/"+cluster.Nodes[0], p, zt.Port, ztunnelMetrics, 7)
		case p.Namespace == meshNS && p.Spec.NodeName == cluster.Nodes[1]:
			node1Ztunnel = p.Name
		}
	}
	if len(standIns) != 3 || silentPod == "" || node1Ztunnel == "" {
		t.Fatalf("stand-ins %v, silent pod %q, node 1's ztunnel %q", standIns, silentPod, node1Ztunnel)
	}

	endpoints := []meshkube.ProxyEndpoint{istio, l5d, zt}
	services := []string{"front", "back"}
	before := c.ReadProxyCounters(ctx, app, endpoints, services)
	counted := map[string]int64{"envoy": 37, "linkerd2-proxy": 11, "ztunnel": 5}
	for key, s := range standIns {
		s.count.Add(counted[strings.Split(key, "/")[0]])
	}
	after := c.ReadProxyCounters(ctx, app, endpoints, services)

	got := map[string]mesh.ProxyDelta{}
	for _, d := range mesh.DiffCounters(before, after) {
		got[d.Component+"/"+d.Pod] = d
	}
	if len(got) != 5 {
		t.Errorf("%d proxies read, want 5 (2 istio-proxy, 1 linkerd-proxy, the ztunnels of the app's 2 nodes): %v", len(got), keys(got))
	}
	for key, want := range map[string]map[string]uint64{
		"envoy/" + podOf(standIns, "envoy"):                   {"front": 37},
		"linkerd2-proxy/" + podOf(standIns, "linkerd2-proxy"): {"back": 11},
		"ztunnel/" + cluster.Nodes[0]:                         {"front": 5, "back": 0},
	} {
		d, ok := got[key]
		switch {
		case !ok:
			t.Errorf("%s not read", key)
		case d.Err != "":
			t.Errorf("%s: %s", key, d.Err)
		case fmt.Sprint(d.Inbound) != fmt.Sprint(want):
			t.Errorf("%s counted inbound %v over the trial, want %v: what the stand-in counted into the pod's service", key, d.Inbound, want)
		case d.From.IsZero() || !d.To.After(d.From):
			t.Errorf("%s: read from %s to %s", key, d.From, d.To)
		}
	}
	if d := got["envoy/"+podOf(standIns, "envoy")]; d.Version != "1.31.1" || d.Unit != meshkube.UnitRequests ||
		d.Counters[`istio_requests_total{connection_security_policy=mutual_tls,destination_canonical_service=back,destination_service=back.`+app.Namespace+`.svc.cluster.local,destination_workload=back-v1,destination_workload_namespace=`+app.Namespace+`,reporter=source,request_protocol=http,response_code=200,response_flags=-,source_canonical_service=front,source_workload=front-v1,source_workload_namespace=`+app.Namespace+`}`] != 37 ||
		d.Gauges["envoy_server_live"] != 1 {
		t.Errorf("istio-proxy: version %q, unit %q, counters %v, gauges %v", d.Version, d.Unit, d.Counters, d.Gauges)
	}
	if d := got["linkerd2-proxy/"+podOf(standIns, "linkerd2-proxy")]; d.Version != "2.366.0" {
		t.Errorf("linkerd-proxy: version %q", d.Version)
	}
	if d := got["ztunnel/"+cluster.Nodes[0]]; d.Unit != meshkube.UnitConnections || d.Counters["tcp_connections_opened_total{reporter=source}"] != 5 {
		t.Errorf("ztunnel: unit %q, counters %v", d.Unit, d.Counters)
	}
	for key, path := range map[string]string{
		"envoy/" + silentPod:          fmt.Sprintf("GET /api/v1/namespaces/%s/pods/%s:15090/proxy/stats/prometheus: ", app.Namespace, silentPod),
		"ztunnel/" + cluster.Nodes[1]: fmt.Sprintf("GET /api/v1/namespaces/%s/pods/%s:15020/proxy/metrics: ", meshNS, node1Ztunnel),
	} {
		if d, ok := got[key]; !ok || !strings.Contains(d.Err, path) || d.Inbound != nil {
			t.Errorf("%s, which nothing serves: %+v; want it returned with the failure of %s", key, d, path)
		} else {
			t.Logf("%s: %s", key, d.Err)
		}
	}
	if _, ok := got["ztunnel/"+cluster.Nodes[2]]; ok {
		t.Errorf("the ztunnel of %s, which hosts none of the app's pods, was read", cluster.Nodes[2])
	}
	for key, s := range standIns {
		want := map[string]string{"envoy": "/stats/prometheus", "linkerd2-proxy": "/metrics", "ztunnel": "/metrics"}[strings.Split(key, "/")[0]]
		if p, _ := s.paths.Load().(string); p != want {
			t.Errorf("%s's stand-in was asked for %q, want %q", key, p, want)
		}
	}
}

// podOf is the pod (or node) of the one stand-in of a component.
func podOf(standIns map[string]*standInProxy, component string) string {
	for key := range standIns {
		if c, pod, _ := strings.Cut(key, "/"); c == component {
			return pod
		}
	}
	return ""
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// waitRunning waits until each namespace runs n pods with addresses, and returns them.
func waitRunning(t *testing.T, want map[string]int) []corev1.Pod {
	t.Helper()
	client, err := cluster.Client()
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.Pod
	deadline := time.Now().Add(time.Minute)
	for ns, n := range want {
		for {
			pods, err := client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var ready []corev1.Pod
			for _, p := range pods.Items {
				if p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" && p.DeletionTimestamp == nil {
					ready = append(ready, p)
				}
			}
			if len(ready) == n {
				out = append(out, ready...)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("namespace %s: %d of %d pods running with an address", ns, len(ready), n)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	return out
}
