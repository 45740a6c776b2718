package kube

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/ambient"
	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	"github.com/meshmark/meshmark/internal/workload"
	gatewayapicrds "github.com/meshmark/meshmark/third_party/gateway-api-crds"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

var gatewaysResource = schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "gateways"}

// waypointInstall is what the istio-ambient profile describes for Kubernetes with its
// waypoint on.
func waypointInstall(t *testing.T) meshkube.KubernetesInstall {
	t.Helper()
	return profileInstall(t, ambient.Name, map[string]any{"waypoint": true})
}

// TestWaypointRefusedWithoutGatewayAPI: on a cluster without the Gateway API's CRDs, an
// app with the waypoint is refused before anything is created, naming the CRD and the
// command that installs it.
func TestWaypointRefusedWithoutGatewayAPI(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	c := connect(t, Config{})
	if err := c.RequireCRDs(ctx, "", gatewayapicrds.GatewayCRD); err == nil {
		t.Fatalf("the test cluster has %s already: another test left it", gatewayapicrds.GatewayCRD)
	}
	in := waypointInstall(t)
	const run = "9a7e01"
	app, err := c.Deploy(ctx, AppSpec{Run: run, Mesh: "ambient", NamespaceLabels: in.NamespaceLabels, Gateways: in.Gateways})
	defer func() { _ = c.Teardown(context.Background(), app) }()
	want := fmt.Sprintf("lacks CustomResourceDefinition gateways.gateway.networking.k8s.io: the mesh's waypoint (Gateway waypoint, class istio-waypoint) is a Kubernetes Gateway API object, whose CRDs most clusters do not come with; install them: kubectl apply --server-side -f https://github.com/kubernetes-sigs/gateway-api/releases/download/%s/standard-install.yaml", gatewayapicrds.Version)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("deploy with a waypoint on a cluster without the Gateway API: %v\nwant it to say: %s", err, want)
	}
	t.Log(err)
	if app != nil {
		t.Errorf("deploy created namespace %s before refusing", app.Namespace)
	}
	if left := labelled(t, run); len(left) > 0 {
		t.Errorf("left after the refusal: %v", left)
	}
}

// waypointStats is the waypoint's istio-proxy Envoy at :15090/stats/prometheus, cut to
// a few series (%[1]d the count it is at, %[2]s the app's namespace): requests it carried
// into front, and into a front of another namespace, which must not be counted.
const waypointStats = `# TYPE istio_requests_total counter
istio_requests_total{reporter="waypoint",source_workload="meshmark-loadgen",source_workload_namespace="%[2]s",destination_workload="front-v1",destination_workload_namespace="%[2]s",destination_service="front.%[2]s.svc.cluster.local",destination_service_name="front",destination_service_namespace="%[2]s",destination_canonical_service="front",request_protocol="http",response_code="200",response_flags="-",connection_security_policy="mutual_tls"} %[1]d
istio_requests_total{reporter="waypoint",source_workload="client",source_workload_namespace="other",destination_workload="front",destination_workload_namespace="other",destination_service="front.other.svc.cluster.local",destination_service_name="front",destination_service_namespace="other",destination_canonical_service="front",request_protocol="http",response_code="200",response_flags="-",connection_security_policy="mutual_tls"} %[1]d
# TYPE istio_build gauge
istio_build{component="proxy",tag="1.31.1"} 1
`

