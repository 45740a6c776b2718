package kube

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const widgetCRD = "widgets.test.meshmark.dev"

// The installer meshes will go through, on a test chart shaped like a mesh's: a CRD in
// crds/, a custom resource of it, a Deployment behind a Service.
func TestHelmInstallMeasuresEffortAndUninstallLeavesNothing(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	c := connect(t, Config{})
	why := "install the widget chart first"
	if err := c.RequireCRDs(ctx, why, widgetCRD, "namespaces"); err == nil ||
		!strings.Contains(err.Error(), "lacks CustomResourceDefinition "+widgetCRD+", namespaces: "+why) {
		t.Errorf("RequireCRDs before the install: %v", err)
	}
	var helmLog bytes.Buffer
	inst, err := c.Install(ctx, Chart{
		Release: "widgets", Ref: "testdata/charts/widget-app", Namespace: "mmtest-widgets-system",
		Values: map[string]any{"replicas": 2, "nodeSelector": map[string]any{"meshmark.dev/test-node": "2"}},
	}, &helmLog)
	if err != nil {
		t.Fatalf("%v\n%s", err, helmLog.String())
	}
	e := inst.Effort
	wantKinds := map[string]int{"ServiceAccount": 1, "Deployment": 1, "Service": 1, "Widget": 1, "CustomResourceDefinition": 1}
	if e.Objects != 5 || len(e.Kinds) != len(wantKinds) || e.Values != 2 || e.Ready <= 0 || !slices.Equal(e.CRDs, []string{widgetCRD}) {
		t.Errorf("effort %+v: want 5 objects %v, 2 values, the CRD added", e, wantKinds)
	}
	for k, n := range wantKinds {
		if e.Kinds[k] != n {
			t.Errorf("effort kinds %v: want %d %s", e.Kinds, n, k)
		}
	}
	dep, err := c.Client().AppsV1().Deployments("mmtest-widgets-system").Get(ctx, "widgets", metav1.GetOptions{})
	if err != nil || dep.Status.AvailableReplicas != 2 {
		t.Errorf("after the install (Helm waits): deployment %v, err %v", dep.Status, err)
	}
	if err := c.RequireCRDs(ctx, why, widgetCRD); err != nil {
		t.Error(err)
	}

	if err := c.Uninstall(ctx, inst, &helmLog); err != nil {
		t.Fatal(err)
	}
	if err := c.RequireCRDs(ctx, why, widgetCRD); err == nil {
		t.Error("the CRD the install added is still there")
	}
	if _, err := c.Client().CoreV1().Namespaces().Get(ctx, "mmtest-widgets-system", metav1.GetOptions{}); !IsNotFound(err) {
		t.Errorf("the release's namespace is still there: %v", err)
	}
}

func TestHelmInstallThatNeverGetsReadyIsRemoved(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	c := connect(t, Config{Timeout: 5 * time.Second})
	_, err := c.Install(ctx, Chart{
		Release: "stuck", Ref: "testdata/charts/widget-app", Namespace: "mmtest-stuck-system",
		Values: map[string]any{"nodeSelector": map[string]any{"meshmark.dev/test-node": "none"}},
	}, nil)
	if err == nil || !strings.Contains(err.Error(), "install stuck (chart widget-app 0.3.1) into mmtest-stuck-system") {
		t.Fatalf("install of pods no node takes: %v", err)
	}
	if err := c.RequireCRDs(ctx, "", widgetCRD); err == nil {
		t.Error("a failed install left its CRD")
	}
	if _, err := c.Client().CoreV1().Namespaces().Get(ctx, "mmtest-stuck-system", metav1.GetOptions{}); !IsNotFound(err) {
		t.Errorf("a failed install left its namespace: %v", err)
	}
	if _, err := c.Install(ctx, Chart{Release: "x", Ref: "istiod", Repo: "https://istio-release.storage.googleapis.com/charts", Namespace: "x"}, nil); err == nil ||
		!strings.Contains(err.Error(), "no version: pin one") {
		t.Errorf("an unpinned repository chart: %v", err)
	}
}
