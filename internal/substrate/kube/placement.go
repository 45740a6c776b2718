package kube

import (
	"context"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Placement is where the app's and the load generators' pods can go: the nodes that
// match each node selector and take pods.
type Placement struct {
	App, Loadgen []string
}

// Shared says whether the app's and the load generators' pods may land on one node, and
// which nodes those are.
func (p Placement) Shared() []string {
	var out []string
	for _, n := range p.App {
		for _, m := range p.Loadgen {
			if n == m {
				out = append(out, n)
			}
		}
	}
	return out
}

// CheckPlacement finds, before anything is created, the nodes each node selector lets
// the app's and the load generators' pods on (nodes that match it, are not cordoned and
// have no taint that keeps pods without tolerations off), and refuses a selector that
// no node matches, naming the selector, the nodes and their values of its keys, and how
// to label one: otherwise every pod would wait unschedulable.
func (c *Cluster) CheckPlacement(ctx context.Context) (Placement, error) {
	nodes, err := c.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return Placement{}, fmt.Errorf("cluster %s: list nodes: %w", c.Server, err)
	}
	sort.Slice(nodes.Items, func(i, j int) bool { return nodes.Items[i].Name < nodes.Items[j].Name })
	var p Placement
	var problems []string
	for _, sel := range []struct {
		field string
		set   map[string]string
		into  *[]string
	}{{"sutNodeSelector", c.cfg.AppNodeSelector, &p.App}, {"loadgenNodeSelector", c.cfg.LoadgenNodeSelector, &p.Loadgen}} {
		match := labels.SelectorFromSet(sel.set)
		var near []string
		for _, n := range nodes.Items {
			if !takesPods(&n) {
				continue
			}
			if match.Matches(labels.Set(n.Labels)) {
				*sel.into = append(*sel.into, n.Name)
				continue
			}
			var have []string
			for _, k := range sortedKeys(sel.set) {
				v, ok := n.Labels[k]
				if !ok {
					v = "(none)"
				}
				have = append(have, k+"="+v)
			}
			near = append(near, fmt.Sprintf("%s: %s", n.Name, strings.Join(have, ", ")))
		}
		if len(*sel.into) == 0 {
			var want []string
			for _, k := range sortedKeys(sel.set) {
				want = append(want, k+"="+sel.set[k])
			}
			problems = append(problems, fmt.Sprintf("spec.substrate.kubernetes.%s %s: no node that takes pods matches it (%s); label one: kubectl label node NODE %s",
				sel.field, strings.Join(want, ","), orNone(near), strings.Join(want, " ")))
		}
	}
	if len(problems) > 0 {
		return p, fmt.Errorf("cluster %s (context %s): %s", c.Server, c.ContextName, strings.Join(problems, "; "))
	}
	return p, nil
}

// takesPods says whether a node takes pods that have no tolerations: not cordoned, and
// no NoSchedule or NoExecute taint (a control-plane node's, a node not ready yet).
func takesPods(n *corev1.Node) bool {
	if n.Spec.Unschedulable {
		return false
	}
	for _, t := range n.Spec.Taints {
		if t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute {
			return false
		}
	}
	return true
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "no node takes pods"
	}
	return "nodes " + strings.Join(s, "; ")
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
