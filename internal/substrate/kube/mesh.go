package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"
)

// MeshInstall is a mesh put on the cluster: its Helm releases and the configuration
// objects applied after them, removed in reverse order.
type MeshInstall struct {
	Releases []*Installed
	// Effort adds up what every release and manifest took.
	Effort  Effort
	applied []appliedObject
}

type appliedObject struct {
	ref       *meta.RESTMapping
	namespace string
	name      string
}

// InstallMesh installs the charts in order, each waited for (progress, when set, hears
// how many of each release's pods are ready), then applies the manifests (the mesh's
// configuration, labelled as meshmark's). A failure removes whatever was installed, so a
// failed install leaves nothing either.
func (c *Cluster) InstallMesh(ctx context.Context, charts []Chart, manifests []string, logw io.Writer, progress func(release string, p WaitProgress)) (mi *MeshInstall, err error) {
	if err := c.CheckInstallRights(ctx, manifests, nil, nil); err != nil {
		return nil, err
	}
	mi = &MeshInstall{Effort: Effort{Kinds: map[string]int{}}}
	defer func() {
		if err != nil {
			err = errors.Join(err, c.UninstallMesh(context.WithoutCancel(ctx), mi, logw))
			mi = nil
		}
	}()
	start := time.Now()
	for _, ch := range charts {
		var chartProgress func(WaitProgress)
		if progress != nil {
			chartProgress = func(p WaitProgress) { progress(ch.Release, p) }
		}
		inst, err := c.Install(ctx, ch, logw, chartProgress)
		if err != nil {
			return mi, err
		}
		mi.Releases = append(mi.Releases, inst)
		e := inst.Effort
		mi.Effort.Objects += e.Objects
		mi.Effort.Values += e.Values
		mi.Effort.CRDs = append(mi.Effort.CRDs, e.CRDs...)
		for k, n := range e.Kinds {
			mi.Effort.Kinds[k] += n
		}
	}
	for _, m := range manifests {
		if err := c.apply(ctx, mi, m); err != nil {
			return mi, err
		}
	}
	mi.Effort.Ready = time.Since(start)
	return mi, nil
}

// ReconfigureMesh changes an installed mesh to another configuration of the same
// charts in place: it deletes the objects applied for the old one, upgrades each release
// to its new values (Upgrade), and applies the new configuration. A mesh that is the
// cluster's pod network (Cilium) goes from one configuration to the next so, rather than
// be uninstalled between them, which leaves every node without a network (new pods
// cannot start; Cilium's own docs then have the node cleaned up) and drops the
// allocations its CRDs hold. The effort is the change's.
func (c *Cluster) ReconfigureMesh(ctx context.Context, mi *MeshInstall, charts []Chart, manifests []string, logw io.Writer, progress func(release string, p WaitProgress)) error {
	if len(charts) != len(mi.Releases) {
		return fmt.Errorf("reconfigure the mesh: %d charts for %d releases", len(charts), len(mi.Releases))
	}
	if err := c.CheckInstallRights(ctx, manifests, nil, nil); err != nil {
		return err
	}
	if err := c.deleteApplied(ctx, mi); err != nil {
		return err
	}
	start := time.Now()
	mi.Effort = Effort{Kinds: map[string]int{}}
	for i, ch := range charts {
		var chartProgress func(WaitProgress)
		if progress != nil {
			chartProgress = func(p WaitProgress) { progress(ch.Release, p) }
		}
		inst := mi.Releases[i]
		if err := c.Upgrade(ctx, inst, ch, logw, chartProgress); err != nil {
			return err
		}
		mi.Effort.Objects += inst.Effort.Objects
		mi.Effort.Values += inst.Effort.Values
		for k, n := range inst.Effort.Kinds {
			mi.Effort.Kinds[k] += n
		}
	}
	for _, m := range manifests {
		if err := c.apply(ctx, mi, m); err != nil {
			return err
		}
	}
	mi.Effort.Ready = time.Since(start)
	return nil
}

// deleteApplied deletes the objects applied for a mesh's configuration, newest first.
func (c *Cluster) deleteApplied(ctx context.Context, mi *MeshInstall) error {
	if len(mi.applied) == 0 {
		return nil
	}
	dyn, err := dynamic.NewForConfig(c.rest)
	if err != nil {
		return err
	}
	var errs []error
	for _, o := range slices.Backward(mi.applied) {
		err := dyn.Resource(o.ref.Resource).Namespace(o.namespace).Delete(ctx, o.name, metav1.DeleteOptions{})
		if err != nil && !IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete %s %s/%s: %w", o.ref.GroupVersionKind.Kind, o.namespace, o.name, err))
		}
	}
	mi.applied = nil
	return errors.Join(errs...)
}

