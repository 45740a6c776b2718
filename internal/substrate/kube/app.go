package kube

import (
	"context"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	"github.com/meshmark/meshmark/internal/workload"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// FilesDir is where AppSpec.Files appear in every workload pod.
const FilesDir = "/etc/meshmark"

// deleteTimeout bounds the wait for a namespace to be gone.
const deleteTimeout = 5 * time.Minute

// AppSpec is a workload graph to put on the cluster for one mesh of one run.
type AppSpec struct {
	Run, Mesh   string
	Deployments []workload.Deployment
	// Args returns the arguments of a deployment's container after the image's
	// entrypoint (meshmark-pod); PodNameArg in them becomes the pod's own name.
	Args func(d workload.Deployment) []string
	// Files go into one ConfigMap mounted at FilesDir in every pod (a graph file).
	Files map[string][]byte
	// NamespaceLabels, NamespaceAnnotations and PodAnnotations are how a mesh enrolls
	// the workload, for example istio-injection=enabled or linkerd.io/inject=enabled.
	NamespaceLabels, NamespaceAnnotations, PodAnnotations map[string]string
	// Generators is how many load-generator pods to run beside the workload (see
	// ForwardGenerators); 0 runs none.
	Generators int
	// Gateways are the mesh's Gateway API Gateways beside the workload (ambient's
	// waypoint): created in the namespace before the workload, waited for with it,
	// deleted before it.
	Gateways []meshkube.AppGateway
	// Manifests are the mesh's objects for the app's namespace (meshkube.KubernetesInstall's
	// AppManifests): created in it, labelled as meshmark's, before the workload.
	Manifests []string
	// SpreadServices adds, for each service version, a headless Service over its pods
	// (SpreadServiceName), whose name resolves to every ready pod of the version: callers
	// that balance per request themselves (the baseline's `balancing: per-request`)
	// spread their calls over them by the versions' weights, where the service's own
	// Service, through kube-proxy, picks a pod per connection.
	SpreadServices bool
	// Ingress, when set, puts a plain gateway in front of the entry service;
	// IngressRoute, when set, routes what one of Gateways receives to the entry service.
	Ingress      *IngressGateway
	IngressRoute *IngressRoute
	// Sidecar is the container the mesh's injector adds to every enrolled pod
	// (meshkube.KubernetesInstall's Sidecar): before it creates the workload, Deploy
	// waits until the injector adds it (waitInjector). Empty for meshes without one.
	Sidecar string
}

// SpreadServiceName is the headless Service of one version of a service, for callers
// that spread their requests over its pods (AppSpec.SpreadServices).
func SpreadServiceName(service, version string) string {
	return dnsLabel(service + "-" + version + "-pods")
}

// spreadRole is the RoleLabel of the headless Services of AppSpec.SpreadServices, which
// are not the graph's services (the plaintext probe, for one, leaves them out).
const spreadRole = "spread"

// PodNameArg stands for the pod's name in AppSpec.Args: Kubernetes expands it from the
// downward API when the container starts.
const PodNameArg = "$(POD_NAME)"

// App is a workload graph as created on the cluster.
type App struct {
	Namespace   string
	Deployments []string
	Services    []string
	// pods counts the pods behind each Service, which its endpoints must all list
	// before the app is ready.
	pods map[string]int
	// spread are the headless Services of AppSpec.SpreadServices, with the pods behind
	// each.
	spread map[string]int
	// generators is how many load-generator pods the app has; files, whether it has
	// a ConfigMap of files.
	generators, files int
	// gateways are the mesh's Gateways in the namespace.
	gateways []appGateway
}

// Pods is how many pods the app runs: the workload's and the load generators'.
func (a *App) Pods() int {
	n := a.generators
	for _, p := range a.pods {
		n += p
	}
	return n
}

// Files is how many ConfigMaps of files the app has (0 or 1).
func (a *App) Files() int { return a.files }

// NamespaceFor is the namespace of a run's mesh: a DNS label made of the prefix, the run
// id and the mesh's name, so that two meshes of one run never share one.
func (c *Cluster) NamespaceFor(run, mesh string) string {
	return dnsLabel(c.cfg.NamespacePrefix + "-" + run + "-" + mesh)
}

// ServiceName is the name of a graph service's Service on the cluster, by which pods in
// its namespace reach it.
func ServiceName(service string) string { return dnsLabel(service) }

var notDNS = regexp.MustCompile(`[^a-z0-9-]+`)

// dnsLabel turns s into an RFC 1123 label: lower case, [a-z0-9-], at most 63
// characters, starting and ending with an alphanumeric.
func dnsLabel(s string) string {
	s = notDNS.ReplaceAllString(strings.ToLower(s), "-")
	if len(s) > 63 {
		s = s[:63]
	}
	return strings.Trim(s, "-")
}

// Deploy creates the namespace, the files, the mesh's Gateways, one Deployment per
// service version and one Service per service. It returns what it created so far even
// when it fails, so that the caller can tear it down.
func (c *Cluster) Deploy(ctx context.Context, spec AppSpec) (*App, error) {
	if c.cfg.Image == "" {
		return nil, fmt.Errorf("no image for the workload: set spec.substrate.kubernetes.image (build one with `meshmark image build`)")
	}
	if spec.Ingress != nil && slices.ContainsFunc(spec.Deployments, func(d workload.Deployment) bool { return dnsLabel(d.Service) == spec.Ingress.Name }) {
		return nil, fmt.Errorf("the ingress gateway's Service would be named %s, as a service of the graph is: rename that service", spec.Ingress.Name)
	}
	appManifests := spec.Manifests
	if spec.IngressRoute != nil {
		route, err := yaml.Marshal(spec.IngressRoute.object("", nil).Object)
		if err != nil {
			return nil, err
		}
		appManifests = append(slices.Clip(appManifests), string(route))
	}
	if len(spec.Gateways)+len(appManifests) > 0 {
		if err := c.CheckInstallRights(ctx, nil, spec.Gateways, appManifests); err != nil {
			return nil, err
		}
	}
	gateways, err := c.parseGateways(ctx, spec.Gateways)
	if err != nil {
		return nil, err
	}
	app := &App{Namespace: c.NamespaceFor(spec.Run, spec.Mesh), pods: map[string]int{}}
	labels := c.labels(spec)
	nsLabels := merge(labels, spec.NamespaceLabels)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: app.Namespace, Labels: nsLabels,
		Annotations: merge(spec.NamespaceAnnotations, map[string]string{OwnerAnnotation: ownerRecord()}),
	}}
	if _, err := c.client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create namespace %s: %w", app.Namespace, err)
	}
	if len(spec.Files) > 0 {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "meshmark-files", Labels: labels}, BinaryData: spec.Files}
		if _, err := c.client.CoreV1().ConfigMaps(app.Namespace).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			return app, fmt.Errorf("namespace %s: create files: %w", app.Namespace, err)
		}
		app.files = 1
	}
	for _, m := range spec.Manifests {
		var obj unstructured.Unstructured
		if err := yaml.Unmarshal([]byte(m), &obj.Object); err != nil {
			return app, fmt.Errorf("namespace %s: mesh configuration: %w", app.Namespace, err)
		}
		obj.SetNamespace(app.Namespace)
		obj.SetLabels(merge(obj.GetLabels(), labels))
		if _, err := c.create(ctx, &obj); err != nil {
			return app, fmt.Errorf("namespace %s: %w", app.Namespace, err)
		}
	}
	for i, gw := range gateways {
		if err := c.createGateway(ctx, app, gw, spec.Gateways[i].Deployment); err != nil {
			return app, err
		}
	}
	if spec.IngressRoute != nil {
		if err := c.createIngressRoute(ctx, app, *spec.IngressRoute, labels); err != nil {
			return app, err
		}
	}
	if spec.Sidecar != "" && len(spec.Deployments) > 0 {
		if err := c.waitInjector(ctx, app.Namespace, c.deployment(spec, spec.Deployments[0], labels), spec.Sidecar); err != nil {
			return app, err
		}
	}
	ports := map[string]workload.Deployment{}
	for _, d := range spec.Deployments {
		dep := c.deployment(spec, d, labels)
		if _, err := c.client.AppsV1().Deployments(app.Namespace).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
			return app, fmt.Errorf("namespace %s: create deployment %s: %w", app.Namespace, dep.Name, err)
		}
		app.Deployments = append(app.Deployments, dep.Name)
		app.pods[dnsLabel(d.Service)] += int(*dep.Spec.Replicas)
		if _, seen := ports[d.Service]; !seen {
			ports[d.Service] = d
		}
	}
	if spec.Generators > 0 {
		dep := c.generatorDeployment(spec, labels, spec.Generators)
		if _, err := c.client.AppsV1().Deployments(app.Namespace).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
			return app, fmt.Errorf("namespace %s: create deployment %s: %w", app.Namespace, dep.Name, err)
		}
		app.Deployments = append(app.Deployments, dep.Name)
		app.generators = spec.Generators
	}
	if spec.Ingress != nil {
		if err := c.createIngressGateway(ctx, app, spec, labels); err != nil {
			return app, err
		}
	}
	var services []string
	for s := range ports {
		services = append(services, s)
	}
	sort.Strings(services)
	if spec.SpreadServices {
		if err := c.createSpreadServices(ctx, app, spec, labels, services); err != nil {
			return app, err
		}
	}
	for _, s := range services {
		d := ports[s]
		name, appProtocol := portName(d.Protocol)
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: dnsLabel(s), Labels: merge(labels, map[string]string{"app": s})},
			Spec: corev1.ServiceSpec{
				Selector: map[string]string{"app": s},
				Ports: []corev1.ServicePort{{
					Name: name, AppProtocol: &appProtocol, Port: int32(d.Port), TargetPort: intstr.FromInt32(int32(d.Port)),
				}},
			},
		}
		if _, err := c.client.CoreV1().Services(app.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			return app, fmt.Errorf("namespace %s: create service %s: %w", app.Namespace, svc.Name, err)
		}
		app.Services = append(app.Services, svc.Name)
	}
	return app, nil
}

