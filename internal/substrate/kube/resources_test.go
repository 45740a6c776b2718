package kube

import (
	"context"
	"fmt"
	"maps"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/substrate/kube/kubetest"
	"github.com/meshmark/meshmark/internal/workload"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// TestResourcesPerRoleFromKubeletMetrics reads CPU and memory per container through the
// API server's node proxy, from each node's kubelet resource metrics endpoint, and tells
// each container's role. The endpoint here is kwok's emulation of the kubelet's: the
// format, the path and the proxy are real, the numbers are what this test told kwok each
// container uses (kubetest.UsageAnnotations), so the test can hold every figure to them.
// The third node's endpoint serves nothing, as a kubelet that cannot be read: its pod
// must be missing with a warning that names the node, not read as zero. It stays on the
// paper-only cluster for the three nodes, one unreadable, and the pods of meshes (istiod,
// ztunnel, a waypoint) it needs only as names; a real kubelet's figures are held to the
// kernel's own account in TestResourcesOnRealNodesMatchTheWork.
func TestResourcesPerRoleFromKubeletMetrics(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	onNode := func(i int) map[string]string { return map[string]string{"meshmark.dev/test-node": fmt.Sprint(i)} }
	c := connect(t, Config{AppNodeSelector: onNode(0), LoadgenNodeSelector: onNode(1)})
	client := c.Client()

	type want struct {
		role        substrate.Role
		cpu, memory string
	}
	usage := func(wants map[string]want) map[string]string {
		out := map[string]string{}
		for container, w := range wants {
			maps.Copy(out, kubetest.UsageAnnotations(container, w.cpu, w.memory))
		}
		return out
	}
	// What each kind of pod runs, by container, and what the sampler must make of it.
	appPod := map[string]want{"app": {substrate.RoleWorkload, "200m", "48Mi"}, "generator": {substrate.RoleLoadGen, "300m", "16Mi"}}
	meshedPod := map[string]want{"app": {substrate.RoleWorkload, "150m", "40Mi"}, "istio-proxy": {substrate.RoleSidecar, "50m", "24Mi"}}
	waypointPod := map[string]want{"istio-proxy": {substrate.RoleGateway, "80m", "20Mi"}}
	istiodPod := map[string]want{"discovery": {substrate.RoleControlPlane, "120m", "96Mi"}}
	ztunnelPod := map[string]want{"istio-proxy": {substrate.RoleNodeProxy, "30m", "8Mi"}}

	g, err := workload.Parse("graph.yaml", []byte("name: res\nservices:\n  - name: front\n    isEntrypoint: true\n    replicas: 2\n"))
	if err != nil {
		t.Fatal(err)
	}
	app, err := c.Deploy(ctx, AppSpec{
		Run: "5e7a11", Mesh: "istio", Deployments: g.Deployments(), Generators: 1,
		Args:           func(d workload.Deployment) []string { return g.ServiceArgs(d, PodNameArg) },
		PodAnnotations: usage(appPod),
	})
	meshNS := "mmres-istio-system"
	// Both namespaces go together: each takes seconds to empty here.
	t.Cleanup(func() {
		_ = c.deleteNamespaces(context.Background(), []string{c.NamespaceFor("5e7a11", "istio"), meshNS}, nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: meshNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	podTemplate := func(name string, labels map[string]string, node map[string]string, containers map[string]want) corev1.PodTemplateSpec {
		labels = merge(labels, map[string]string{"test-pod": name})
		spec := corev1.PodSpec{NodeSelector: node}
		for _, cn := range slices.Sorted(maps.Keys(containers)) {
			spec.Containers = append(spec.Containers, corev1.Container{Name: cn, Image: "registry.example/" + cn})
		}
		return corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: usage(containers)}, Spec: spec}
	}
	deployment := func(ns, name string, labels, node map[string]string, containers map[string]want) {
		tmpl := podTemplate(name, labels, node, containers)
		d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"test-pod": name}}, Template: tmpl}}
		if _, err := client.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// A pod as a mesh's injector leaves it, and a waypoint, beside the app; the mesh's
	// control plane, and its node proxy on every node, in the mesh's namespace.
	deployment(app.Namespace, "meshed", nil, onNode(0), meshedPod)
	deployment(app.Namespace, "waypoint", map[string]string{"gateway.networking.k8s.io/gateway-name": "waypoint"}, onNode(0), waypointPod)
	deployment(meshNS, "istiod", nil, onNode(1), istiodPod)
	tmpl := podTemplate("ztunnel", nil, nil, ztunnelPod)
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "ztunnel"}, Spec: appsv1.DaemonSetSpec{
		Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"test-pod": "ztunnel"}}, Template: tmpl}}
	if _, err := client.AppsV1().DaemonSets(meshNS).Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// Every pod must run (on paper) before kwok reports it.
	wantPods := map[string]int{app.Namespace: 2 + 1 + 1 + 1, meshNS: 1 + len(cluster.Nodes)}
	deadline := time.Now().Add(time.Minute)
	for ns, n := range wantPods {
		for {
			pods, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			running := 0
			for _, p := range pods.Items {
				if p.Status.Phase == corev1.PodRunning {
					running++
				}
			}
			if running == n {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("namespace %s: %d of %d pods running", ns, running, n)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}

	scope := ResourceScope{Mesh: "istio", App: app.Namespace, MeshNamespaces: []string{meshNS}, Sidecars: []string{"istio-proxy"}}
	const interval = time.Second // the local sampler's cadence
	sampler := c.SampleResources(ctx, scope, interval, nil)
	time.Sleep(4 * interval)
	got := sampler.Stop()

	// What each container is, from its pod's labels.
	pods, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: "test-pod"})
	if err != nil {
		t.Fatal(err)
	}
	genPods, err := client.CoreV1().Pods(app.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]map[string]want{"meshed": meshedPod, "waypoint": waypointPod, "istiod": istiodPod, "ztunnel": ztunnelPod}
	expect := map[[2]string]want{} // pod, container
	unreadPod := ""
	for _, p := range append(pods.Items, genPods.Items...) {
		containers := kinds[p.Labels["test-pod"]]
		if containers == nil {
			containers = appPod
		}
		if p.Spec.NodeName == cluster.Nodes[2] {
			unreadPod = p.Name
			continue
		}
		for _, ctr := range p.Spec.Containers {
			expect[[2]string{p.Name, ctr.Name}] = containers[ctr.Name]
		}
	}
	if unreadPod == "" {
		t.Fatalf("no pod on %s, whose metrics cannot be read", cluster.Nodes[2])
	}

	type series struct{ first, last ContainerSample }
	seen := map[[2]string]*series{}
	for _, s := range got.Samples {
		k := [2]string{s.Pod, s.Container}
		if s.Node == cluster.Nodes[2] || s.Pod == unreadPod {
			t.Errorf("a sample of %s/%s on the unreadable node %s: %+v", s.Pod, s.Container, cluster.Nodes[2], s)
			continue
		}
		w, ok := expect[k]
		if !ok {
			t.Errorf("sample of %s/%s in namespace %s, which the scope does not hold", s.Pod, s.Container, s.Namespace)
			continue
		}
		if s.Role != w.role {
			t.Errorf("%s/%s taken as %s, want %s", s.Pod, s.Container, s.Role, w.role)
		}
		if mem := resource.MustParse(w.memory); s.WorkingSetBytes != uint64(mem.Value()) {
			t.Errorf("%s/%s working set %d bytes, kwok was told %s", s.Pod, s.Container, s.WorkingSetBytes, w.memory)
		}
		if seen[k] == nil {
			seen[k] = &series{first: s}
		}
		seen[k].last = s
	}
	perRole := map[substrate.Role]float64{}
	wantRole := map[substrate.Role]float64{}
	for k, w := range expect {
		cpu := resource.MustParse(w.cpu)
		wantRole[w.role] += cpu.AsApproximateFloat64()
		s := seen[k]
		if s == nil {
			t.Errorf("no sample of %s/%s", k[0], k[1])
			continue
		}
		span := s.last.T.Sub(s.first.T)
		if span < 2*interval {
			t.Errorf("%s/%s sampled over %s only", k[0], k[1], span)
			continue
		}
		rate := (s.last.CPUSeconds - s.first.CPUSeconds) / span.Seconds()
		perRole[w.role] += rate
		// kwok adds usage × the time between two reads by its own clock; ours differs by
		// the requests' jitter, a few ms over seconds.
		if want := cpu.AsApproximateFloat64(); math.Abs(rate-want) > 0.05*want {
			t.Errorf("%s/%s used %.4f cores, kwok was told %s", k[0], k[1], rate, w.cpu)
		}
	}
	t.Logf("%d rounds; cores per role %v (want %v)", got.Rounds, perRole, wantRole)
	for role, want := range wantRole {
		if math.Abs(perRole[role]-want) > 0.05*want {
			t.Errorf("role %s used %.4f cores, want %.4f", role, perRole[role], want)
		}
	}
	if got.Rounds < 4 {
		t.Errorf("%d rounds in 4 intervals and a closing one", got.Rounds)
	}
	if len(got.Unread) != 1 || got.Unread[0].Node != cluster.Nodes[2] || got.Unread[0].Failed != got.Rounds ||
		!strings.Contains(got.Unread[0].String(), "/api/v1/nodes/"+cluster.Nodes[2]+"/proxy/metrics/resource") {
		t.Errorf("unread nodes %+v, want %s in every round, named with the path that failed", got.Unread, cluster.Nodes[2])
	} else {
		t.Logf("warning: %s", got.Unread[0])
	}
}

