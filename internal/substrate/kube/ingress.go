package kube

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// IngressGateway is a plain gateway in front of an app's entry service, for a study's
// ingress path: one pod of an Envoy image running a bootstrap of the caller's, as the
// workload's user, so that the mesh enrolls it and intercepts its calls as it does the
// app's pods' (which is how Linkerd meshes an ingress controller), and a Service.
type IngressGateway struct {
	// Name names the gateway's Deployment, Service and ConfigMap.
	Name string
	// Image holds Envoy at Envoy.
	Image, Envoy string
	// Bootstrap is Envoy's whole configuration: listening on Port on every address.
	Bootstrap []byte
	Port      int
	// Protocol is the entry service's, which the gateway speaks downstream too.
	Protocol string
}

// roleGateway is the RoleLabel of the ingress gateway's pod: its containers are sampled
// as the gateway, a sidecar beside it as a sidecar.
const roleGateway = "gateway"

// createIngressGateway creates spec's gateway in app's namespace.
func (c *Cluster) createIngressGateway(ctx context.Context, app *App, spec AppSpec, labels map[string]string) error {
	g := spec.Ingress
	name := g.Name
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, BinaryData: map[string][]byte{"gateway.json": g.Bootstrap}}
	if _, err := c.client.CoreV1().ConfigMaps(app.Namespace).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("namespace %s: create the ingress gateway's configuration: %w", app.Namespace, err)
	}
	podLabels := merge(labels, map[string]string{"app": name, RoleLabel: roleGateway})
	replicas, grace := int32(1), int64(2)
	uid, nonRoot := int64(2000), true
	container := corev1.Container{
		Name:            "gateway",
		Image:           g.Image,
		ImagePullPolicy: corev1.PullIfNotPresent,
		Command: []string{g.Envoy, "-c", "/etc/gateway/gateway.json", "--concurrency", "2",
			"--disable-hot-restart", "--drain-time-s", "1", "--log-level", "warning"},
		Ports: []corev1.ContainerPort{{Name: "gateway", ContainerPort: int32(g.Port)}},
		// Envoy's admin is on the pod's loopback, out of the kubelet's reach: the
		// listener accepting is what the gateway's readiness can show.
		ReadinessProbe: &corev1.Probe{PeriodSeconds: 2, FailureThreshold: 3, ProbeHandler: corev1.ProbeHandler{
			TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(int32(g.Port))}}},
		VolumeMounts:    []corev1.VolumeMount{{Name: "config", MountPath: "/etc/gateway", ReadOnly: true}},
		SecurityContext: &corev1.SecurityContext{RunAsUser: &uid, RunAsNonRoot: &nonRoot},
	}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: podLabels},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name, RoleLabel: roleGateway}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: podLabels, Annotations: spec.PodAnnotations},
				Spec: corev1.PodSpec{
					Containers:   []corev1.Container{container},
					NodeSelector: c.cfg.AppNodeSelector,
					Volumes: []corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{
						ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: name}}}}},
					TerminationGracePeriodSeconds: &grace,
				},
			},
		},
	}
	if _, err := c.client.AppsV1().Deployments(app.Namespace).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("namespace %s: create deployment %s: %w", app.Namespace, name, err)
	}
	app.Deployments = append(app.Deployments, name)
	portName, appProtocol := portName(g.Protocol)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: merge(labels, map[string]string{"app": name})},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": name, RoleLabel: roleGateway},
			Ports: []corev1.ServicePort{{
				Name: portName, AppProtocol: &appProtocol, Port: int32(g.Port), TargetPort: intstr.FromInt32(int32(g.Port)),
			}},
		},
	}
	if _, err := c.client.CoreV1().Services(app.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("namespace %s: create service %s: %w", app.Namespace, name, err)
	}
	app.Services = append(app.Services, name)
	app.pods[name] = 1
	return nil
}

// IngressRoute attaches the app's entry service to a mesh's own ingress gateway
// (meshkube.IngressInstall): an HTTPRoute of the Gateway API sending every request the
// Gateway receives to the entry Service, as a user of the Gateway API routes an app.
type IngressRoute struct {
	// Gateway is the Gateway's name; Service and Port the entry Service's.
	Gateway, Service string
	Port             int
}

// object is r as the API object it is created as, in namespace.
func (r IngressRoute) object(namespace string, labels map[string]string) *unstructured.Unstructured {
	route := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": gatewayAPIGroup + "/v1",
		"kind":       "HTTPRoute",
		"metadata":   map[string]any{"name": r.Gateway},
		"spec": map[string]any{
			"parentRefs": []any{map[string]any{"name": r.Gateway}},
			"rules": []any{map[string]any{
				"backendRefs": []any{map[string]any{"name": r.Service, "port": int64(r.Port)}},
			}},
		},
	}}
	route.SetNamespace(namespace)
	route.SetLabels(labels)
	return route
}

// createIngressRoute creates r in the app's namespace, after its Gateway.
func (c *Cluster) createIngressRoute(ctx context.Context, app *App, r IngressRoute, labels map[string]string) error {
	if _, err := c.create(ctx, r.object(app.Namespace, labels)); err != nil {
		return fmt.Errorf("namespace %s: the ingress gateway's route: %w", app.Namespace, err)
	}
	return nil
}
