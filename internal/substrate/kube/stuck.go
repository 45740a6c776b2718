package kube

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// A wait for pods gives up as soon as the cluster says a pod will not get ready without
// someone's help (an image that cannot be pulled, a pod no node can take, a container
// that keeps crashing, pods that admission refuses to create), with the reason in the
// cluster's words, rather than at its time limit.

// cannotStart are the reasons a kubelet gives for a container that will not start
// without someone's help, and what each means for a user.
var cannotStart = map[string]string{
	"ErrImagePull":               "the image cannot be pulled",
	"ImagePullBackOff":           "the image cannot be pulled",
	"InvalidImageName":           "the image name is invalid",
	"ErrImageNeverPull":          "the image is not on the node and its pull policy is Never",
	"CreateContainerConfigError": "its container cannot be configured",
	"CreateContainerError":       "its container cannot be created",
}

// unschedulableGrace is how long a pod may stay unschedulable before the wait gives up
// on it: long enough for a scheduler that has only just seen a node become ready, or the
// previous bring-up's pods leave, to try again; a node selector no node matches stays
// unschedulable for ever.
const unschedulableGrace = 10 * time.Second

// crashLogLines is how many of a crashing container's last log lines an error quotes.
const crashLogLines = 10

// WaitProgress is how far a wait for pods has come.
type WaitProgress struct {
	Ready, Total int
	// Waiting names some of the pods that are not ready yet, each with what it waits
	// for in the cluster's words (ContainerCreating, not scheduled: ...).
	Waiting []string
}

// String is the progress as a line: "3/5 pods ready (waiting: ...)".
func (p WaitProgress) String() string {
	s := fmt.Sprintf("%d/%d pods ready", p.Ready, p.Total)
	if len(p.Waiting) > 0 && p.Ready < p.Total {
		s += " (waiting: " + strings.Join(p.Waiting, ", ") + ")"
	}
	return s
}

// waitingShown bounds the pods a progress line names.
const waitingShown = 3

// StuckError is a wait that gave up early because the cluster said a pod (or a
// Deployment's pods) cannot get ready without someone's help.
type StuckError struct {
	Namespace string
	// Why is the cluster's account: the pod, its container and the reason.
	Why string
}

func (e *StuckError) Error() string {
	return fmt.Sprintf("namespace %s: %s", e.Namespace, e.Why)
}

// stuckPod says why a pod cannot get ready without someone's help, or "" when it may
// still. For a container that keeps crashing it quotes the end of its last run's log.
func (c *Cluster) stuckPod(ctx context.Context, p *corev1.Pod, now time.Time) string {
	if p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded {
		return ""
	}
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse && cond.Reason == corev1.PodReasonUnschedulable &&
			!cond.LastTransitionTime.IsZero() && now.Sub(cond.LastTransitionTime.Time) >= unschedulableGrace {
			return fmt.Sprintf("pod %s cannot be scheduled (for %s): %s", p.Name, now.Sub(cond.LastTransitionTime.Time).Round(time.Second), cond.Message)
		}
	}
	statuses := append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...)
	for _, cs := range statuses {
		w := cs.State.Waiting
		if w == nil {
			continue
		}
		if what, ok := cannotStart[w.Reason]; ok {
			image := cs.Image
			if image == "" {
				image = containerImage(p, cs.Name)
			}
			return fmt.Sprintf("pod %s cannot start: %s (container %s, image %s): %s", p.Name, what, cs.Name, image,
				strings.TrimSpace(w.Reason+" "+w.Message))
		}
		if w.Reason == "CrashLoopBackOff" {
			return fmt.Sprintf("pod %s: container %s keeps crashing (%d restarts)%s%s", p.Name, cs.Name, cs.RestartCount,
				lastEnd(cs.LastTerminationState.Terminated), c.lastLog(ctx, p, cs.Name))
		}
	}
	return ""
}

func containerImage(p *corev1.Pod, container string) string {
	for _, ctr := range append(append([]corev1.Container{}, p.Spec.InitContainers...), p.Spec.Containers...) {
		if ctr.Name == container {
			return ctr.Image
		}
	}
	return "?"
}

// lastEnd is how a container's last run ended: exit code, reason and message.
func lastEnd(t *corev1.ContainerStateTerminated) string {
	if t == nil {
		return ""
	}
	s := fmt.Sprintf("; its last run exited with code %d", t.ExitCode)
	if t.Reason != "" {
		s += " (" + t.Reason + ")"
	}
	if m := strings.TrimSpace(t.Message); m != "" {
		s += ": " + truncate(m, 400)
	}
	return s
}

