package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"

	"github.com/meshmark/meshmark/internal/owner"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/releaseutil"
	authv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// ownerRecord is what OwnerAnnotation holds: the host, and the process as the local
// testbed records its owners (pid and start time, so that a reused pid is not taken
// for the run's).
func ownerRecord() string {
	host, _ := os.Hostname()
	o, err := owner.Current()
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
	o, err := owner.Parse([]byte(fields[1] + " " + fields[2]))
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

// CleanedNamespace is what Clean found for one namespace (or, named
// customresourcedefinition/NAME, for one CRD meshmark created for a chart).
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
	// A user who may not list and delete CRDs could not have had meshmark create any:
	// it asks for those rights before it installs a mesh.
	mayCRDs := c.checkRights(ctx, []authv1.ResourceAttributes{
		{Verb: "list", Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions"},
		{Verb: "delete", Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions"},
	}, "removing CRDs") == nil
	var report []CleanedNamespace
	var remove []string
	for _, ns := range list.Items {
		run := ns.Labels[RunLabel]
		if len(opts.Runs) > 0 && !slices.Contains(opts.Runs, run) {
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
	var errs []error
	// A killed install leaves cluster-scoped objects (roles, webhooks) that deleting its
	// namespace would not remove; its Helm release, kept in that namespace, lists them.
	for _, ns := range remove {
		errs = append(errs, c.uninstallReleases(ctx, ns))
	}
	if len(remove) > 0 {
		errs = append(errs, c.deleteNamespaces(ctx, remove, opts.Progress))
	}
	if (len(opts.Runs) == 0 || opts.All) && mayCRDs {
		crds, err := c.cleanCRDs(ctx, opts.All)
		report = append(report, crds...)
		errs = append(errs, err)
	}
	return report, errors.Join(errs...)
}

// uninstallReleases uninstalls every Helm release stored in the namespace.
func (c *Cluster) uninstallReleases(ctx context.Context, namespace string) error {
	cfg, err := c.helmConfig(namespace, io.Discard)
	if err != nil {
		return err
	}
	list := action.NewList(cfg)
	list.All = true
	list.SetStateMask() // without it, All selects no state at all
	releases, err := list.Run()
	if err != nil {
		return fmt.Errorf("namespace %s: list Helm releases: %w", namespace, err)
	}
	var errs []error
	for _, rel := range releases {
		un := action.NewUninstall(cfg)
		un.Wait, un.Timeout = true, c.cfg.Timeout
		if _, err := un.Run(rel.Name); err != nil {
			errs = append(errs, fmt.Errorf("namespace %s: uninstall %s: %w", namespace, rel.Name, err))
			continue
		}
		// Charts that template their CRDs mark them for Helm to keep (Istio's do); the
		// install created them, so they go with it, as Uninstall does.
		errs = append(errs, c.deleteCRDs(ctx, manifestCRDs(rel.Manifest)))
	}
	return errors.Join(errs...)
}

// manifestCRDs names the CustomResourceDefinitions in a release's manifest.
func manifestCRDs(manifest string) []string {
	var names []string
	for _, m := range releaseutil.SplitManifests(manifest) {
		var head struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(m), &head); err == nil && head.Kind == "CustomResourceDefinition" && head.Metadata.Name != "" {
			names = append(names, head.Metadata.Name)
		}
	}
	return names
}

// cleanCRDs deletes the CustomResourceDefinitions meshmark created for a chart whose
// owner is gone (every one with all).
func (c *Cluster) cleanCRDs(ctx context.Context, all bool) ([]CleanedNamespace, error) {
	list, err := c.crdClient().List(ctx, metav1.ListOptions{LabelSelector: ManagedByLabel + "=" + ManagedBy})
	if err != nil {
		return nil, fmt.Errorf("cluster %s: list CustomResourceDefinitions: %w", c.Server, err)
	}
	var report []CleanedNamespace
	var remove []string
	for _, crd := range list.Items {
		entry := CleanedNamespace{Name: "customresourcedefinition/" + crd.Name, Owner: crd.Annotations[OwnerAnnotation]}
		state, alive := ownerState(entry.Owner)
		if alive && !all {
			entry.Kept = state
		} else {
			entry.Removed = true
			remove = append(remove, crd.Name)
		}
		report = append(report, entry)
	}
	return report, c.deleteCRDs(ctx, remove)
}
