package kubetest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
)

// OnNewPods stands in for what a pod's containers would do once kwok has scheduled it:
// until the test ends it lists, every 100 ms, the pods of every namespace that match
// selector and calls handle with each it has not handled yet (a pod made anew under an
// old name is a new pod). handle returns done
// false to see the pod again on a later round (say, its Service does not exist yet);
// an error fails the test and ends the watch. Cleanups the caller registered before
// this call run after the watch has stopped, so they may release what handle made.
func (c *Cluster) OnNewPods(t testing.TB, selector string, handle func(ctx context.Context, p *corev1.Pod) (done bool, err error)) {
	t.Helper()
	client, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		handled := map[string]bool{}
		for ctx.Err() == nil {
			time.Sleep(100 * time.Millisecond)
			pods, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: selector})
			if err != nil {
				continue
			}
			for i := range pods.Items {
				p := &pods.Items[i]
				// By uid: a namespace made anew, as each bring-up of a mesh makes
				// its own, holds new pods under the old names.
				key := string(p.UID)
				if handled[key] {
					continue
				}
				done, err := handle(ctx, p)
				if err != nil {
					t.Error(err)
					return
				}
				handled[key] = done
			}
		}
	}()
}

// EndPod stands in for a pod's containers exiting, as a kubelet reports it: each
// container terminated with exitCode and message (its termination message), and the
// pod Succeeded (exit code 0) or Failed. kwok would otherwise keep the pod running for
// ever. Call it once kwok has marked the pod running, or kwok's own status may land
// after it.
func (c *Cluster) EndPod(ctx context.Context, namespace, name string, exitCode int32, message string) error {
	return c.updatePodStatus(ctx, namespace, name, func(p *corev1.Pod) {
		now := metav1.Now()
		p.Status.Phase = corev1.PodSucceeded
		if exitCode != 0 {
			p.Status.Phase = corev1.PodFailed
		}
		p.Status.ContainerStatuses = nil
		for _, ctr := range p.Spec.Containers {
			p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
				Name: ctr.Name, Image: ctr.Image,
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
					ExitCode: exitCode, Reason: map[bool]string{true: "Completed", false: "Error"}[exitCode == 0],
					Message: message, StartedAt: now, FinishedAt: now,
				}},
			})
		}
		for i := range p.Status.Conditions {
			if p.Status.Conditions[i].Type == corev1.PodReady || p.Status.Conditions[i].Type == corev1.ContainersReady {
				p.Status.Conditions[i].Status = corev1.ConditionFalse
			}
		}
	})
}

// PodWaits stands in for a kubelet that cannot start a pod's containers: each waits
// with reason and message (ImagePullBackOff, ...), and the pod stays Pending.
func (c *Cluster) PodWaits(ctx context.Context, namespace, name, reason, message string) error {
	return c.updatePodStatus(ctx, namespace, name, func(p *corev1.Pod) {
		p.Status.Phase = corev1.PodPending
		p.Status.ContainerStatuses = nil
		for _, ctr := range p.Spec.Containers {
			p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
				Name: ctr.Name, Image: ctr.Image,
				State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: message}},
			})
		}
	})
}

// CrashLoops stands in for a kubelet whose container keeps crashing: the pod's
// container waits in CrashLoopBackOff after restarts runs, the last of which exited with
// exitCode, and the container's previous log, which the API server's pods/log serves
// (through kwok's kubelet endpoint), is lastLog.
func (c *Cluster) CrashLoops(ctx context.Context, namespace, name, container string, restarts, exitCode int32, lastLog string) error {
	dir := filepath.Join(c.dir, "logs", namespace, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	// The CRI's log format, which kwok's kubelet endpoint reads.
	var b strings.Builder
	for _, line := range strings.Split(strings.TrimRight(lastLog, "\n"), "\n") {
		fmt.Fprintf(&b, "%s stderr F %s\n", time.Now().UTC().Format(time.RFC3339Nano), line)
	}
	previous, current := filepath.Join(dir, container+".previous.log"), filepath.Join(dir, container+".log")
	if err := os.WriteFile(previous, []byte(b.String()), 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(current, nil, 0o600); err != nil {
		return err
	}
	if err := c.createKwok(ctx, "logs", map[string]any{
		"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Logs",
		"metadata": map[string]any{"name": name, "namespace": namespace},
		"spec": map[string]any{"logs": []any{map[string]any{
			"containers": []any{container}, "logsFile": current, "previousLogsFile": previous,
		}}},
	}); err != nil {
		return err
	}
	return c.updatePodStatus(ctx, namespace, name, func(p *corev1.Pod) {
		now := metav1.Now()
		p.Status.Phase = corev1.PodRunning
		for i := range p.Status.ContainerStatuses {
			cs := &p.Status.ContainerStatuses[i]
			if cs.Name != container {
				continue
			}
			cs.Ready, cs.RestartCount = false, restarts
			cs.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
				Reason: "CrashLoopBackOff", Message: fmt.Sprintf("back-off 40s restarting failed container=%s pod=%s", container, name)}}
			cs.LastTerminationState = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: exitCode, Reason: "Error", StartedAt: now, FinishedAt: now}}
		}
		for i := range p.Status.Conditions {
			if p.Status.Conditions[i].Type == corev1.PodReady || p.Status.Conditions[i].Type == corev1.ContainersReady {
				p.Status.Conditions[i].Status = corev1.ConditionFalse
			}
		}
	})
}

// updatePodStatus writes a change to a pod's status, reading the pod anew when kwok
// wrote it in between.
func (c *Cluster) updatePodStatus(ctx context.Context, namespace, name string, change func(*corev1.Pod)) error {
	client, err := c.Client()
	if err != nil {
		return err
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		change(p)
		_, err = client.CoreV1().Pods(namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
		return err
	})
}