// createSpreadServices creates a headless Service per service version
// (AppSpec.SpreadServices), after checking that no name is a graph service's or
// another version's.
func (c *Cluster) createSpreadServices(ctx context.Context, app *App, spec AppSpec, labels map[string]string, services []string) error {
	taken := map[string]string{}
	for _, s := range services {
		taken[dnsLabel(s)] = "service " + s
	}
	for _, d := range spec.Deployments {
		name := SpreadServiceName(d.Service, d.Version)
		what := fmt.Sprintf("version %s of service %s", d.Version, d.Service)
		if other, ok := taken[name]; ok {
			return fmt.Errorf("namespace %s: the headless Service of %s would be named %s, as %s is: rename one", app.Namespace, what, name, other)
		}
		taken[name] = what
		portName, appProtocol := portName(d.Protocol)
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: merge(labels, map[string]string{"app": d.Service, "version": d.Version, RoleLabel: spreadRole})},
			Spec: corev1.ServiceSpec{
				ClusterIP: corev1.ClusterIPNone,
				Selector:  map[string]string{"app": d.Service, "version": d.Version},
				Ports: []corev1.ServicePort{{
					Name: portName, AppProtocol: &appProtocol, Port: int32(d.Port), TargetPort: intstr.FromInt32(int32(d.Port)),
				}},
			},
		}
		if _, err := c.client.CoreV1().Services(app.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("namespace %s: create service %s: %w", app.Namespace, name, err)
		}
		if app.spread == nil {
			app.spread = map[string]int{}
		}
		app.spread[name] = max(d.Replicas, 1)
	}
	return nil
}

