package kubeplatform

import (
	"maps"
	"slices"
	"testing"

	"github.com/meshmark/meshmark/internal/runner"
	"github.com/meshmark/meshmark/internal/study"
	"github.com/meshmark/meshmark/internal/substrate/kube"
	"github.com/meshmark/meshmark/internal/workload"
)

// TestKubeSpreadFollowsTheBaselinesBalancing: on a cluster the baseline with
// `balancing: per-request` (the default) has every workload pod spread its calls over
// each service's versions' headless Services, by the versions' weights; per connection, and under a mesh, whose proxies
// balance, callers use the Services.
func TestKubeSpreadFollowsTheBaselinesBalancing(t *testing.T) {
	g, err := workload.Builtin("bookinfo:replicas=2")
	if err != nil {
		t.Fatal(err)
	}
	args, err := kubeSpread(g, &study.Mesh{Name: "baseline", Profile: "none"})
	if err != nil {
		t.Fatal(err)
	}
	var spreads []string
	for i := 0; i+1 < len(args); i += 2 {
		if args[i] != "--spread" {
			t.Fatalf("args %v", args)
		}
		spreads = append(spreads, args[i+1])
	}
	parsed, err := workload.ParseSpread(spreads)
	if err != nil {
		t.Fatalf("the pods would refuse their --spread: %v", err)
	}
	reviews := parsed["reviews"]
	if len(parsed) != len(g.Services) || len(reviews) != 3 {
		t.Fatalf("spread %v: want every service, reviews over its 3 versions", parsed)
	}
	for i, v := range []string{"v1", "v2", "v3"} {
		// bookinfo's reviews versions weigh alike.
		if want := kube.SpreadServiceName("reviews", v) + ":9080"; reviews[i].Addr != want || reviews[i].Weight != reviews[0].Weight || reviews[i].Weight <= 0 {
			t.Errorf("reviews endpoint %d: %+v, want %s with the weight of the others", i, reviews[i], want)
		}
	}
	unsplit, err := workload.Parse("u.yaml", []byte("name: unsplit\nservices:\n  - name: front\n    script: [call: back]\n  - name: back\n    versions: [{name: v1, replicas: 3}, {name: v2}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	args, err = kubeSpread(unsplit, &study.Mesh{Name: "baseline", Profile: "none"})
	// A version without a weight weighs 1, as the graph reads it and the mix check
	// intends, whatever its replicas.
	if err != nil || !slices.Contains(args, "back=back-v1-pods:9080@1,back-v2-pods:9080@1") {
		t.Errorf("spread of versions without weights %v, %v: want each weighing 1", args, err)
	}
	split, err := workload.Parse("s.yaml", []byte("name: split\nservices:\n  - name: front\n    script: [call: back]\n  - name: back\n    versions: [{name: v1, weight: 80, replicas: 4}, {name: v2, weight: 20}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	args, err = kubeSpread(split, &study.Mesh{Name: "baseline", Profile: "none", Options: map[string]any{"balancing": "per-request"}})
	if err != nil || !slices.Contains(args, "back=back-v1-pods:9080@80,back-v2-pods:9080@20") {
		t.Errorf("spread of a weighted split %v, %v: want the versions' weights", args, err)
	}
	for _, m := range []study.Mesh{
		{Name: "kube-proxy", Profile: "none", Options: map[string]any{"balancing": "per-connection"}},
		{Name: "istio", Profile: "envoy-sidecar"},
	} {
		if args, err := kubeSpread(g, &m); err != nil || len(args) != 0 {
			t.Errorf("%s: spread %v, %v; want none", m.Name, args, err)
		}
	}
}

// What each pod served before and after a trial, as kube.Served reads it, is what each
// version served over it (the runner judges the split: TestOneTrialAssemblyForEveryPlatform);
// a pod read only once, or whose count went back (restarted), is left out.
func TestServedByVersionCountsPodsReadTwice(t *testing.T) {
	before := []kube.PodServed{{Pod: "r1", Service: "reviews", Version: "v1", Served: 10}, {Pod: "r2", Service: "reviews", Version: "v2", Served: 10},
		{Pod: "r3", Service: "reviews", Version: "v3", Served: 500}, {Pod: "p", Service: "productpage", Version: "v1"}}
	after := []kube.PodServed{{Pod: "r1", Service: "reviews", Version: "v1", Served: 310}, {Pod: "r2", Service: "reviews", Version: "v2", Served: 310},
		{Pod: "r3", Service: "reviews", Version: "v3", Served: 3}, {Pod: "new", Service: "reviews", Version: "v3", Served: 300}, {Pod: "p", Service: "productpage", Version: "v1", Served: 600}}
	got := servedByVersion(before, after)
	want := map[runner.Version]int64{{Service: "reviews", Version: "v1"}: 300, {Service: "reviews", Version: "v2"}: 300, {Service: "productpage", Version: "v1"}: 600}
	if got[runner.Version{Service: "reviews", Version: "v3"}] != 0 {
		t.Errorf("reviews v3 counted %d: its restarted pod and its new one must not count", got[runner.Version{Service: "reviews", Version: "v3"}])
	}
	delete(got, runner.Version{Service: "reviews", Version: "v3"})
	if !maps.Equal(got, want) {
		t.Errorf("served %v, want %v", got, want)
	}
}
