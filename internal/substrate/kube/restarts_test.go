package kube

import (
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/substrate"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Between two readings of a deployment's containers, what ended is what its kubelet
// started again (with how its last run ended, and when) and every container of a pod
// that is gone; a container that kept running, or a pod that is new, is not.
// (That a real kubelet's restart is seen is TestKilledSidecarIsAFaultOnBothPlatforms
// in the cli package, on the real cluster.)
func TestRestartsBetweenReadings(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	killed := t0.Add(2 * time.Second)
	reading := func(at time.Time, pods map[types.UID]podRuns) ContainerRuns { return ContainerRuns{At: at, pods: pods} }
	pod := func(name string, containers map[string]containerRun) podRuns {
		return podRuns{namespace: "mm-app", name: name, containers: containers}
	}
	before := reading(t0, map[types.UID]podRuns{
		"u1": pod("productpage-1", map[string]containerRun{
			"app":         {role: substrate.RoleWorkload, restarts: 0},
			"istio-proxy": {role: substrate.RoleSidecar, restarts: 1},
		}),
		"u2": pod("reviews-1", map[string]containerRun{"app": {role: substrate.RoleWorkload}}),
		"u3": pod("details-1", map[string]containerRun{"app": {role: substrate.RoleWorkload}}),
	})
	after := reading(t0.Add(5*time.Second), map[types.UID]podRuns{
		"u1": pod("productpage-1", map[string]containerRun{
			"app": {role: substrate.RoleWorkload, restarts: 1,
				last: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "Error", FinishedAt: metav1.NewTime(killed)}},
			"istio-proxy": {role: substrate.RoleSidecar, restarts: 1},
		}),
		"u3": pod("details-1", map[string]containerRun{"app": {role: substrate.RoleWorkload}}),
		"u4": pod("reviews-2", map[string]containerRun{"app": {role: substrate.RoleWorkload}}),
	})
	got := restartsBetween(before, after)
	want := []Restart{
		{Namespace: "mm-app", Pod: "productpage-1", Container: "app", Role: substrate.RoleWorkload, At: killed, Exit: "exit code 137 (Error), started again by its kubelet"},
		{Namespace: "mm-app", Pod: "reviews-1", Container: "app", Role: substrate.RoleWorkload, At: after.At, Exit: podGone},
	}
	if len(got) != len(want) {
		t.Fatalf("restarts %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("restart %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	if r := restartsBetween(after, after); len(r) != 0 {
		t.Errorf("a reading against itself: %+v, want nothing", r)
	}
}
