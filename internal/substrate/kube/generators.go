package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	"k8s.io/streaming/pkg/httpstream"
)

// Load generators run as pods of their own Deployment in the app's namespace, so that a
// mesh that enrolls the namespace enrolls them too: the load enters through the mesh's
// client-side proxy, as a real caller's would. Each listens on the pod's loopback only,
// where nothing in the cluster can reach it: the runner drives it through a port-forward,
// which the API server grants only to users allowed pods/portforward.
const (
	// GeneratorPort is where `meshmark-pod generator` listens inside its pod.
	GeneratorPort = 7070
	// RoleLabel tells the load generators' pods from the workload's.
	RoleLabel     = "meshmark.dev/role"
	roleGenerator = "loadgen"
	generatorName = "meshmark-loadgen"
)

// generatorDeployment is the Deployment of n load-generator pods, placed on the nodes of
// the load-generator node selector and spread over them.
func (c *Cluster) generatorDeployment(spec AppSpec, labels map[string]string, n int) *appsv1.Deployment {
	podLabels := merge(labels, map[string]string{RoleLabel: roleGenerator})
	replicas := int32(n)
	uid, nonRoot := int64(2000), true
	grace := int64(2)
	container := corev1.Container{
		Name:            "generator",
		Image:           c.cfg.Image,
		ImagePullPolicy: corev1.PullIfNotPresent,
		Args: []string{"generator", "--listen", "127.0.0.1:" + strconv.Itoa(GeneratorPort),
			"--allow-namespace", "$(POD_NAMESPACE)"},
		Env: append([]corev1.EnvVar{{Name: "POD_NAMESPACE", ValueFrom: &corev1.EnvVarSource{
			FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}}}, c.runnerEnv()...),
		SecurityContext: &corev1.SecurityContext{RunAsUser: &uid, RunAsNonRoot: &nonRoot},
	}
	spread := &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
		PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{
			Weight: 100,
			PodAffinityTerm: corev1.PodAffinityTerm{
				TopologyKey:   corev1.LabelHostname,
				LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{RoleLabel: roleGenerator}},
			},
		}},
	}}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: generatorName, Labels: podLabels},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{RoleLabel: roleGenerator}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: podLabels, Annotations: spec.PodAnnotations},
				Spec: corev1.PodSpec{
					Containers:                    []corev1.Container{container},
					NodeSelector:                  c.cfg.LoadgenNodeSelector,
					Affinity:                      spread,
					TerminationGracePeriodSeconds: &grace,
				},
			},
		},
	}
}

// Generator is one load-generator pod reached through a port-forward.
type Generator struct {
	Pod, Node string
	// Addr is the local host:port that leads to the generator in the pod.
	Addr string
}

// Forwards holds the port-forwards to an app's load generators open.
type Forwards struct {
	Generators []Generator
	stops      []chan struct{}
	errs       chan error
}

// Close ends every port-forward.
func (f *Forwards) Close() {
	for _, s := range f.stops {
		close(s)
	}
	f.stops = nil
}

// Err returns the first port-forward that broke since it opened, if any: a generator
// pod that was deleted or restarted ends its forward.
func (f *Forwards) Err() error {
	select {
	case err := <-f.errs:
		return err
	default:
		return nil
	}
}

// ForwardGenerators opens a port-forward through the API server to each running
// load-generator pod of the app, on a free local port, and returns their addresses.
func (c *Cluster) ForwardGenerators(ctx context.Context, app *App) (*Forwards, error) {
	pods, err := c.client.CoreV1().Pods(app.Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: RoleLabel + "=" + roleGenerator})
	if err != nil {
		return nil, fmt.Errorf("namespace %s: load generators: %w", app.Namespace, err)
	}
	var running []corev1.Pod
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			running = append(running, p)
		}
	}
	if len(running) == 0 || len(running) < app.generators {
		return nil, fmt.Errorf("namespace %s: %d of %d load-generator pods running", app.Namespace, len(running), app.generators)
	}
	sort.Slice(running, func(i, j int) bool { return running[i].Name < running[j].Name })
	f := &Forwards{errs: make(chan error, len(running))}
	for _, p := range running {
		addr, err := c.forward(ctx, f, p.Namespace, p.Name, GeneratorPort)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("namespace %s: port-forward to load generator %s: %w", app.Namespace, p.Name, err)
		}
		f.Generators = append(f.Generators, Generator{Pod: p.Name, Node: p.Spec.NodeName, Addr: addr})
	}
	return f, nil
}

// forward opens one port-forward to a pod's port, as kubectl port-forward does: over
// WebSockets where the API server speaks them, else over SPDY.
func (c *Cluster) forward(ctx context.Context, f *Forwards, namespace, pod string, port int) (string, error) {
	u := c.client.CoreV1().RESTClient().Post().Resource("pods").Namespace(namespace).Name(pod).SubResource("portforward").URL()
	transport, upgrader, err := spdy.RoundTripperFor(c.rest)
	if err != nil {
		return "", err
	}
	var dialer httpstream.Dialer = spdy.NewDialerForStreaming(upgrader, &http.Client{Transport: transport}, http.MethodPost, u)
	ws, err := portforward.NewSPDYOverWebsocketDialerForStreaming(u, c.rest)
	if err != nil {
		return "", err
	}
	dialer = portforward.NewFallbackDialerForStreaming(ws, dialer, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	stop, ready := make(chan struct{}), make(chan struct{})
	pf, err := portforward.NewOnAddressesForStreaming(dialer, []string{"127.0.0.1"}, []string{"0:" + strconv.Itoa(port)}, stop, ready, io.Discard, io.Discard)
	if err != nil {
		return "", err
	}
	done := make(chan error, 1)
	go func() { done <- pf.ForwardPorts() }()
	select {
	case <-ready:
	case err := <-done:
		if err == nil {
			err = errors.New("ended before it was ready")
		}
		return "", err
	case <-time.After(30 * time.Second):
		close(stop)
		return "", errors.New("not ready within 30s")
	case <-ctx.Done():
		close(stop)
		return "", ctx.Err()
	}
	f.stops = append(f.stops, stop)
	go func() {
		if err := <-done; err != nil {
			f.errs <- fmt.Errorf("port-forward to %s/%s: %w", namespace, pod, err)
		}
	}()
	ports, err := pf.GetPorts()
	if err != nil || len(ports) != 1 {
		return "", fmt.Errorf("local port: %v", err)
	}
	return "127.0.0.1:" + strconv.Itoa(int(ports[0].Local)), nil
}