func (c *Cluster) labels(spec AppSpec) map[string]string {
	return map[string]string{ManagedByLabel: ManagedBy, RunLabel: dnsLabel(spec.Run), MeshLabel: dnsLabel(spec.Mesh)}
}

// portName is the Service port's name and appProtocol: meshes pick the protocol by them
// (Istio by the name's prefix, others by appProtocol), as they would for a real app.
func portName(protocol string) (name, appProtocol string) {
	switch protocol {
	case "grpc":
		return "grpc", "grpc"
	case "h2c":
		return "http2", "kubernetes.io/h2c"
	default:
		return "http", "http"
	}
}

func (c *Cluster) deployment(spec AppSpec, d workload.Deployment, labels map[string]string) *appsv1.Deployment {
	podLabels := merge(labels, map[string]string{"app": d.Service, "version": d.Version})
	replicas := int32(d.Replicas)
	if replicas == 0 {
		replicas = 1
	}
	uid, nonRoot := int64(2000), true
	// An HTTP probe whatever the service's protocol: `meshmark service` answers HTTP on
	// every port, gRPC services' included, and a mesh's default policy may authorize
	// only HTTP probes (Linkerd's policy controller authorizes a pod's httpGet probe
	// paths, not its gRPC probes, so under all-authenticated the kubelet's gRPC probe,
	// which carries no mesh identity, would be refused and the pod never get ready).
	probe := &corev1.Probe{PeriodSeconds: 2, FailureThreshold: 3, ProbeHandler: corev1.ProbeHandler{
		HTTPGet: &corev1.HTTPGetAction{Path: workload.HealthPath, Port: intstr.FromInt32(int32(d.Port))}}}
	container := corev1.Container{
		Name:            "app",
		Image:           c.cfg.Image,
		ImagePullPolicy: corev1.PullIfNotPresent,
		Args:            spec.Args(d),
		Env: append([]corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{
			FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}}, c.runnerEnv()...),
		Ports:          []corev1.ContainerPort{{Name: "app", ContainerPort: int32(d.Port)}},
		ReadinessProbe: probe,
		SecurityContext: &corev1.SecurityContext{
			RunAsUser: &uid, RunAsNonRoot: &nonRoot,
		},
	}
	// meshmark-pod service exits on SIGTERM at once; Kubernetes' default of 30 s would only
	// make every teardown wait for pods that are already gone.
	grace := int64(2)
	pod := corev1.PodSpec{Containers: []corev1.Container{container}, NodeSelector: c.cfg.AppNodeSelector, TerminationGracePeriodSeconds: &grace}
	if len(spec.Files) > 0 {
		pod.Volumes = []corev1.Volume{{Name: "files", VolumeSource: corev1.VolumeSource{
			ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "meshmark-files"}}}}}
		pod.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "files", MountPath: FilesDir, ReadOnly: true}}
	}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: dnsLabel(d.Service + "-" + d.Version), Labels: podLabels},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": d.Service, "version": d.Version}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: podLabels, Annotations: spec.PodAnnotations},
				Spec:       pod,
			},
		},
	}
}

