package kubetest

import (
	"fmt"

	kwokresource "sigs.k8s.io/kwok/kustomize/metrics/resource"
	"sigs.k8s.io/yaml"
)

// UsageAnnotation starts the pod annotations that tell kwok a container's usage: kwok
// reports, at the node's /metrics/resource, what the test told it, not what anything
// used. UsageAnnotations writes them.
const UsageAnnotation = "kubetest.meshmark.dev/"

// DefaultCPU and DefaultMemory are the usage of a container no annotation speaks for:
// kwok's own defaults.
const (
	DefaultCPU    = "1m"
	DefaultMemory = "1Mi"
)

// UsageAnnotations are the annotations by which a pod's container named container uses
// cpu cores (a quantity: "250m") and memory bytes of working set ("64Mi"), as kwok
// reports them: CPU time grows by cpu every second between two reads of the endpoint.
func UsageAnnotations(container, cpu, memory string) map[string]string {
	return map[string]string{
		UsageAnnotation + "cpu." + container:    cpu,
		UsageAnnotation + "memory." + container: memory,
	}
}

// containerUsage is kwok's ClusterResourceUsage giving each container the usage its
// pod's annotations state for it by name. kwok's own (kustomize/metrics/usage) reads one
// annotation per pod, which would give a sidecar the same usage as the application
// beside it, and a test could not tell them apart.
var containerUsage = fmt.Sprintf(`apiVersion: kwok.x-k8s.io/v1alpha1
kind: ClusterResourceUsage
metadata:
  name: usage-by-container-annotation
spec:
  usages:
  - usage:
      cpu:
        expression: |
          ("%[1]scpu." + container.name) in pod.metadata.annotations
          ? Quantity(pod.metadata.annotations["%[1]scpu." + container.name])
          : Quantity("%[2]s")
      memory:
        expression: |
          ("%[1]smemory." + container.name) in pod.metadata.annotations
          ? Quantity(pod.metadata.annotations["%[1]smemory." + container.name])
          : Quantity("%[3]s")
`, UsageAnnotation, DefaultCPU, DefaultMemory)

// resourceMetric is kwok's own emulation of the kubelet's /metrics/resource
// (kustomize/metrics/resource), served for one node at the kubelet's path. kwok serves it
// at /metrics/nodes/{nodeName}/metrics/resource for all its nodes; at a fixed path it
// serves the node the Metric is named after.
func resourceMetric(node string) (string, error) {
	var m map[string]any
	if err := yaml.Unmarshal([]byte(kwokresource.DefaultMetricsResource), &m); err != nil {
		return "", fmt.Errorf("kwok's metrics-resource: %w", err)
	}
	meta, _ := m["metadata"].(map[string]any)
	spec, _ := m["spec"].(map[string]any)
	if meta == nil || spec == nil {
		return "", fmt.Errorf("kwok's metrics-resource has no metadata or spec")
	}
	meta["name"] = node
	spec["path"] = "/metrics/resource"
	out, err := yaml.Marshal(m)
	return string(out), err
}
