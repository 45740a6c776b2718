package kube

import (
	"context"
	"fmt"
	"slices"
	"sort"

	"github.com/meshmark/meshmark/internal/results"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Describe is the cluster as its API server describes it, for a run's provenance: the
// server's version and every node's kubelet, OS, kernel, container runtime,
// architecture and capacity.
func (c *Cluster) Describe(ctx context.Context) (*results.ClusterProvenance, error) {
	v, err := c.client.Discovery().ServerVersion()
	if err != nil {
		return nil, fmt.Errorf("cluster %s: server version: %w", c.Server, err)
	}
	nodes, err := c.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("cluster %s: list nodes: %w", c.Server, err)
	}
	out := &results.ClusterProvenance{Server: c.Server, Context: c.ContextName, ServerVersion: v.GitVersion}
	for _, n := range nodes.Items {
		info := n.Status.NodeInfo
		out.Nodes = append(out.Nodes, results.ClusterNode{
			Name: n.Name, KubeletVersion: info.KubeletVersion, OSImage: info.OSImage, KernelVersion: info.KernelVersion,
			ContainerRuntime: info.ContainerRuntimeVersion, Architecture: info.Architecture,
			CPU: quantity(n.Status.Capacity, corev1.ResourceCPU), Memory: quantity(n.Status.Capacity, corev1.ResourceMemory),
		})
	}
	sort.Slice(out.Nodes, func(i, j int) bool { return out.Nodes[i].Name < out.Nodes[j].Name })
	return out, nil
}

func quantity(l corev1.ResourceList, name corev1.ResourceName) string {
	if q, ok := l[name]; ok {
		return q.String()
	}
	return ""
}

// PodImages are the images the containers of the pods in namespaces ran, for mesh, each
// with the digest its node resolved it to (the container's imageID) and how many pods
// ran it: the provenance of what was measured, since a tag may move.
func (c *Cluster) PodImages(ctx context.Context, mesh string, namespaces ...string) ([]results.PodImage, error) {
	type key struct{ container, image, id string }
	count := map[key]int{}
	for _, ns := range namespaces {
		pods, err := c.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, fmt.Errorf("namespace %s: list pods: %w", ns, err)
		}
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil {
				continue
			}
			statuses := append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...)
			for _, cs := range statuses {
				image := containerImage(&p, cs.Name) // as the pod asked for it; the status may name it otherwise
				count[key{cs.Name, image, cs.ImageID}]++
			}
		}
	}
	var out []results.PodImage
	for k, n := range count {
		out = append(out, results.PodImage{Mesh: mesh, Container: k.container, Image: k.image, ImageID: k.id, Pods: n})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Container != out[j].Container {
			return out[i].Container < out[j].Container
		}
		return out[i].Image+out[i].ImageID < out[j].Image+out[j].ImageID
	})
	return out, nil
}

// OwnNamespaces are the namespaces meshmark created for the mesh's releases, whose pods
// are all the mesh's (not kube-system, which a mesh may share with the cluster's own).
func (mi *MeshInstall) OwnNamespaces() []string {
	if mi == nil {
		return nil
	}
	var out []string
	for _, r := range mi.Releases {
		if r.createdNamespace && !slices.Contains(out, r.Chart.Namespace) {
			out = append(out, r.Chart.Namespace)
		}
	}
	return out
}
