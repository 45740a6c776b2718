package kube

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/linkerd"
	linkerdcharts "github.com/meshmark/meshmark/third_party/linkerd-charts"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

// TestLinkerdInstallsWithMeshmarksCertificates installs Linkerd's own charts
// (linkerd-crds, then linkerd-control-plane with its partials, as vendored in
// third_party/linkerd-charts) through InstallMesh, with the values the linkerd profile
// gives them: a trust anchor and an identity issuer from meshmark's PKI. Real here: the
// charts, Helm's rendering and wait, every object they create, the identity issuer
// Secret and trust-roots ConfigMap Linkerd's identity controller would read, the
// proxy-injector webhook registration, the annotated namespace, the uninstall.
// Not real: no Linkerd container runs (kwok marks the control plane's pods ready
// without starting them), so the proxy injector never answers its webhook, which
// Linkerd registers with failurePolicy Ignore: the workload's pods are admitted without
// linkerd-proxy, and the test checks that the enrollment check sees exactly that. On a
// cluster that runs containers the same install injects linkerd-proxy (see
// docs/kubernetes.md, "On kind").
func TestLinkerdInstallsWithMeshmarksCertificates(t *testing.T) {
	needCluster(t)
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	ctx := context.Background()
	p, err := mesh.New(linkerd.Name, map[string]any{"mtls": "strict"})
	if err != nil {
		t.Fatal(err)
	}
	plan, err := p.(mesh.KubernetesInstaller).Kubernetes()
	if err != nil {
		t.Fatal(err)
	}
	var charts []Chart
	for _, ch := range plan.Charts {
		charts = append(charts, Chart{Release: ch.Release, Namespace: ch.Namespace, Ref: ch.Chart, Repo: ch.Repo, Version: ch.Version, Values: ch.Values})
	}
	c := connect(t, Config{Timeout: 2 * time.Minute})
	var log bytes.Buffer
	// As a run does before anything is created.
	if err := c.CheckInstallRights(ctx, plan.Manifests, nil, plan.AppManifests); err != nil {
		t.Fatal(err)
	}
	crdsBefore, err := c.crdNames(ctx)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	mi, err := c.InstallMesh(ctx, charts, plan.Manifests, &log, nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	t.Logf("Linkerd installed in %s: %d objects, %d CRDs added, %d values set", time.Since(start).Round(100*time.Millisecond),
		mi.Effort.Objects, len(mi.Effort.CRDs), mi.Effort.Values)
	uninstalled := false
	defer func() {
		if !uninstalled {
			_ = c.UninstallMesh(context.Background(), mi, &log)
		}
	}()

	e := mi.Effort
	var linkerdCRDs, gatewayCRDs int
	for _, crd := range e.CRDs {
		switch {
		case strings.HasSuffix(crd, ".linkerd.io"):
			linkerdCRDs++
		case strings.HasSuffix(crd, ".gateway.networking.k8s.io"):
			gatewayCRDs++
		}
	}
	// linkerd-crds: ServiceProfile, ExternalWorkload, six policy CRDs (Server,
	// ServerAuthorization, AuthorizationPolicy, MeshTLSAuthentication,
	// NetworkAuthentication, HTTPRoute), EgressNetwork and HTTPLocalRateLimitPolicy;
	// with installGatewayAPI, four Gateway API routes.
	if linkerdCRDs != 10 || gatewayCRDs != 4 || len(e.CRDs) != 14 || e.Kinds["CustomResourceDefinition"] != 14 {
		t.Errorf("CRDs added %v (kinds %v): want Linkerd's 10 and 4 Gateway API routes", e.CRDs, e.Kinds)
	}
	if e.Kinds["Deployment"] != 3 || e.Kinds["MutatingWebhookConfiguration"] != 1 || e.Kinds["ValidatingWebhookConfiguration"] != 2 ||
		e.Kinds["Secret"] < 1 || e.Objects < 40 {
		t.Errorf("effort %+v: want identity, destination and proxy-injector, the injector's webhook and two validators", e)
	}
	// installGatewayAPI, linkerdVersion, the trust anchor, the issuer's certificate and
	// key, and strict mTLS's default policy.
	if e.Values != 6 {
		t.Errorf("%d values set, want 6", e.Values)
	}
	if zero := kindsCountedZero(e.Kinds); len(zero) > 0 {
		t.Errorf("effort lists kinds with no object: %v", zero)
	}

	// What Linkerd's identity controller reads is meshmark's PKI, byte for byte.
	values := plan.Charts[1].Values
	tls := values["identity"].(map[string]any)["issuer"].(map[string]any)["tls"].(map[string]any)
	issuer, err := c.Client().CoreV1().Secrets("linkerd").Get(ctx, "linkerd-identity-issuer", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]any{"crt.pem": tls["crtPEM"], "key.pem": tls["keyPEM"]} {
		if got := string(issuer.Data[k]); got == "" || got != strings.TrimSpace(want.(string)) {
			t.Errorf("linkerd-identity-issuer %s = %q, want meshmark's %q", k, got, want)
		}
	}
	roots, err := c.Client().CoreV1().ConfigMaps("linkerd").Get(ctx, "linkerd-identity-trust-roots", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := roots.Data["ca-bundle.crt"], strings.TrimSpace(values["identityTrustAnchorsPEM"].(string)); got != want {
		t.Errorf("trust roots %q, want meshmark's anchor %q", got, want)
	}
	// The release's images, which the source charts leave to the packaging job, and the
	// strict default policy, which the destination controller serves to every proxy.
	deps, err := c.Client().AppsV1().Deployments("linkerd").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	images, policy := map[string]bool{}, ""
	for _, d := range deps.Items {
		for _, ct := range append(d.Spec.Template.Spec.InitContainers, d.Spec.Template.Spec.Containers...) {
			images[ct.Image] = true
			for _, a := range ct.Args {
				if v, ok := strings.CutPrefix(a, "--default-policy="); ok && d.Name == "linkerd-destination" {
					policy = v
				}
			}
		}
	}
	for _, img := range []string{"cr.l5d.io/linkerd/controller:" + linkerdcharts.Tag, "cr.l5d.io/linkerd/proxy:" + linkerdcharts.Tag} {
		if !images[img] {
			t.Errorf("no container runs %s (images %v)", img, images)
		}
	}
	if policy != "all-authenticated" {
		t.Errorf("destination controller's --default-policy=%q, want all-authenticated for strict mTLS", policy)
	}

	spec := bookinfoSpec(t, "11d01")
	spec.Mesh = "linkerd"
	spec.NamespaceAnnotations, spec.PodAnnotations = plan.NamespaceAnnotations, plan.PodAnnotations
	spec.Manifests = plan.AppManifests
	spec.Generators = 1
	app, err := c.Deploy(ctx, spec)
	defer func() { _ = c.Teardown(context.Background(), app) }()
	if err != nil {
		t.Fatal(err)
	}
	// Strict mTLS: a Server in the app's namespace, accepted by Linkerd's own CRD, opens
	// the proxies' admin port (and only it) to the API server's plaintext reads of
	// /metrics. No proxy runs here to answer them: that it then serves them is for a
	// cluster that runs containers to show.
	servers := schema.GroupVersionResource{Group: "policy.linkerd.io", Version: "v1beta3", Resource: "servers"}
	dyn, err := dynamic.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	srv, err := dyn.Resource(servers).Namespace(app.Namespace).Get(ctx, "meshmark-proxy-admin", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the admin port's Server: %v", err)
	}
	port, _, _ := unstructured.NestedString(srv.Object, "spec", "port")
	access, _, _ := unstructured.NestedString(srv.Object, "spec", "accessPolicy")
	if port != "linkerd-admin" || access != "all-unauthenticated" || srv.GetLabels()[RunLabel] != "11d01" {
		t.Errorf("Server %v: want port linkerd-admin open to unauthenticated clients, labelled with the run", srv.Object)
	}
	ns, err := c.Client().CoreV1().Namespaces().Get(ctx, app.Namespace, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ns.Annotations["linkerd.io/inject"] != "enabled" || ns.Annotations[OwnerAnnotation] == "" {
		t.Errorf("namespace annotations %v: want linkerd.io/inject=enabled beside the owner", ns.Annotations)
	}
	ready := time.Now()
	if err := c.WaitReady(ctx, app, nil); err != nil {
		t.Fatal(err)
	}
	t.Logf("workload ready in %s", time.Since(ready).Round(100*time.Millisecond))
	pods, err := c.Sidecars(ctx, app, plan.Sidecar)
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != len(spec.Deployments)+1 {
		t.Errorf("%d pods, want %d", len(pods), len(spec.Deployments)+1)
	}
	for _, p := range pods {
		if p.Sidecar {
			t.Errorf("pod %s carries linkerd-proxy, but no proxy injector runs on this cluster", p.Pod)
		}
		if p.Annotations["linkerd.io/inject"] != "enabled" {
			t.Errorf("pod %s annotations %v", p.Pod, p.Annotations)
		}
	}
	if err := c.Teardown(ctx, app); err != nil {
		t.Fatal(err)
	}

	uninstalled = true
	if err := c.UninstallMesh(ctx, mi, &log); err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	after, err := c.crdNames(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for name := range after {
		if !crdsBefore[name] {
			t.Errorf("CRD %s still there after uninstall", name)
		}
	}
	if _, err := c.Client().CoreV1().Namespaces().Get(ctx, "linkerd", metav1.GetOptions{}); !IsNotFound(err) {
		t.Errorf("namespace linkerd after uninstall: %v", err)
	}
	adm := c.Client().AdmissionregistrationV1()
	if l, err := adm.MutatingWebhookConfigurations().List(ctx, metav1.ListOptions{}); err != nil || len(l.Items) > 0 {
		t.Errorf("mutating webhooks after uninstall: %v %v", l, err)
	}
	if l, err := adm.ValidatingWebhookConfigurations().List(ctx, metav1.ListOptions{}); err != nil || len(l.Items) > 0 {
		t.Errorf("validating webhooks after uninstall: %v %v", l, err)
	}
	if crs, err := c.Client().RbacV1().ClusterRoles().List(ctx, metav1.ListOptions{LabelSelector: "linkerd.io/control-plane-ns"}); err != nil || len(crs.Items) > 0 {
		t.Errorf("Linkerd's cluster roles after uninstall: %d %v", len(crs.Items), err)
	}
}
