package cli

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/substrate/kube"
	"github.com/meshmark/meshmark/internal/substrate/kube/kubetest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestLinkerdThatInjectsNothingIsRefused installs Linkerd's own charts (linkerd-crds and
// linkerd-control-plane, vendored, with certificates from meshmark's PKI and strict
// mTLS as Linkerd's all-authenticated default policy) through `meshmark deploy`.
// Linkerd's proxy injector is a webhook served by Linkerd's controller, which cannot
// run on this cluster (no container runs, and its image is in no registry reachable
// here); Linkerd registers the webhook with failurePolicy Ignore, so the API server
// would admit the workload's pods without linkerd-proxy. The bring-up must see that
// before it creates any (a dry run of a pod comes back without the sidecar until the
// study's readyTimeout) and refuse, and the deploy must leave nothing behind: no
// namespace, no Linkerd CRD or webhook.
func TestLinkerdThatInjectsNothingIsRefused(t *testing.T) {
	c := startTestCluster(t)
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	client, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	path := kubeStudy(t, c, `    - {name: baseline, profile: none}
    - name: linkerd
      profile: linkerd
      options: {mtls: strict}`)
	// The wait for the injector is bounded by the study's readyTimeout.
	rewriteStudy(t, path, "namespacePrefix: mmtest\n", "namespacePrefix: mmtest\n      readyTimeout: 20s\n")

	// The mesh's namespace lives only during the deploy: watch it to see how the run
	// enrolled it (Linkerd's docs annotate the namespace, linkerd.io/inject: enabled).
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	watch, err := client.CoreV1().Namespaces().Watch(wctx, metav1.ListOptions{LabelSelector: kube.MeshLabel + "=linkerd"})
	if err != nil {
		t.Fatal(err)
	}
	injected := make(chan string, 1)
	go func() {
		defer close(injected)
		for ev := range watch.ResultChan() {
			if ns, ok := ev.Object.(*corev1.Namespace); ok && ns.Annotations["linkerd.io/inject"] != "" {
				injected <- ns.Name + ": linkerd.io/inject=" + ns.Annotations["linkerd.io/inject"]
				return
			}
		}
	}()

	out, errOut, err := execCLI("deploy", path)
	stopWatch()
	if got := <-injected; !strings.HasSuffix(got, "linkerd.io/inject=enabled") {
		t.Errorf("the mesh's namespace was not annotated for Linkerd's injector: %q", got)
	}

	if err == nil || !strings.Contains(err.Error(), "mesh linkerd: namespace ") ||
		!strings.Contains(err.Error(), "the mesh's injector did not add linkerd-proxy to a dry run of front-v1's pod within 20s: the pod came back without it") {
		t.Fatalf("deploy of Linkerd whose injector cannot run: %v\n%s\n%s", err, out, errOut)
	}
	t.Logf("refused: %v", err)
	if !regexp.MustCompile(`linkerd: installed in \S+: \d+ objects, 14 CRDs added, 6 values set`).MatchString(errOut) {
		t.Errorf("progress does not report the install's effort:\n%s", errOut)
	}
	if left := meshmarkNamespaces(t, c); len(left) > 0 {
		t.Errorf("deploy left namespaces %v", left)
	}
	if left := linkerdLeftovers(t, c); len(left) > 0 {
		t.Errorf("deploy left Linkerd's %v", left)
	}
}

// linkerdLeftovers is what a Linkerd install leaves: its namespace, Linkerd's CRDs and
// the Gateway API routes linkerd-crds adds.
func linkerdLeftovers(t *testing.T, c *kubetest.Cluster) []string {
	t.Helper()
	return meshLeftovers(t, c, "linkerd", "linkerd.io", "gateway.networking.k8s.io")
}