// TestWaypointOnTheCluster puts ambient's waypoint on the test cluster as the profile
// describes it: the Gateway API's CRDs from meshmark's copy (through InstallMesh, as the
// run installs them), then apps whose namespace carries the waypoint's Gateway.
//
// kwok runs no container, and istiod, which would make the waypoint's Deployment for
// the Gateway and report it Programmed, is not running here; the test does both the way
// istiod does (its waypoint template's Deployment, owned by the Gateway, its pods
// labelled with the Gateway's name; the Programmed condition in the Gateway's status),
// and kwok makes the pod ready. So what is real here is the Gateway API's CRDs and the
// Gateway as the API server admits them, the wait on the Gateway and its Deployment,
// the waypoint's pod read through the API server's pod proxy (a stand-in serving its
// Envoy stats in Istio's format), and what teardown and uninstall leave.
//
//   - Without the stand-in for istiod, the readiness wait times out (a short limit
//     here) saying the Gateway is not Programmed and its Deployment not made, and
//     reading the waypoint says there is no waypoint pod.
//   - With it, the app is ready once the waypoint is; the waypoint's pod is not taken
//     for an app's pod by the enrollment check; the waypoint's counters over a trial
//     are exactly what the stand-in counted into the app's front.
//   - Teardown leaves no Gateway, Deployment or namespace; uninstalling the Gateway
//     API chart removes the 10 CRDs it added.
func TestWaypointOnTheCluster(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	c := connect(t, Config{})
	client := c.Client()
	dyn, err := dynamic.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	in := waypointInstall(t)
	var crds meshkube.HelmChart
	for _, ch := range in.Charts {
		if ch.Release == gatewayapicrds.Chart {
			crds = ch
		}
	}
	if crds.Chart == "" {
		t.Fatalf("no %s chart in the profile's install: %+v", gatewayapicrds.Chart, in.Charts)
	}
	// Into a namespace of the test's own, so that no other test's istio-system is
	// disturbed.
	var log bytes.Buffer
	mi, uninstall := installMesh(t, c, []Chart{{Release: crds.Release, Ref: crds.Chart, Namespace: "mmwp-istio-system"}}, nil, &log)
	e := mi.Effort
	if len(e.CRDs) != 10 || e.Kinds["CustomResourceDefinition"] != 10 || e.Objects != 10 || e.Values != 0 {
		t.Errorf("effort %+v: want the Gateway API's 10 standard CRDs, added, and nothing else", e)
	}

	g, err := workload.Parse("graph.yaml", []byte("name: wp\nservices:\n  - name: front\n    isEntrypoint: true\n    script: [call: back]\n  - name: back\n"))
	if err != nil {
		t.Fatal(err)
	}
	spec := func(run string, deployments []workload.Deployment) AppSpec {
		return AppSpec{Run: run, Mesh: "ambient", Deployments: deployments, NamespaceLabels: in.NamespaceLabels, Gateways: in.Gateways,
			Args: func(d workload.Deployment) []string { return g.ServiceArgs(d, PodNameArg) }}
	}

	// Nothing plays istiod: the wait must end at its limit and say what is missing.
	brief := connect(t, Config{Timeout: 3 * time.Second})
	lone, err := brief.Deploy(ctx, spec("9a7e02", nil))
	defer func() { _ = brief.Teardown(context.Background(), lone) }()
	if err != nil {
		t.Fatal(err)
	}
	gw, err := dyn.Resource(gatewaysResource).Namespace(lone.Namespace).Get(ctx, "waypoint", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the waypoint's Gateway in %s: %v", lone.Namespace, err)
	}
	if class, _, _ := unstructured.NestedString(gw.Object, "spec", "gatewayClassName"); class != "istio-waypoint" || gw.GetLabels()[ManagedByLabel] != "" {
		t.Errorf("Gateway: class %q, labels %v: want istio-waypoint, and no label of meshmark's for istiod to copy onto the waypoint's pods", class, gw.GetLabels())
	}
	ns, err := client.CoreV1().Namespaces().Get(ctx, lone.Namespace, metav1.GetOptions{})
	if err != nil || ns.Labels["istio.io/use-waypoint"] != "waypoint" || ns.Labels["istio.io/dataplane-mode"] != "ambient" {
		t.Errorf("namespace %s labels %v (%v): want it in ambient, through the waypoint", lone.Namespace, ns.Labels, err)
	}
	start := time.Now()
	err = brief.WaitReady(ctx, lone, nil)
	took := time.Since(start)
	for _, want := range []string{
		"not ready after 3s",
		"gateway waypoint not Programmed by its controller (class istio-waypoint): Pending: Waiting for controller",
		"deployment waypoint of gateway waypoint not made yet by its controller (class istio-waypoint)",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("waiting for a waypoint nothing makes: %v\nwant it to say: %s", err, want)
		}
	}
	if took > 10*time.Second {
		t.Errorf("the wait took %s with a 3 s limit", took)
	}
	t.Logf("after %s: %v", took.Round(100*time.Millisecond), err)
	read := c.ReadProxyCounters(ctx, lone, in.Proxies[1:], []string{"front", "back"})
	if len(read) != 1 || read[0].Component != "waypoint" || read[0].Err == nil ||
		!strings.Contains(read[0].Err.Error(), "no waypoint pod (labels gateway.networking.k8s.io/gateway-name=waypoint) in the namespace") {
		t.Errorf("reading a waypoint that has no pod: %+v", read)
	}
	if err := brief.Teardown(ctx, lone); err != nil {
		t.Fatal(err)
	}

	// Now the test plays istiod.
	const run = "9a7e03"
	var progress []string
	app, err := c.Deploy(ctx, spec(run, g.Deployments()))
	defer func() { _ = c.Teardown(context.Background(), app) }()
	if err != nil {
		t.Fatal(err)
	}
	playIstiod(t, c, dyn, app.Namespace)
	if err := c.WaitReady(ctx, app, func(p WaitProgress) { progress = append(progress, fmt.Sprintf("%d/%d", p.Ready, p.Total)) }); err != nil {
		t.Fatal(err)
	}
	if last := progress[len(progress)-1]; last != "3/3" {
		t.Errorf("progress %v: want it to end at 3/3 (front, back and the waypoint)", progress)
	}
	pods, err := c.Sidecars(ctx, app, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != 2 {
		t.Errorf("the enrollment check sees %d pods, want the app's 2 (the waypoint is the mesh's, not the app's): %+v", len(pods), pods)
	}
	running := waitRunning(t, map[string]int{app.Namespace: 3})
	var waypointPod corev1.Pod
	for _, p := range running {
		if p.Labels["gateway.networking.k8s.io/gateway-name"] == "waypoint" {
			waypointPod = p
		}
	}
	if waypointPod.Name == "" {
		t.Fatalf("no waypoint pod among %d running", len(running))
	}
	ep := in.Proxies[1]
	standIn := newStandInProxy(t, waypointStats, app.Namespace, 500)
	if err := cluster.ReachPodPort(waypointPod.Status.PodIP, ep.Port, standIn.srv.Listener.Addr().String()); err != nil {
		t.Fatal(err)
	}
	before := c.ReadProxyCounters(ctx, app, []meshkube.ProxyEndpoint{ep}, []string{"front", "back"})
	standIn.count.Add(25)
	after := c.ReadProxyCounters(ctx, app, []meshkube.ProxyEndpoint{ep}, []string{"front", "back"})
	deltas := mesh.DiffCounters(before, after)
	if len(deltas) != 1 {
		t.Fatalf("%d proxies read, want the waypoint: %+v", len(deltas), deltas)
	}
	d := deltas[0]
	if d.Component != "waypoint" || d.Pod != waypointPod.Name || d.Err != "" || d.Unit != meshkube.UnitRequests || d.Version != "1.31.1" ||
		fmt.Sprint(d.Inbound) != fmt.Sprint(map[string]uint64{"back": 0, "front": 25}) {
		t.Errorf("the waypoint over the trial: %+v; want pod %s, 25 requests into front, 0 into back", d, waypointPod.Name)
	}
	if p, _ := standIn.paths.Load().(string); p != "/stats/prometheus" {
		t.Errorf("the waypoint's stand-in was asked for %q", p)
	}

	start = time.Now()
	if err := c.Teardown(ctx, app); err != nil {
		t.Fatal(err)
	}
	t.Logf("teardown with the waypoint: %s", time.Since(start).Round(100*time.Millisecond))
	if _, err := client.CoreV1().Namespaces().Get(ctx, app.Namespace, metav1.GetOptions{}); !IsNotFound(err) {
		t.Errorf("namespace %s after teardown: %v", app.Namespace, err)
	}
	if gws, err := dyn.Resource(gatewaysResource).List(ctx, metav1.ListOptions{}); err != nil || len(gws.Items) > 0 {
		t.Errorf("gateways after teardown: %d (%v)", len(gws.Items), err)
	}
	if deps, err := client.AppsV1().Deployments("").List(ctx, metav1.ListOptions{LabelSelector: "gateway.networking.k8s.io/gateway-name"}); err != nil || len(deps.Items) > 0 {
		t.Errorf("waypoint deployments after teardown: %d (%v)", len(deps.Items), err)
	}
	if err := uninstall(); err != nil {
		t.Fatal(err)
	}
	checkCRDsGone(t, c, e.CRDs)
}

