package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	"github.com/meshmark/meshmark/internal/mesh/meshprobe"
	"github.com/meshmark/meshmark/internal/substrate/kube/plaintextprobe"
	"github.com/meshmark/meshmark/internal/workload"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Under strict mTLS a mesh must refuse a caller that has no mesh identity. On a
// cluster that caller is a probe pod meshmark starts in a namespace of its own, which
// every mesh meshmark installs is told, in its own words, to leave alone. The pod runs
// the meshmark image (`meshmark-pod plaintext-probe`), sends one plaintext request to each
// service of the app by its cluster name, and reports how each ended in its container's
// termination message, which the runner reads from the pod's status: through the API
// server only, as everything else a run reads, since the runner may not reach pod
// addresses.
const (
	// PlaintextProbeCommand is the subcommand a probe pod runs (`meshmark-pod
	// plaintext-probe`, package plaintextprobe).
	PlaintextProbeCommand = plaintextprobe.Command
	// TerminationMessagePath is where a probe pod's container writes its report: the
	// kubelet copies it into the pod's status when the container ends.
	TerminationMessagePath = plaintextprobe.MessagePath
	// TerminationMessageLimit is the most of a container's termination message the
	// kubelet keeps.
	TerminationMessageLimit = plaintextprobe.MessageLimit

	// PlaintextProbeRole is the probe pods' RoleLabel.
	PlaintextProbeRole = "plaintext-probe"
	// PlaintextControlService is the positive control's Service in the probe's
	// namespace: a meshmark service outside the mesh, which every probe pod calls as it
	// calls the app's services, and which must answer for the pod's refusals to count.
	PlaintextControlService = "meshmark-plaintext-control"
	// plaintextControlRole is the control pod's RoleLabel.
	plaintextControlRole = "plaintext-control"
	// plaintextControlPort is where the control serves.
	plaintextControlPort = 9080
	// servicesPerProbe keeps one probe pod's report within TerminationMessageLimit:
	// a graph of many services is shared out among several probe pods.
	servicesPerProbe = 16
	// DefaultPlaintextProbeTimeout bounds the wait for the probe pods to finish: they
	// must be scheduled, start (the image is already on the nodes that ran the app's
	// pods) and send one request per service.
	DefaultPlaintextProbeTimeout = 2 * time.Minute
)

// PlaintextCheck says which mesh's app ProbePlaintext calls, and how the mesh shows a
// pod it took in, which the probe pod must not show.
type PlaintextCheck struct {
	Run, Mesh string
	// Sidecar and EnrolledAnnotations are the mesh's marks on a pod it enrolled
	// (meshkube.KubernetesInstall's): a probe pod that carries one would call with a mesh
	// identity, and the check would prove nothing.
	Sidecar             string
	EnrolledAnnotations map[string]string
	// Outside are the labels and annotations that tell each mesh to leave the probe's
	// namespace and pods out of it: every known mesh's (mesh.KnownClusterMarks), not
	// only the one under test's, which keeps the probe outside even of a mesh that
	// enrolls namespaces by default.
	Outside meshkube.OptOut
	// Timeout bounds the wait for the probe pods to finish; default
	// DefaultPlaintextProbeTimeout.
	Timeout time.Duration
}

// PlaintextResult is what ProbePlaintext found.
type PlaintextResult struct {
	// Namespace is where the probe pods ran; it is deleted before ProbePlaintext
	// returns.
	Namespace string
	// Pods are the probe pods.
	Pods []string
	// Probes is how the request to each service ended, in the order of the services.
	Probes []meshprobe.PlaintextProbe
	// Control is how each probe pod's request to the positive control ended (served:
	// the pod reached a plaintext service, so its refusals count).
	Control []meshprobe.PlaintextProbe
}