// WaitReady waits until every Deployment of the app has all its replicas available,
// and every Gateway of the mesh's there is Programmed with its Deployment available,
// reporting progress as it changes: how many pods are ready of how many, and what some
// of the others wait for. It gives up at once, with the cluster's reason, when a pod
// cannot get ready without someone's help (StuckError: an image that cannot be pulled, a
// pod no node can take, a container that keeps crashing, with the end of its log, pods
// that admission refuses); and at the cluster's Timeout otherwise, saying which
// deployments and gateways are short and why their pods are not ready.
func (c *Cluster) WaitReady(ctx context.Context, app *App, progress func(WaitProgress)) error {
	deadline := time.Now().Add(c.cfg.Timeout)
	last := ""
	for {
		deps, err := c.client.AppsV1().Deployments(app.Namespace).List(ctx, metav1.ListOptions{LabelSelector: ManagedByLabel + "=" + ManagedBy})
		if err != nil {
			return fmt.Errorf("namespace %s: %w", app.Namespace, err)
		}
		total, ready := 0, 0
		var short []string
		for _, d := range deps.Items {
			if why := stuckDeployment(&d, time.Now()); why != "" {
				return &StuckError{Namespace: app.Namespace, Why: why}
			}
			have, want := available(&d)
			total += int(want)
			ready += int(min(have, want))
			if have < want {
				short = append(short, fmt.Sprintf("%s %d/%d", d.Name, have, want))
			}
		}
		gwReady, gwTotal, gwShort, err := c.gatewaysReady(ctx, app)
		if err != nil {
			return err
		}
		ready, total, short = ready+gwReady, total+gwTotal, append(short, gwShort...)
		stuck, pods, err := c.podsWait(ctx, app.Namespace, nil)
		if err != nil {
			return err
		}
		if stuck != "" {
			return &StuckError{Namespace: app.Namespace, Why: stuck}
		}
		p := WaitProgress{Ready: ready, Total: total, Waiting: pods.Waiting}
		if line := p.String(); line != last && progress != nil {
			progress(p)
			last = line
		}
		if len(short) == 0 && len(deps.Items) == len(app.Deployments) {
			// Ready pods are not yet reachable: a Service's endpoints follow them
			// a moment later, and the first requests would fail meanwhile.
			if short, err = c.unreachable(ctx, app); err != nil {
				return err
			}
			if len(short) == 0 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("namespace %s: not ready after %s (spec.substrate.kubernetes.readyTimeout): %s%s", app.Namespace, c.cfg.Timeout,
				strings.Join(short, ", "), c.whyPodsWait(ctx, app.Namespace, nil))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// unreachable lists the app's Services whose endpoints do not yet include every ready
// pod behind them.
func (c *Cluster) unreachable(ctx context.Context, app *App) ([]string, error) {
	var short []string
	want := maps.Clone(app.pods)
	maps.Copy(want, app.spread)
	for _, svc := range slices.Sorted(maps.Keys(want)) {
		slices, err := c.client.DiscoveryV1().EndpointSlices(app.Namespace).List(ctx,
			metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc})
		if err != nil {
			return nil, fmt.Errorf("namespace %s: service %s: %w", app.Namespace, svc, err)
		}
		ready := 0
		for _, s := range slices.Items {
			for _, e := range s.Endpoints {
				if e.Conditions.Ready != nil && *e.Conditions.Ready {
					ready++
				}
			}
		}
		if ready < want[svc] {
			short = append(short, fmt.Sprintf("service %s endpoints %d/%d", svc, ready, want[svc]))
		}
	}
	return short, nil
}

// Teardown deletes the mesh's Gateways there, then the app's namespace, and with it
// everything in it, and waits until it is gone.
func (c *Cluster) Teardown(ctx context.Context, app *App) error {
	if app == nil {
		return nil
	}
	if err := c.deleteGateways(ctx, app); err != nil {
		return err
	}
	return c.deleteNamespaces(ctx, []string{app.Namespace}, nil)
}

// deleteNamespaces deletes the namespaces and waits until the API server no longer has
// them, telling progress how many remain. The workload goes first, by its labels:
// Deployments, then their ReplicaSets, then the pods, so nothing is recreated. The
// namespace controller then finds the namespace empty and finishes in one pass, where
// emptying it itself retries with a growing back-off while pods terminate (over a
// minute, seen on the test cluster).
func (c *Cluster) deleteNamespaces(ctx context.Context, names []string, progress func(left int)) error {
	mine := metav1.ListOptions{LabelSelector: ManagedByLabel + "=" + ManagedBy}
	background := metav1.DeletePropagationBackground
	opts := metav1.DeleteOptions{PropagationPolicy: &background}
	// How long deleting takes is the cluster's business, not the study's readiness
	// budget: a short Timeout must not leave namespaces behind.
	limit := max(c.cfg.Timeout, deleteTimeout)
	deadline := time.Now().Add(limit)
	for _, n := range names {
		for _, step := range []struct {
			what string
			del  func() error
		}{
			{"deployments", func() error { return c.client.AppsV1().Deployments(n).DeleteCollection(ctx, opts, mine) }},
			{"replicasets", func() error { return c.client.AppsV1().ReplicaSets(n).DeleteCollection(ctx, opts, mine) }},
			{"pods", func() error { return c.client.CoreV1().Pods(n).DeleteCollection(ctx, opts, mine) }},
		} {
			if err := step.del(); err != nil && !IsNotFound(err) {
				return fmt.Errorf("namespace %s: delete %s: %w", n, step.what, err)
			}
		}
	}
	// Wait for the pods to be gone (within the same time limit as the whole), so that
	// the namespace controller has nothing to wait for.
	for _, n := range names {
		for time.Now().Before(deadline) {
			pods, err := c.client.CoreV1().Pods(n).List(ctx, mine)
			if err != nil || len(pods.Items) == 0 {
				break
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	for _, n := range names {
		err := c.client.CoreV1().Namespaces().Delete(ctx, n, metav1.DeleteOptions{})
		if err != nil && !IsNotFound(err) {
			return fmt.Errorf("delete namespace %s: %w", n, err)
		}
	}
	for {
		var left []string
		for _, n := range names {
			_, err := c.client.CoreV1().Namespaces().Get(ctx, n, metav1.GetOptions{})
			if err == nil {
				left = append(left, n)
			} else if !IsNotFound(err) {
				return fmt.Errorf("namespace %s: %w", n, err)
			}
		}
		if progress != nil {
			progress(len(left))
		}
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("namespaces still terminating after %s: %s%s", limit, strings.Join(left, ", "), c.whatHolds(ctx, left[0]))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// whatHolds is the namespace controller's own account of why a namespace is not gone
// yet: its conditions that hold.
func (c *Cluster) whatHolds(ctx context.Context, namespace string) string {
	ns, err := c.client.CoreV1().Namespaces().Get(ctx, namespace, metav1.GetOptions{})
	if err != nil {
		return ""
	}
	var why []string
	for _, cond := range ns.Status.Conditions {
		if cond.Status == corev1.ConditionTrue {
			why = append(why, cond.Message)
		}
	}
	if len(why) == 0 {
		return fmt.Sprintf(" (namespace %s: the cluster's namespace controller has not finished; is kube-controller-manager running?)", namespace)
	}
	return fmt.Sprintf(" (namespace %s: %s)", namespace, strings.Join(why, "; "))
}

func merge(a, b map[string]string) map[string]string {
	out := make(map[string]string, len(a)+len(b))
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

// injectorTimeout bounds the wait for a mesh's injector to answer (waitInjector), or
// the study's readyTimeout where that is shorter.
const injectorTimeout = 2 * time.Minute

// waitInjector waits until the mesh's injector adds sidecar to a pod of dep's template
// in namespace, asking the API server for a dry run of its creation, which passes
// through the admission webhooks as a real one does and creates nothing. A mesh's
// injector pods can be ready a moment before its webhook's Service reaches them, and
// Linkerd's webhook fails open: a pod created then starts without the proxy, and the
// enrollment check refuses the run (seen on a real cluster: every bookinfo pod up
// without linkerd-proxy, 1 s after the injector was ready).
func (c *Cluster) waitInjector(ctx context.Context, namespace string, dep *appsv1.Deployment, sidecar string) error {
	tmpl := dep.Spec.Template
	pod := &corev1.Pod{ObjectMeta: *tmpl.ObjectMeta.DeepCopy(), Spec: *tmpl.Spec.DeepCopy()}
	pod.GenerateName, pod.Namespace = dep.Name+"-", namespace
	limit := injectorTimeout
	if c.cfg.Timeout > 0 && c.cfg.Timeout < limit {
		limit = c.cfg.Timeout
	}
	deadline := time.Now().Add(limit)
	for {
		got, err := c.client.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil && hasSidecar(got.Spec, sidecar) {
			return nil
		}
		if time.Now().After(deadline) {
			why := "the pod came back without it: the injector's webhook did not answer or did not inject"
			if err != nil {
				why = err.Error()
			}
			return fmt.Errorf("namespace %s: the mesh's injector did not add %s to a dry run of %s's pod within %s: %s", namespace, sidecar, dep.Name, limit, why)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}