// apply creates one manifest's object, labelled as meshmark's.
func (c *Cluster) apply(ctx context.Context, mi *MeshInstall, manifest string) error {
	var obj unstructured.Unstructured
	if err := yaml.Unmarshal([]byte(manifest), &obj.Object); err != nil {
		return fmt.Errorf("mesh configuration: %w", err)
	}
	labels := obj.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels[ManagedByLabel] = ManagedBy
	obj.SetLabels(labels)
	mapping, err := c.create(ctx, &obj)
	if err != nil {
		return err
	}
	mi.applied = append(mi.applied, appliedObject{ref: mapping, namespace: obj.GetNamespace(), name: obj.GetName()})
	mi.Effort.Objects++
	mi.Effort.Kinds[obj.GetKind()]++
	return nil
}

// create creates obj in the namespace it names and returns how its kind is addressed.
// A mesh's CRDs may have been added only just now, so the API server's discovery may
// not list them for a moment.
func (c *Cluster) create(ctx context.Context, obj *unstructured.Unstructured) (*meta.RESTMapping, error) {
	gvk := obj.GroupVersionKind()
	dyn, err := dynamic.NewForConfig(c.rest)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(c.client.Discovery()))
		mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err == nil {
			_, err = dyn.Resource(mapping.Resource).Namespace(obj.GetNamespace()).Create(ctx, obj, metav1.CreateOptions{})
			if err == nil {
				return mapping, nil
			}
		}
		// A mesh's validating webhook may not answer yet just after its install
		// (istiod's, while it starts): the API server then refuses every object of
		// its kinds for a moment.
		webhookNotUp := err != nil && strings.Contains(err.Error(), "failed calling webhook")
		if !meta.IsNoMatchError(err) && !webhookNotUp || time.Now().After(deadline) {
			return nil, fmt.Errorf("apply %s %s/%s: %w", gvk.Kind, obj.GetNamespace(), obj.GetName(), err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// UninstallMesh deletes the applied objects and uninstalls the releases, newest first.
func (c *Cluster) UninstallMesh(ctx context.Context, mi *MeshInstall, logw io.Writer) error {
	if mi == nil {
		return nil
	}
	var errs []error
	if err := c.deleteApplied(ctx, mi); err != nil {
		errs = append(errs, err)
	}
	for _, inst := range slices.Backward(mi.Releases) {
		if err := c.Uninstall(ctx, inst, logw); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// PodSidecar says whether one pod of an app carries a mesh's sidecar, and what the
// mesh wrote on it.
type PodSidecar struct {
	Pod, App    string
	Sidecar     bool
	Annotations map[string]string
	// Version is the pod's service version; Node its node, empty while it is not
	// scheduled; Generator says it is a load generator's, which serves no service.
	Version, Node string
	Generator     bool
}

// Sidecars reports, for every pod of the app (workload and load generators), whether
// the mesh put its sidecar container into it (as a container, or as a native sidecar:
// an init container that keeps running), with the pod's annotations. This is the mesh's
// own word that a pod is enrolled, as the cluster stores it.
func (c *Cluster) Sidecars(ctx context.Context, app *App, sidecar string) ([]PodSidecar, error) {
	pods, err := c.appPods(ctx, app)
	if err != nil {
		return nil, err
	}
	var out []PodSidecar
	for _, p := range pods {
		out = append(out, PodSidecar{Pod: p.Name, App: podApp(&p), Sidecar: sidecar != "" && hasSidecar(p.Spec, sidecar), Annotations: p.Annotations,
			Version: p.Labels["version"], Node: p.Spec.NodeName, Generator: p.Labels[RoleLabel] == roleGenerator})
	}
	return out, nil
}

// appPods lists the app's pods (workload and load generators) that are not going away,
// by name.
func (c *Cluster) appPods(ctx context.Context, app *App) ([]corev1.Pod, error) {
	list, err := c.client.CoreV1().Pods(app.Namespace).List(ctx, metav1.ListOptions{LabelSelector: ManagedByLabel + "=" + ManagedBy})
	if err != nil {
		return nil, fmt.Errorf("namespace %s: %w", app.Namespace, err)
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// podApp is the service a pod of the app serves, or the role of a pod that serves none
// (a load generator).
func podApp(p *corev1.Pod) string {
	if name := p.Labels["app"]; name != "" {
		return name
	}
	return p.Labels[RoleLabel]
}

func hasSidecar(spec corev1.PodSpec, name string) bool {
	for _, c := range spec.Containers {
		if c.Name == name {
			return true
		}
	}
	for _, c := range spec.InitContainers {
		if c.Name == name && c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			return true
		}
	}
	return false
}