// ProbePlaintext calls every service of the app in plaintext from pods outside the
// mesh, one request each, and returns how each ended. It creates a namespace of its
// own (labelled and annotated as the app's, so that `meshmark clean --kubernetes`
// finds it after a kill) and deletes it before it returns, after an error too. An
// error with no Probes means the probe could not run or report (a pod that did not
// finish within the time limit, could not pull its image, failed, or was taken into the
// mesh), never that a service answered; with Probes, every service was probed and only
// removing the namespace failed.
func (c *Cluster) ProbePlaintext(ctx context.Context, app *App, spec PlaintextCheck) (res PlaintextResult, err error) {
	if spec.Timeout == 0 {
		spec.Timeout = DefaultPlaintextProbeTimeout
	}
	targets, err := c.plaintextTargets(ctx, app)
	if err != nil {
		return res, err
	}
	if len(targets) == 0 {
		return res, fmt.Errorf("namespace %s: no Service to probe", app.Namespace)
	}
	res.Namespace = probeNamespace(app.Namespace)
	labels := map[string]string{ManagedByLabel: ManagedBy, RunLabel: dnsLabel(spec.Run), MeshLabel: dnsLabel(spec.Mesh)}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name:        res.Namespace,
		Labels:      merge(labels, spec.Outside.NamespaceLabels),
		Annotations: merge(spec.Outside.NamespaceAnnotations, map[string]string{OwnerAnnotation: ownerRecord()}),
	}}
	if _, err := c.client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		return res, fmt.Errorf("create the plaintext probe's namespace %s: %w", res.Namespace, err)
	}
	defer func() {
		// An interrupted check removes its namespace too.
		if derr := c.deleteNamespaces(context.WithoutCancel(ctx), []string{res.Namespace}, nil); derr != nil {
			err = errors.Join(err, fmt.Errorf("removing the plaintext probe's namespace: %w", derr))
		}
	}()
	// The positive control first: the same request, from the same pod, to a service
	// outside the mesh that must answer. A probe that cannot reach anything (cluster DNS
	// down, no route) would see every service "refuse".
	control, err := c.startPlaintextControl(ctx, res.Namespace, labels, spec.Outside, spec.Timeout)
	if err != nil {
		return res, err
	}
	byPod := map[string][]meshprobe.PlaintextTarget{}
	for i := 0; i < len(targets); i += servicesPerProbe {
		batch := slices.Clone(targets[i:min(i+servicesPerProbe, len(targets))])
		pod := c.probePod(fmt.Sprintf("meshmark-plaintext-probe-%d", i/servicesPerProbe), labels, spec.Outside, batch, control, spec.Timeout)
		// The pod reports the control last.
		batch = append(batch, control)
		if _, err := c.client.CoreV1().Pods(res.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return res, fmt.Errorf("namespace %s: create pod %s: %w", res.Namespace, pod.Name, err)
		}
		res.Pods = append(res.Pods, pod.Name)
		byPod[pod.Name] = batch
	}
	finished, err := c.waitProbes(ctx, res.Namespace, res.Pods, spec.Timeout)
	if err != nil {
		return res, err
	}
	var all []meshprobe.PlaintextProbe
	for _, name := range res.Pods {
		p := finished[name]
		if err := outsideTheMesh(p, spec); err != nil {
			return res, err
		}
		probes, err := probeReport(p, byPod[name])
		if err != nil {
			return res, err
		}
		ctl := probes[len(probes)-1]
		if ctl.Refused {
			return res, fmt.Errorf("namespace %s: probe pod %s could not reach the positive control, a plaintext service outside the mesh (%s): %s; so the services' refusals it saw are no evidence (is the cluster's DNS answering?)",
				res.Namespace, name, ctl.Target, ctl.Observed)
		}
		res.Control = append(res.Control, ctl)
		all = append(all, probes[:len(probes)-1]...)
	}
	res.Probes = all
	return res, nil
}

