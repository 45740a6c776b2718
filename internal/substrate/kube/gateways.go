package kube

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	gatewayapicrds "github.com/meshmark/meshmark/third_party/gateway-api-crds"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"
)

// A mesh's Gateways in the app's namespace (meshkube.AppGateway: ambient's waypoint) are
// Gateway API objects, which the mesh's controller turns into a Deployment there.
const (
	gatewayAPIGroup = "gateway.networking.k8s.io"
	// gatewayNameLabel is what a Gateway API implementation labels a Gateway's pods
	// with.
	gatewayNameLabel = gatewayAPIGroup + "/gateway-name"
)

// appGateway is a Gateway created in an app's namespace.
type appGateway struct {
	name, class string
	// deployment is what the Gateway's controller names the Deployment it makes.
	deployment string
	resource   schema.GroupVersionResource
}

// parseGateways reads a mesh's Gateways and checks, before anything is created, that
// the cluster has the Gateway API's Gateway CRD, or says which CRD is missing and how to
// install it.
func (c *Cluster) parseGateways(ctx context.Context, gateways []meshkube.AppGateway) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	for _, g := range gateways {
		var obj unstructured.Unstructured
		if err := yaml.Unmarshal([]byte(g.Manifest), &obj.Object); err != nil {
			return nil, fmt.Errorf("mesh gateway: %w", err)
		}
		gvk := obj.GroupVersionKind()
		if gvk.Group != gatewayAPIGroup || gvk.Kind != "Gateway" || obj.GetName() == "" || g.Deployment == "" {
			return nil, fmt.Errorf("mesh gateway %q: want a named %s Gateway and the Deployment its controller makes, got %s %q (deployment %q)",
				obj.GetName(), gatewayAPIGroup, gvk, obj.GetName(), g.Deployment)
		}
		out = append(out, &obj)
	}
	if len(out) == 0 {
		return nil, nil
	}
	class, _, _ := unstructured.NestedString(out[0].Object, "spec", "gatewayClassName")
	why := fmt.Sprintf("the mesh's %s (Gateway %s, class %s) is a Kubernetes Gateway API object, whose CRDs most clusters do not come with; install them: %s",
		out[0].GetName(), out[0].GetName(), class, gatewayapicrds.InstallCommand)
	if err := c.RequireCRDs(ctx, why, gatewayapicrds.GatewayCRD); err != nil {
		return nil, err
	}
	return out, nil
}

// createGateway creates a mesh's Gateway in the app's namespace. It carries no label of
// meshmark's: its controller copies a Gateway's labels onto the Deployment and pods it
// makes, which are the mesh's proxies, not the app's, and must not be counted among the
// app's Deployments and pods. The namespace, which is meshmark's, takes it along.
func (c *Cluster) createGateway(ctx context.Context, app *App, obj *unstructured.Unstructured, deployment string) error {
	obj.SetNamespace(app.Namespace)
	mapping, err := c.create(ctx, obj)
	if err != nil {
		return fmt.Errorf("namespace %s: %w", app.Namespace, err)
	}
	class, _, _ := unstructured.NestedString(obj.Object, "spec", "gatewayClassName")
	app.gateways = append(app.gateways, appGateway{name: obj.GetName(), class: class, deployment: deployment, resource: mapping.Resource})
	return nil
}

// gatewaysReady says how far the app's Gateways are from ready, in the replicas of
// their Deployments (one, until the controller has made it): a Gateway is ready once its
// controller says it is Programmed and its Deployment has every replica available.
func (c *Cluster) gatewaysReady(ctx context.Context, app *App) (ready, total int, short []string, err error) {
	if len(app.gateways) == 0 {
		return 0, 0, nil, nil
	}
	dyn, err := dynamic.NewForConfig(c.rest)
	if err != nil {
		return 0, 0, nil, err
	}
	for _, g := range app.gateways {
		gw, err := dyn.Resource(g.resource).Namespace(app.Namespace).Get(ctx, g.name, metav1.GetOptions{})
		if err != nil {
			return 0, 0, nil, fmt.Errorf("namespace %s: gateway %s: %w", app.Namespace, g.name, err)
		}
		if why := notProgrammed(gw); why != "" {
			short = append(short, fmt.Sprintf("gateway %s %s", g.name, why))
		}
		d, err := c.client.AppsV1().Deployments(app.Namespace).Get(ctx, g.deployment, metav1.GetOptions{})
		switch {
		case IsNotFound(err):
			total++
			short = append(short, fmt.Sprintf("deployment %s of gateway %s not made yet by its controller (class %s)", g.deployment, g.name, g.class))
			continue
		case err != nil:
			return 0, 0, nil, fmt.Errorf("namespace %s: deployment %s of gateway %s: %w", app.Namespace, g.deployment, g.name, err)
		}
		have, want := available(d)
		ready, total = ready+int(min(have, want)), total+int(want)
		if have < want {
			short = append(short, fmt.Sprintf("%s %d/%d (gateway %s)", d.Name, have, want, g.name))
		}
	}
	return ready, total, short, nil
}