// lastLog is the end of a container's previous run's log, through the API server
// (pods/log), as an indented block; or why it could not be read.
func (c *Cluster) lastLog(ctx context.Context, p *corev1.Pod, container string) string {
	raw, err := c.previousLog(ctx, p.Namespace, p.Name, container, crashLogLines, 4096)
	if err != nil {
		return fmt.Sprintf("; its log could not be read: %v", err)
	}
	text := strings.TrimRight(raw, "\n")
	if text == "" {
		return "; its last run logged nothing"
	}
	return fmt.Sprintf("; the last %d lines of its log:\n    %s", crashLogLines, strings.ReplaceAll(text, "\n", "\n    "))
}

// previousLog is the end of a container's previous run's log, through the API server
// (pods/log): at most its last lines, and of those at most limit bytes (the limit
// counts from the first line sent, so the lines are cut first).
func (c *Cluster) previousLog(ctx context.Context, namespace, pod, container string, lines, limit int64) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	raw, err := c.client.CoreV1().Pods(namespace).GetLogs(pod, &corev1.PodLogOptions{
		Container: container, Previous: true, TailLines: &lines, LimitBytes: &limit,
	}).DoRaw(ctx)
	return string(raw), err
}

// replicaFailureGrace is how long a Deployment may fail to create its pods for a reason
// other than a refusal (a mesh's injection webhook that does not answer yet) before the
// wait gives up on it; the controller retries meanwhile.
const replicaFailureGrace = 30 * time.Second

// stuckDeployment says why a Deployment cannot create its pods, in the controller's
// words, or "": at once when admission forbids them (a PodSecurity level, a quota), after
// replicaFailureGrace when creating them fails otherwise.
func stuckDeployment(d *appsv1.Deployment, now time.Time) string {
	for _, cond := range d.Status.Conditions {
		if cond.Type != appsv1.DeploymentReplicaFailure || cond.Status != corev1.ConditionTrue {
			continue
		}
		forbidden := strings.Contains(cond.Message, "forbidden") && !strings.Contains(cond.Message, "failed calling webhook")
		if forbidden || !cond.LastTransitionTime.IsZero() && now.Sub(cond.LastTransitionTime.Time) >= replicaFailureGrace {
			return fmt.Sprintf("deployment %s cannot create its pods: %s: %s", d.Name, cond.Reason, cond.Message)
		}
	}
	return ""
}

// podWaits is what a pod that is not ready waits for, in the cluster's words.
func podWaits(p *corev1.Pod) string {
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodScheduled && cond.Status != corev1.ConditionTrue {
			return "not scheduled: " + cond.Message
		}
	}
	statuses := append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...)
	for _, cs := range statuses {
		if w := cs.State.Waiting; w != nil && w.Reason != "" {
			return strings.TrimSpace(w.Reason + " " + w.Message)
		}
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.State.Running != nil && !cs.Ready {
			return "running, container " + cs.Name + " not ready"
		}
	}
	if p.Status.Phase == "" {
		return "no status yet"
	}
	return string(p.Status.Phase)
}

// podsWait looks at the namespace's pods, but those in exclude (the pods a namespace
// that is not meshmark's held before an install): whether one is stuck, and, for
// progress, how many are ready and what some of the others wait for.
func (c *Cluster) podsWait(ctx context.Context, namespace string, exclude map[types.UID]bool) (stuck string, p WaitProgress, err error) {
	pods, err := c.client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", p, fmt.Errorf("namespace %s: list pods: %w", namespace, err)
	}
	sort.Slice(pods.Items, func(i, j int) bool { return pods.Items[i].Name < pods.Items[j].Name })
	now := time.Now()
	for i := range pods.Items {
		pod := &pods.Items[i]
		if pod.DeletionTimestamp != nil || exclude[pod.UID] {
			continue
		}
		if stuck == "" {
			stuck = c.stuckPod(ctx, pod, now)
		}
		p.Total++
		if podReady(pod) {
			p.Ready++
		} else if len(p.Waiting) < waitingShown {
			p.Waiting = append(p.Waiting, pod.Name+": "+podWaits(pod))
		}
	}
	return stuck, p, nil
}

// existingUIDs are the pods, Deployments and DaemonSets a namespace holds now, to be
// left out of a wait for what an install adds to it.
func (c *Cluster) existingUIDs(ctx context.Context, namespace string) (map[types.UID]bool, error) {
	out := map[types.UID]bool{}
	pods, err := c.client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("namespace %s: list pods: %w", namespace, err)
	}
	for _, p := range pods.Items {
		out[p.UID] = true
	}
	deps, err := c.client.AppsV1().Deployments(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("namespace %s: list deployments: %w", namespace, err)
	}
	for _, d := range deps.Items {
		out[d.UID] = true
	}
	dss, err := c.client.AppsV1().DaemonSets(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("namespace %s: list daemonsets: %w", namespace, err)
	}
	for _, d := range dss.Items {
		out[d.UID] = true
	}
	return out, nil
}

