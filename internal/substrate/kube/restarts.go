package kube

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/meshmark/meshmark/internal/substrate"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// ContainerRuns is what a deployment's containers were at one moment: for each pod in a
// ResourceScope (its load generators left out, which are not the system under test),
// each container and how often its kubelet has started it again. Two of them tell
// whether a process of the system under test ended between them, which on a cluster is
// seen as a restart (the kubelet starts a container that exited again) or a pod gone.
type ContainerRuns struct {
	At   time.Time
	pods map[types.UID]podRuns
}

type podRuns struct {
	namespace, name string
	containers      map[string]containerRun
}

type containerRun struct {
	role     substrate.Role
	restarts int32
	// last is how its previous run ended, as its kubelet recorded it.
	last *corev1.ContainerStateTerminated
}

// Taken says whether r holds a reading.
func (r ContainerRuns) Taken() bool { return r.pods != nil }

// Restart is a container of the system under test that ended between two readings.
type Restart struct {
	Namespace, Pod, Container string
	Role                      substrate.Role
	// At is when it ended, to the second, as its kubelet recorded it; for a pod that is
	// gone, when its absence was seen.
	At time.Time
	// Exit is how it ended: "exit code 137 (Error), started again by its kubelet", or
	// "its pod is gone".
	Exit string
	// LogTail is the end of its log up to the restart, when it could be read.
	LogTail string
}

// ContainerRuns reads the containers of scope's pods.
func (c *Cluster) ContainerRuns(ctx context.Context, scope ResourceScope) (ContainerRuns, error) {
	out := ContainerRuns{At: time.Now(), pods: map[types.UID]podRuns{}}
	for _, ns := range scope.Namespaces() {
		pods, err := c.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return ContainerRuns{}, fmt.Errorf("listing the pods of namespace %s: %w", ns, err)
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			if p.DeletionTimestamp != nil {
				continue
			}
			pr := podRuns{namespace: p.Namespace, name: p.Name, containers: map[string]containerRun{}}
			for _, cs := range slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses) {
				role, ok := scope.RoleOf(p, cs.Name)
				if !ok || role == substrate.RoleLoadGen {
					continue
				}
				pr.containers[cs.Name] = containerRun{role: role, restarts: cs.RestartCount, last: cs.LastTerminationState.Terminated}
			}
			if len(pr.containers) > 0 {
				out.pods[p.UID] = pr
			}
		}
	}
	return out, nil
}

// RestartsBetween lists what of before ended by after: every container started again
// since, and every pod gone, each with how it ended and, for a restart, the end of its
// previous run's log.
func (c *Cluster) RestartsBetween(ctx context.Context, before, after ContainerRuns) []Restart {
	out := restartsBetween(before, after)
	for i := range out {
		if r := &out[i]; r.Exit != podGone {
			r.LogTail, _ = c.previousLog(ctx, r.Namespace, r.Pod, r.Container, 40, 4000)
		}
	}
	return out
}

const podGone = "its pod is gone"

// restartsBetween is RestartsBetween without the logs.
func restartsBetween(before, after ContainerRuns) []Restart {
	var out []Restart
	for uid, was := range before.pods {
		now, ok := after.pods[uid]
		for name, cr := range was.containers {
			r := Restart{Namespace: was.namespace, Pod: was.name, Container: name, Role: cr.role}
			switch cur, kept := now.containers[name]; {
			case !ok || !kept:
				r.At, r.Exit = after.At, podGone
			case cur.restarts > cr.restarts:
				r.At, r.Exit = after.At, fmt.Sprintf("started again by its kubelet (%d times)", cur.restarts-cr.restarts)
				if t := cur.last; t != nil {
					if !t.FinishedAt.IsZero() {
						r.At = t.FinishedAt.Time
					}
					r.Exit = fmt.Sprintf("exit code %d", t.ExitCode)
					if t.Reason != "" {
						r.Exit += " (" + t.Reason + ")"
					}
					r.Exit += ", started again by its kubelet"
					if n := cur.restarts - cr.restarts; n > 1 {
						r.Exit += fmt.Sprintf(" %d times", n)
					}
				}
			default:
				continue
			}
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b Restart) int {
		if c := a.At.Compare(b.At); c != 0 {
			return c
		}
		return strings.Compare(a.Pod+"/"+a.Container, b.Pod+"/"+b.Container)
	})
	return out
}