// startPlaintextControl starts the positive control in the probe's namespace, which
// opts out of every mesh: a pod running `meshmark service` (chain-1's one service)
// behind the Service PlaintextControlService, and waits until the Service's endpoints
// list it. It returns the control as a probe target.
func (c *Cluster) startPlaintextControl(ctx context.Context, namespace string, labels map[string]string, outside meshkube.OptOut, limit time.Duration) (meshprobe.PlaintextTarget, error) {
	target := meshprobe.PlaintextTarget{Service: PlaintextControlService, Protocol: "http",
		Addr: net.JoinHostPort(fmt.Sprintf("%s.%s.svc.cluster.local", PlaintextControlService, namespace), strconv.Itoa(plaintextControlPort))}
	podLabels := merge(merge(labels, outside.PodLabels), map[string]string{RoleLabel: plaintextControlRole})
	uid, nonRoot, noToken := int64(2000), true, false
	grace := int64(2)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: PlaintextControlService, Labels: podLabels, Annotations: maps.Clone(outside.PodAnnotations)},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name: "control", Image: c.cfg.Image, ImagePullPolicy: corev1.PullIfNotPresent,
				Args: []string{"service", "--graph", "chain-1", "--service", "svc-0", "--pod", PlaintextControlService,
					"--listen", ":" + strconv.Itoa(plaintextControlPort)},
				Env:   c.runnerEnv(),
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: plaintextControlPort}},
				ReadinessProbe: &corev1.Probe{PeriodSeconds: 1, ProbeHandler: corev1.ProbeHandler{
					HTTPGet: &corev1.HTTPGetAction{Path: workload.HealthPath, Port: intstr.FromInt32(plaintextControlPort)}}},
				SecurityContext: &corev1.SecurityContext{RunAsUser: &uid, RunAsNonRoot: &nonRoot},
			}},
			NodeSelector:                  c.cfg.LoadgenNodeSelector,
			AutomountServiceAccountToken:  &noToken,
			TerminationGracePeriodSeconds: &grace,
		},
	}
	if _, err := c.client.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return target, fmt.Errorf("namespace %s: create the positive control's pod: %w", namespace, err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: PlaintextControlService, Labels: labels},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{RoleLabel: plaintextControlRole},
			Ports:    []corev1.ServicePort{{Name: "http", Port: plaintextControlPort, TargetPort: intstr.FromInt32(plaintextControlPort)}},
		},
	}
	if _, err := c.client.CoreV1().Services(namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return target, fmt.Errorf("namespace %s: create the positive control's service: %w", namespace, err)
	}
	deadline := time.Now().Add(limit)
	for {
		p, err := c.client.CoreV1().Pods(namespace).Get(ctx, PlaintextControlService, metav1.GetOptions{})
		if err != nil {
			return target, fmt.Errorf("namespace %s: the positive control's pod: %w", namespace, err)
		}
		if stuck := c.stuckPod(ctx, p, time.Now()); stuck != "" {
			return target, fmt.Errorf("namespace %s: the plaintext probe's positive control: %s", namespace, stuck)
		}
		app := &App{Namespace: namespace, pods: map[string]int{PlaintextControlService: 1}}
		short, err := c.unreachable(ctx, app)
		if err != nil {
			return target, err
		}
		if podReady(p) && len(short) == 0 {
			return target, nil
		}
		if time.Now().After(deadline) {
			return target, fmt.Errorf("namespace %s: the plaintext probe's positive control not ready within %s: %s", namespace, limit, podWaits(p))
		}
		select {
		case <-ctx.Done():
			return target, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// probeNamespace is the namespace of an app's plaintext probe: the app's, shortened
// where needed so that the suffix survives the 63 characters of a label.
func probeNamespace(appNamespace string) string {
	const suffix = "-probe"
	base := appNamespace
	if len(base) > 63-len(suffix) {
		base = strings.TrimRight(base[:63-len(suffix)], "-")
	}
	return base + suffix
}

// plaintextTargets are the app's Services, each by its cluster name and port and in
// the protocol its port is named for.
func (c *Cluster) plaintextTargets(ctx context.Context, app *App) ([]meshprobe.PlaintextTarget, error) {
	svcs, err := c.client.CoreV1().Services(app.Namespace).List(ctx, metav1.ListOptions{LabelSelector: ManagedByLabel + "=" + ManagedBy})
	if err != nil {
		return nil, fmt.Errorf("namespace %s: list services: %w", app.Namespace, err)
	}
	sort.Slice(svcs.Items, func(i, j int) bool { return svcs.Items[i].Name < svcs.Items[j].Name })
	var out []meshprobe.PlaintextTarget
	for _, s := range svcs.Items {
		if len(s.Spec.Ports) == 0 || s.Labels[RoleLabel] == spreadRole {
			continue // a version's headless Service is not a service of the graph
		}
		port := s.Spec.Ports[0]
		protocol := "http"
		if port.AppProtocol != nil {
			switch *port.AppProtocol {
			case "grpc":
				protocol = "grpc"
			case "kubernetes.io/h2c":
				protocol = "h2c"
			}
		}
		host := fmt.Sprintf("%s.%s.svc.cluster.local", s.Name, app.Namespace)
		out = append(out, meshprobe.PlaintextTarget{Service: s.Name, Addr: net.JoinHostPort(host, strconv.Itoa(int(port.Port))), Protocol: protocol})
	}
	return out, nil
}

// FormatPlaintextTarget and ParsePlaintextTarget write and read a probe pod's
// --target arguments (package plaintextprobe).
var (
	FormatPlaintextTarget = plaintextprobe.FormatTarget
	ParsePlaintextTarget  = plaintextprobe.ParseTarget
)

// probePod is a probe pod for targets: the meshmark image, run once, on the
// load-generator nodes (callers from outside run there, and the image is already
// there), with no service account token (it needs no access to the API).
func (c *Cluster) probePod(name string, labels map[string]string, outside meshkube.OptOut, targets []meshprobe.PlaintextTarget, control meshprobe.PlaintextTarget, limit time.Duration) *corev1.Pod {
	args := []string{PlaintextProbeCommand, "--message-file", TerminationMessagePath, "--control", FormatPlaintextTarget(control)}
	for _, t := range targets {
		args = append(args, "--target", FormatPlaintextTarget(t))
	}
	uid, nonRoot, noToken := int64(2000), true, false
	grace := int64(2)
	// The pod ends on its own within seconds; the cluster stops it at the check's time
	// limit even if meshmark is killed before it deletes the namespace.
	deadline := int64(max(limit, time.Second) / time.Second)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Labels:      merge(merge(labels, outside.PodLabels), map[string]string{RoleLabel: PlaintextProbeRole}),
			Annotations: maps.Clone(outside.PodAnnotations),
		},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name:            "probe",
				Image:           c.cfg.Image,
				ImagePullPolicy: corev1.PullIfNotPresent,
				Args:            args,
				Env:             c.runnerEnv(),
				// A process that dies before it writes its report leaves the end of
				// its log as the message: the error says why.
				TerminationMessagePath:   TerminationMessagePath,
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
				SecurityContext:          &corev1.SecurityContext{RunAsUser: &uid, RunAsNonRoot: &nonRoot},
			}},
			RestartPolicy:                 corev1.RestartPolicyNever,
			NodeSelector:                  c.cfg.LoadgenNodeSelector,
			AutomountServiceAccountToken:  &noToken,
			TerminationGracePeriodSeconds: &grace,
			ActiveDeadlineSeconds:         &deadline,
		},
	}
}

