package kube

import (
	"context"
	"fmt"

	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// PodAgent says where one pod of an app runs and how a mesh's node agent is there: for
// meshes whose data plane is a node's (Cilium), a pod is enrolled when its node's agent
// is ready.
type PodAgent struct {
	Pod, App string
	// Node is the pod's node, empty while it is not scheduled.
	Node string
	// Agent is the agent's pod on that node, empty when the node has none; Ready says
	// whether it (or one of them, during a rollout) is ready.
	Agent string
	Ready bool
}

// NodeAgents reports, for every pod of the app (workload and load generators), the
// agent's pod on its node and whether it is ready, as the cluster stores them.
func (c *Cluster) NodeAgents(ctx context.Context, app *App, agent meshkube.NodeAgent) ([]PodAgent, error) {
	pods, err := c.appPods(ctx, app)
	if err != nil {
		return nil, err
	}
	agents, err := c.client.CoreV1().Pods(agent.Namespace).List(ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(agent.Labels).String()})
	if err != nil {
		return nil, fmt.Errorf("%s pods (namespace %s, labels %s): %w", agent.Component, agent.Namespace, labels.SelectorFromSet(agent.Labels), err)
	}
	onNode := map[string]PodAgent{}
	for _, a := range agents.Items {
		if a.DeletionTimestamp != nil || a.Spec.NodeName == "" {
			continue
		}
		if have, ok := onNode[a.Spec.NodeName]; ok && have.Ready {
			continue
		}
		onNode[a.Spec.NodeName] = PodAgent{Agent: a.Name, Ready: podReady(&a)}
	}
	var out []PodAgent
	for _, p := range pods {
		pa := onNode[p.Spec.NodeName]
		if p.Spec.NodeName == "" {
			pa = PodAgent{}
		}
		pa.Pod, pa.App, pa.Node = p.Name, podApp(&p), p.Spec.NodeName
		out = append(out, pa)
	}
	return out, nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