// available is how many replicas of a Deployment are available out of how many it
// wants; none while it has not caught up with its latest spec.
func available(d *appsv1.Deployment) (have, want int32) {
	want = 1
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	have = d.Status.AvailableReplicas
	if d.Status.ObservedGeneration < d.Generation || d.Status.UpdatedReplicas < want {
		have = 0
	}
	return have, want
}

// notProgrammed is why a Gateway is not Programmed yet, in its controller's words (the
// Gateway API's CRD itself starts a Gateway at "Pending: Waiting for controller"), or
// empty when it is.
func notProgrammed(gw *unstructured.Unstructured) string {
	class, _, _ := unstructured.NestedString(gw.Object, "spec", "gatewayClassName")
	conds, _, _ := unstructured.NestedSlice(gw.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] != "Programmed" {
			continue
		}
		if m["status"] == "True" {
			return ""
		}
		return fmt.Sprintf("not Programmed by its controller (class %s): %v: %v", class, m["reason"], m["message"])
	}
	return fmt.Sprintf("not Programmed: no status from its controller (class %s) yet", class)
}

// deleteGateways deletes the app's Gateways, their Deployments and their pods, and waits
// until the pods are gone, so that the namespace controller then finds the namespace
// empty of them (as deleteNamespaces does for the workload).
func (c *Cluster) deleteGateways(ctx context.Context, app *App) error {
	if len(app.gateways) == 0 {
		return nil
	}
	dyn, err := dynamic.NewForConfig(c.rest)
	if err != nil {
		return err
	}
	background := metav1.DeletePropagationBackground
	opts := metav1.DeleteOptions{PropagationPolicy: &background}
	var selectors []string
	for _, g := range app.gateways {
		// The Gateway first, so that its controller does not make its Deployment again.
		if err := dyn.Resource(g.resource).Namespace(app.Namespace).Delete(ctx, g.name, opts); err != nil && !IsNotFound(err) {
			return fmt.Errorf("namespace %s: delete gateway %s: %w", app.Namespace, g.name, err)
		}
		if err := c.client.AppsV1().Deployments(app.Namespace).Delete(ctx, g.deployment, opts); err != nil && !IsNotFound(err) {
			return fmt.Errorf("namespace %s: delete deployment %s of gateway %s: %w", app.Namespace, g.deployment, g.name, err)
		}
		sel := metav1.ListOptions{LabelSelector: gatewayNameLabel + "=" + g.name}
		if err := c.client.CoreV1().Pods(app.Namespace).DeleteCollection(ctx, opts, sel); err != nil && !IsNotFound(err) {
			return fmt.Errorf("namespace %s: delete the pods of gateway %s: %w", app.Namespace, g.name, err)
		}
		selectors = append(selectors, sel.LabelSelector)
	}
	limit := max(c.cfg.Timeout, deleteTimeout)
	for deadline := time.Now().Add(limit); ; {
		var left []string
		for _, sel := range selectors {
			pods, err := c.client.CoreV1().Pods(app.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
			if err != nil {
				return fmt.Errorf("namespace %s: %w", app.Namespace, err)
			}
			for _, p := range pods.Items {
				left = append(left, p.Name)
			}
		}
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("namespace %s: gateway pods still terminating after %s: %s", app.Namespace, limit, strings.Join(left, ", "))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