// playIstiod does for the namespace's waypoint what istiod's Gateway controller does,
// as its waypoint template (istio-discovery's files/waypoint.yaml) has it: a Deployment
// named like the Gateway and owned by it, labelled with the Gateway's name and class,
// its pods kept out of ambient's redirection and running istio-proxy; then the
// Gateway's status says it is Accepted and Programmed.
func playIstiod(t *testing.T, c *Cluster, dyn dynamic.Interface, namespace string) {
	t.Helper()
	ctx := context.Background()
	gw, err := dyn.Resource(gatewaysResource).Namespace(namespace).Get(ctx, "waypoint", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{
		"gateway.networking.k8s.io/gateway-name":       gw.GetName(),
		"gateway.networking.k8s.io/gateway-class-name": "istio-waypoint",
		"gateway.istio.io/managed":                     "istio.io-mesh-controller",
		"istio.io/waypoint-for":                        "service",
	}
	podLabels := merge(labels, map[string]string{"sidecar.istio.io/inject": "false", "istio.io/dataplane-mode": "none"})
	owner := metav1.OwnerReference{APIVersion: "gateway.networking.k8s.io/v1", Kind: "Gateway", Name: gw.GetName(), UID: gw.GetUID()}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: gw.GetName(), Labels: labels, OwnerReferences: []metav1.OwnerReference{owner}},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"gateway.networking.k8s.io/gateway-name": gw.GetName()}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: podLabels}, Spec: corev1.PodSpec{
				Containers: []corev1.Container{{Name: "istio-proxy", Image: "docker.io/istio/proxyv2:1.31.1", Args: []string{"proxy", "waypoint"},
					Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 15020}, {Name: "status-port", ContainerPort: 15021}, {Name: "http-envoy-prom", ContainerPort: 15090}}}},
			}},
		},
	}
	if _, err := c.Client().AppsV1().Deployments(namespace).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	now := metav1.Now().UTC().Format(time.RFC3339)
	cond := func(typ, reason string) any {
		return map[string]any{"type": typ, "status": "True", "reason": reason, "message": "as istiod would say it",
			"lastTransitionTime": now, "observedGeneration": gw.GetGeneration()}
	}
	if err := unstructured.SetNestedSlice(gw.Object, []any{cond("Accepted", "Accepted"), cond("Programmed", "Programmed")}, "status", "conditions"); err != nil {
		t.Fatal(err)
	}
	if _, err := dyn.Resource(gatewaysResource).Namespace(namespace).UpdateStatus(ctx, gw, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("the Gateway's status: %v", err)
	}
}