// waitProbes waits until every probe pod has ended, and returns them. A pod that cannot
// start, fails, or has not ended within limit is an error that says which and why.
func (c *Cluster) waitProbes(ctx context.Context, namespace string, names []string, limit time.Duration) (map[string]*corev1.Pod, error) {
	deadline := time.Now().Add(limit)
	for {
		list, err := c.client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: RoleLabel + "=" + PlaintextProbeRole})
		if err != nil {
			return nil, fmt.Errorf("namespace %s: list probe pods: %w", namespace, err)
		}
		byName := map[string]*corev1.Pod{}
		for i := range list.Items {
			byName[list.Items[i].Name] = &list.Items[i]
		}
		var waiting []string
		for _, name := range names {
			p := byName[name]
			if p == nil {
				return nil, fmt.Errorf("namespace %s: probe pod %s is gone", namespace, name)
			}
			switch p.Status.Phase {
			case corev1.PodSucceeded:
				continue
			case corev1.PodFailed:
				return nil, fmt.Errorf("namespace %s: probe pod %s failed: %s", namespace, name, describeEnd(p))
			}
			if stuck := c.stuckPod(ctx, p, time.Now()); stuck != "" {
				return nil, fmt.Errorf("namespace %s: probe %s", namespace, stuck)
			}
			waiting = append(waiting, fmt.Sprintf("pod %s: %s", name, probeWaits(p)))
		}
		if len(waiting) == 0 {
			return byName, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("namespace %s: the plaintext probe did not finish within %s: %s", namespace, limit, strings.Join(waiting, "; "))
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// probeWaits is what a probe pod that has not ended is doing, in the cluster's words.
func probeWaits(p *corev1.Pod) string {
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodScheduled && cond.Status != corev1.ConditionTrue {
			return "not scheduled: " + cond.Message
		}
	}
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil && w.Reason != "" {
			return strings.TrimSpace(w.Reason + " " + w.Message)
		}
		if cs.State.Running != nil {
			return "still running, its requests unanswered"
		}
	}
	if p.Status.Phase == "" {
		return "no status yet"
	}
	return string(p.Status.Phase)
}

