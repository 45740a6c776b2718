package kubeplatform

import (
	"context"
	"testing"

	"github.com/meshmark/meshmark/internal/runner"
	"github.com/meshmark/meshmark/internal/study"
	"github.com/meshmark/meshmark/internal/substrate/kube"
)

// A cluster brings to the runner's one translation of experiments into load
// (runner's TestOneTranslationForBothPlatforms) only where the requests go, the entry
// service by its cluster DNS name in the deployment's namespace, and lets its
// generators spin, as they have nodes of their own.
func TestClusterLoadGoesToTheEntryService(t *testing.T) {
	h, err := runner.NewHost(parseStudy(t, `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: cluster-load}
spec:
  substrate:
    kubernetes: {image: meshmark:dev}
  workload: {graph: emojivoto}
  meshes: [{name: none, profile: none}]
  experiments: [{name: latency, kind: fixed-rate, rate: 200, duration: 3s, warmup: 1s}]
`), runner.Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := &kubeDeployment{app: &kube.App{Namespace: "mm-run-none"}}
	p := (&run{Host: h}).kubeLoad(context.Background(), d, nil)
	if got, want := p.Target(&study.Experiment{}, "/api/list"), "http://"+kube.ServiceName("web")+".mm-run-none.svc.cluster.local:8080/api/list"; got != want {
		t.Errorf("target %s, want %s", got, want)
	}
	if p.NoSpin || p.Measure == nil {
		t.Errorf("no spin %v, measure set %v: want the generators free to spin, and the cluster's measuring", p.NoSpin, p.Measure != nil)
	}
}