// TestConnectNamesTheMissingNodeProxyRight: a user allowed everything else a run does,
// but not to read the kubelets through the API server, is refused before anything is
// created, with that one right named.
func TestConnectNamesTheMissingNodeProxyRight(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	client, err := cluster.Client()
	if err != nil {
		t.Fatal(err)
	}
	const user = "meshmark-no-node-proxy"
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: user}}
	for _, ra := range neededRights {
		if ra.Resource == "nodes" && ra.Subresource == "proxy" {
			continue
		}
		res := ra.Resource
		if ra.Subresource != "" {
			res += "/" + ra.Subresource
		}
		role.Rules = append(role.Rules, rbacv1.PolicyRule{Verbs: []string{ra.Verb}, APIGroups: []string{ra.Group}, Resources: []string{res}})
	}
	if _, err := client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: user},
		Subjects: []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: user}}}
	if _, err := client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.RbacV1().ClusterRoleBindings().Delete(context.Background(), user, metav1.DeleteOptions{})
		_ = client.RbacV1().ClusterRoles().Delete(context.Background(), user, metav1.DeleteOptions{})
	})
	// The admin, impersonating the user: RBAC judges the user, as for its own login.
	cfg, err := clientcmd.LoadFromFile(cluster.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	admin := *cfg.AuthInfos[cfg.Contexts[cluster.Context].AuthInfo]
	admin.Impersonate = user
	cfg.AuthInfos[user] = &admin
	cfg.Contexts[user] = &clientcmdapi.Context{Cluster: cfg.Contexts[cluster.Context].Cluster, AuthInfo: user}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	// RBAC's cache may take a moment to see the new binding.
	var connErr error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		_, connErr = Connect(ctx, Config{Kubeconfig: path, Context: user})
		if connErr != nil && strings.Contains(connErr.Error(), "RBAC denies this user, for a run: get nodes/proxy;") {
			break
		}
	}
	if connErr == nil || !strings.Contains(connErr.Error(), "RBAC denies this user, for a run: get nodes/proxy;") {
		t.Fatalf("connect as a user without nodes/proxy: %v; want the one missing right named", connErr)
	}
	t.Log(connErr)
}