// controllersStuck says why a Deployment or DaemonSet an install added to the namespace
// (all but exclude's) cannot create its pods: a Deployment's ReplicaFailure
// (stuckDeployment), a DaemonSet's FailedCreate events that admission forbade, in the
// controller's words; or "".
func (c *Cluster) controllersStuck(ctx context.Context, namespace string, exclude map[types.UID]bool) string {
	deps, err := c.client.AppsV1().Deployments(namespace).List(ctx, metav1.ListOptions{})
	if err == nil {
		for _, d := range deps.Items {
			if why := stuckDeployment(&d, time.Now()); why != "" && !exclude[d.UID] {
				return why
			}
		}
	}
	dss, err := c.client.AppsV1().DaemonSets(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return ""
	}
	for _, d := range dss.Items {
		if exclude[d.UID] || d.Status.DesiredNumberScheduled == 0 || d.Status.CurrentNumberScheduled >= d.Status.DesiredNumberScheduled {
			continue
		}
		events, err := c.client.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(d.UID) + ",reason=FailedCreate"})
		if err != nil {
			continue
		}
		for _, e := range events.Items {
			if strings.Contains(e.Message, "forbidden") && !strings.Contains(e.Message, "failed calling webhook") {
				return fmt.Sprintf("daemonset %s cannot create its pods: %s: %s", d.Name, e.Reason, e.Message)
			}
		}
	}
	return ""
}

// whyPodsWait finds the first reasons the namespace's pods, but those in exclude, give
// for not being ready.
func (c *Cluster) whyPodsWait(ctx context.Context, namespace string, exclude map[types.UID]bool) string {
	pods, err := c.client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return ""
	}
	seen := map[string]bool{}
	var reasons []string
	for _, p := range pods.Items {
		if podReady(&p) || exclude[p.UID] || p.DeletionTimestamp != nil {
			continue
		}
		why := podWaits(&p)
		if why != "" && !seen[why] {
			seen[why] = true
			reasons = append(reasons, fmt.Sprintf("pod %s: %s", p.Name, why))
		}
		if len(reasons) == 3 {
			break
		}
	}
	if len(reasons) == 0 {
		return ""
	}
	return "; " + strings.Join(reasons, "; ")
}

// truncate cuts s to at most n bytes on a character boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// placedWithin bounds how long daemonSetsPlaced waits for the DaemonSet controller to
// place a release's DaemonSets; it does so within a second of a change.
const placedWithin = 15 * time.Second

// daemonSetsPlaced waits until the DaemonSet controller has placed each DaemonSet of
// the release in namespace (those Helm's annotation gives to it, so that a namespace's
// other DaemonSets, kube-system's under Cilium, are left out), and fails with a
// StuckError for one it places on no node. Helm's wait counts such a DaemonSet ready,
// having no pod to wait for, yet a mesh whose node agent runs nowhere is without its
// node part: Istio's ztunnel then never gets ready, and the wait for it ends only at
// readyTimeout, naming ztunnel rather than the agent. A controller that does not
// answer within placedWithin leaves the decision to Helm's wait, which has been made.
func (c *Cluster) daemonSetsPlaced(ctx context.Context, namespace, release string) error {
	deadline := time.Now().Add(placedWithin)
	for {
		dss, err := c.client.AppsV1().DaemonSets(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return fmt.Errorf("namespace %s: list daemonsets: %w", namespace, err)
		}
		pending := false
		for _, d := range dss.Items {
			switch {
			case d.Annotations[helmReleaseAnnotation] != release || d.DeletionTimestamp != nil:
				// not the release's, or on its way out
			case d.Status.ObservedGeneration < d.Generation:
				pending = true
			case d.Status.DesiredNumberScheduled == 0:
				return &StuckError{Namespace: namespace, Why: fmt.Sprintf("daemonset %s runs on no node: its node selector, affinity and tolerations leave out %s",
					d.Name, c.clusterNodes(ctx))}
			}
		}
		if !pending || time.Now().After(deadline) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// helmReleaseAnnotation names the Helm release an object belongs to; Helm sets it on
// everything it installs.
const helmReleaseAnnotation = "meta.helm.sh/release-name"

// clusterNodes counts the cluster's nodes, for a message.
func (c *Cluster) clusterNodes(ctx context.Context) string {
	nodes, err := c.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return "the cluster's nodes"
	}
	if len(nodes.Items) == 1 {
		return "the cluster's one node"
	}
	return fmt.Sprintf("each of the cluster's %d nodes", len(nodes.Items))
}
