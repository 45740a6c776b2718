package kube

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/meshmark/meshmark/internal/testbed"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ownerRecord is what OwnerAnnotation holds: the host, and the process as the local
// testbed records its owners (pid and start time, so that a reused pid is not taken
// for the run's).
func ownerRecord() string {
	host, _ := os.Hostname()
	o, err := testbed.CurrentOwner()
	if err != nil {
		return fmt.Sprintf("%s %d 0", host, os.Getpid())
	}
	return host + " " + strings.TrimSpace(o.String())
}

// ownerState says whether a namespace's owner still runs: "alive", "dead", or why it
// cannot be told (another host, no record).
func ownerState(record string) (state string, alive bool) {
	host, _ := os.Hostname()
	fields := strings.Fields(record)
	if len(fields) != 3 {
		return "no owner record", false
	}
	if fields[0] != host {
		return "owned by a run on host " + fields[0], true
	}
	o, err := testbed.ParseOwner([]byte(fields[1] + " " + fields[2]))
	if err != nil {
		return "unreadable owner record", false
	}
	if o.Alive() {
		return fmt.Sprintf("owner pid %d is alive", o.PID), true
	}
	return fmt.Sprintf("owner pid %d is gone", o.PID), false
}

// CleanOptions select what Clean removes.
type CleanOptions struct {
	// All removes namespaces whose owner lives or runs on another host, too.
	All bool
	// Runs, when not empty, limits cleaning to these run ids.
	Runs []string
	// Progress, when set, hears how many namespaces are still terminating.
	Progress func(left int)
}

// CleanedNamespace is what Clean found for one namespace.
type CleanedNamespace struct {
	Name, Run, Owner string
	Removed          bool
	// Kept says why a namespace was left alone.
	Kept string
}

// Clean removes the namespaces meshmark labelled whose owner process is gone (or every
// one with All), and waits until the cluster has deleted them. Namespaces without
// ManagedByLabel are never looked at.
func (c *Cluster) Clean(ctx context.Context, opts CleanOptions) ([]CleanedNamespace, error) {
	list, err := c.client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: ManagedByLabel + "=" + ManagedBy})
	if err != nil {
		return nil, fmt.Errorf("cluster %s: list namespaces: %w", c.Server, err)
	}
	sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
	var report []CleanedNamespace
	var remove []string
	for _, ns := range list.Items {
		run := ns.Labels[RunLabel]
		if len(opts.Runs) > 0 && !contains(opts.Runs, run) {
			continue
		}
		entry := CleanedNamespace{Name: ns.Name, Run: run, Owner: ns.Annotations[OwnerAnnotation]}
		state, alive := ownerState(entry.Owner)
		switch {
		case ns.Status.Phase == corev1.NamespaceTerminating && ns.DeletionTimestamp != nil:
			entry.Removed = true // already on its way out; wait for it with the rest
		case alive && !opts.All:
			entry.Kept = state
		default:
			entry.Removed = true
		}
		if entry.Removed {
			remove = append(remove, ns.Name)
		}
		report = append(report, entry)
	}
	if len(remove) == 0 {
		return report, nil
	}
	return report, c.deleteNamespaces(ctx, remove, opts.Progress)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