// TestNodeAgentIsNotANodeProxy: of the DaemonSets ambient installs in istio-system, only
// ztunnel's pods (the mesh's declared node proxy) are its data plane; istio-cni's node
// agent, which carries no traffic, counts with the control plane. Without declared node
// proxies every DaemonSet's pod of the mesh is one, as before.
func TestNodeAgentIsNotANodeProxy(t *testing.T) {
	daemon := []metav1.OwnerReference{{Kind: "DaemonSet", Name: "x"}}
	ztunnel := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "ztunnel-abc", Namespace: "istio-system", Labels: map[string]string{"app": "ztunnel"}, OwnerReferences: daemon}}
	cni := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "istio-cni-node-abc", Namespace: "istio-system", Labels: map[string]string{"k8s-app": "istio-cni-node"}, OwnerReferences: daemon}}
	istiod := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "istiod-abc", Namespace: "istio-system", Labels: map[string]string{"app": "istiod"}}}

	scope := ResourceScope{Mesh: "ambient", App: "app", MeshNamespaces: []string{"istio-system"}, NodeProxies: []map[string]string{{"app": "ztunnel"}}}
	for _, c := range []struct {
		pod  corev1.Pod
		want substrate.Role
	}{{ztunnel, substrate.RoleNodeProxy}, {cni, substrate.RoleControlPlane}, {istiod, substrate.RoleControlPlane}} {
		if role, ok := scope.RoleOf(&c.pod, "c"); !ok || role != c.want {
			t.Errorf("%s: %s (%v), want %s", c.pod.Name, role, ok, c.want)
		}
	}
	scope.NodeProxies = nil
	if role, _ := scope.RoleOf(&cni, "c"); role != substrate.RoleNodeProxy {
		t.Errorf("without declared node proxies, a DaemonSet's pod is %s, want a node proxy", role)
	}
}

// TestThePlainGatewayIsTheGateway: in the app's namespace, the plain ingress gateway's
// container counts as the gateway, a mesh's sidecar beside it as a sidecar, and the
// app's own containers as the workload.
func TestThePlainGatewayIsTheGateway(t *testing.T) {
	gw := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "ingress-gateway-abc", Namespace: "app", Labels: map[string]string{"app": "ingress-gateway", RoleLabel: roleGateway}}}
	app := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "productpage-v1-abc", Namespace: "app", Labels: map[string]string{"app": "productpage"}}}
	scope := ResourceScope{Mesh: "linkerd", App: "app", Sidecars: []string{"linkerd-proxy"}}
	for _, c := range []struct {
		pod       corev1.Pod
		container string
		want      substrate.Role
	}{{gw, "gateway", substrate.RoleGateway}, {gw, "linkerd-proxy", substrate.RoleSidecar}, {app, "app", substrate.RoleWorkload}} {
		if role, ok := scope.RoleOf(&c.pod, c.container); !ok || role != c.want {
			t.Errorf("%s/%s: %s (%v), want %s", c.pod.Name, c.container, role, ok, c.want)
		}
	}
}