// describeEnd is how a failed probe pod ended: its container's exit code, reason and
// message, or the pod's own reason (DeadlineExceeded, Evicted).
func describeEnd(p *corev1.Pod) string {
	for _, cs := range p.Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil {
			s := fmt.Sprintf("exit code %d", t.ExitCode)
			if t.Reason != "" {
				s += " (" + t.Reason + ")"
			}
			if m := strings.TrimSpace(t.Message); m != "" {
				s += ": " + m
			}
			return s
		}
	}
	return strings.TrimSpace(p.Status.Reason + " " + p.Status.Message)
}

// outsideTheMesh refuses a probe pod that the mesh took in despite its opt-outs.
func outsideTheMesh(p *corev1.Pod, spec PlaintextCheck) error {
	var marks []string
	if spec.Sidecar != "" && hasSidecar(p.Spec, spec.Sidecar) {
		marks = append(marks, "carries "+spec.Sidecar)
	}
	for _, k := range slices.Sorted(maps.Keys(spec.EnrolledAnnotations)) {
		if v := spec.EnrolledAnnotations[k]; v != "" && p.Annotations[k] == v {
			marks = append(marks, fmt.Sprintf("is marked %s=%s", k, v))
		}
	}
	if len(marks) == 0 {
		return nil
	}
	return fmt.Errorf("namespace %s: probe pod %s %s: the mesh took it in despite its opt-outs, so its requests did not come from outside the mesh", p.Namespace, p.Name, strings.Join(marks, " and "))
}

// probeReport reads a finished probe pod's report from its container's termination
// message and checks that it accounts for every target the pod was given.
func probeReport(p *corev1.Pod, targets []meshprobe.PlaintextTarget) ([]meshprobe.PlaintextProbe, error) {
	var msg string
	for _, cs := range p.Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil {
			msg = t.Message
		}
	}
	if msg == "" {
		return nil, fmt.Errorf("namespace %s: probe pod %s ended without a report (no termination message): was the image built from a meshmark without `%s`?", p.Namespace, p.Name, PlaintextProbeCommand)
	}
	var got []meshprobe.PlaintextProbe
	if err := json.Unmarshal([]byte(msg), &got); err != nil {
		return nil, fmt.Errorf("namespace %s: probe pod %s: unreadable report %.200q: %w", p.Namespace, p.Name, msg, err)
	}
	byService := map[string]meshprobe.PlaintextProbe{}
	for _, g := range got {
		byService[g.Service] = g
	}
	out := make([]meshprobe.PlaintextProbe, 0, len(targets))
	var missing []string
	for _, t := range targets {
		g, ok := byService[t.Service]
		if !ok {
			missing = append(missing, t.Service)
			continue
		}
		g.Target = fmt.Sprintf("%s (%s)", t.Addr, t.Protocol)
		out = append(out, g)
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("namespace %s: probe pod %s reported nothing for service %s", p.Namespace, p.Name, strings.Join(missing, ", "))
	}
	return out, nil
}

// RunPlaintextProbe is what a probe pod does (package plaintextprobe, which the pod's
// small binary links without Kubernetes' packages).
var RunPlaintextProbe = plaintextprobe.Run

// plaintextReport is the report a probe pod writes (plaintextprobe.Report).
var plaintextReport = plaintextprobe.Report
