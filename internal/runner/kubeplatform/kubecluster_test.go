package kubeplatform

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	"github.com/meshmark/meshmark/internal/runner"
	"github.com/meshmark/meshmark/internal/substrate/kube"
	"github.com/meshmark/meshmark/internal/workload"
)

// ciliumStudy is a study on Kubernetes with the given meshes (YAML list items).
func ciliumStudy(meshes string) string {
	return `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: kube-cilium}
spec:
  substrate:
    kubernetes: {image: registry.example/meshmark:v1}
  workload: {graph: bookinfo}
  meshes:
` + meshes + `  experiments:
    - {name: lat, kind: fixed-rate, rate: 100, duration: 20s}
`
}

// Cilium is the cluster's pod network: a study may compare it with Cilium only (a
// plain Cilium as its baseline), never with meshes whose pods need a network already
// on the cluster. validate says so, at the Cilium mesh's profile.
func TestKubeClusterNetworkMeshesComparedAmongThemselves(t *testing.T) {
	st := parseStudy(t, ciliumStudy(`    - {name: baseline, profile: none}
    - {name: cilium, profile: cilium}
`))
	err := runner.Check(st)
	want := `study.yaml:10:31: spec.meshes[1].profile: cilium is the cluster's pod network (its CNI): it goes onto a cluster created without one, where the pods of mesh baseline (profile none) could not start`
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "examples/kubernetes/s5-cilium.yaml") {
		t.Errorf("cilium beside the baseline: %v\nwant %s", err, want)
	}

	st = parseStudy(t, ciliumStudy(`    - {name: cni, profile: cilium, options: {encryption: none, l7: off}}
    - {name: cilium, profile: cilium, options: {mutual_auth: spire}}
  baseline: cni
`))
	if err := runner.Check(st); err != nil {
		t.Errorf("Cilium against a plain Cilium: %v", err)
	}
}

// A pod is in Cilium's datapath when its node runs a ready agent: a pod on a node
// without one, or whose agent is not ready, fails the check, once per node, named.
func TestKubeNodeAgentEnrollment(t *testing.T) {
	agent := meshkube.NodeAgent{Component: "cilium-agent", Namespace: "kube-system", Labels: map[string]string{"k8s-app": "cilium"}}
	enr := mesh.Enrollment{Mesh: "cilium", Pass: true}
	addNodeAgents(&enr, agent, []kube.PodAgent{
		{Pod: "front-1", App: "front", Node: "n0", Agent: "cilium-a", Ready: true},
		{Pod: "back-1", App: "back", Node: "n1", Agent: "cilium-b", Ready: false},
		{Pod: "back-2", App: "back", Node: "n2"},
		{Pod: "loadgen-1", App: "loadgen", Node: "n2"},
	})
	if enr.Pass || len(enr.Failures) != 2 || len(enr.Pods) != 4 {
		t.Fatalf("enrollment %+v: want 4 pods, a failure for n1 and one for n2", enr)
	}
	for _, want := range []string{
		"pods back-1 are on node n1, whose cilium-agent cilium-b is not ready: the mesh did not take them in",
		"pods back-2, loadgen-1 are on node n2, which runs no cilium-agent (namespace kube-system, labels k8s-app=cilium): the mesh did not take them in",
	} {
		if !strings.Contains(strings.Join(enr.Failures, "\n"), want) {
			t.Errorf("failures %q lack %q", enr.Failures, want)
		}
	}
	if p := enr.Pods[0]; p.Pod != "front-1" || p.Service != "front" || !p.Meshed || len(p.Notes) != 1 || p.Notes[0] != "node n0: cilium-agent cilium-a ready" {
		t.Errorf("enrolled pod %+v", p)
	}

	// Beside a sidecar check's record of the same pods, not a second one.
	enr = mesh.Enrollment{Pass: true, Pods: []mesh.PodEnrollment{{Pod: "front-1", Service: "front", Meshed: true, Sidecar: true}}}
	addNodeAgents(&enr, agent, []kube.PodAgent{{Pod: "front-1", App: "front", Node: "n0", Agent: "cilium-a", Ready: true}})
	if !enr.Pass || len(enr.Pods) != 1 || !enr.Pods[0].Sidecar || len(enr.Pods[0].Notes) != 1 {
		t.Errorf("enrollment %+v", enr)
	}
}

// On a cluster a version's share of its service's requests follows its pods: validate
// refuses a graph whose weights its replicas do not carry, at spec.workload.graph,
// naming the service and the replicas that would; weights in the ratio of the
// replicas, and every built-in graph, pass.
func TestKubeVersionWeightsMustFollowReplicas(t *testing.T) {
	dir := t.TempDir()
	graphStudy := func(versions string) string {
		path := filepath.Join(dir, "g.yaml")
		graph := "name: split\nservices:\n  - name: front\n    isEntrypoint: true\n    script: [call: back]\n  - name: back\n    versions:\n" + versions
		if err := os.WriteFile(path, []byte(graph), 0o644); err != nil {
			t.Fatal(err)
		}
		return strings.Replace(ciliumStudy("    - {name: baseline, profile: none}\n"), "graph: bookinfo", "graph: "+path, 1)
	}
	for _, c := range []struct{ versions, want string }{
		{"      - {name: v1, weight: 80}\n      - {name: v2, weight: 20}\n",
			`study.yaml:7:21: spec.workload.graph: graph split: service back splits its requests by weights 80:20 over versions of 1, 1 replicas: on Kubernetes a Service spreads requests over all its pods, so the versions' shares follow their replicas; give its versions replicas in the ratio of their weights (4, 1, or a multiple)`},
		{"      - {name: v1, weight: 1}\n      - {name: v2, weight: 0}\n",
			`service back splits its requests by weights 1:0 over versions of 1, 1 replicas: on Kubernetes a Service spreads requests over all its pods, so the versions' shares follow their replicas; leave out the versions of weight 0`},
	} {
		err := runner.Check(parseStudy(t, graphStudy(c.versions)))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("versions\n%s: %v\nwant %s", c.versions, err, c.want)
		}
	}
	if err := runner.Check(parseStudy(t, graphStudy("      - {name: v1, weight: 80, replicas: 4}\n      - {name: v2, weight: 20, replicas: 1}\n"))); err != nil {
		t.Errorf("weights carried by the replicas: %v", err)
	}
	for _, name := range workload.BuiltinNames() {
		name = strings.Replace(name, "-N", "-3", 1) // chain-N, fanout-N
		if err := runner.Check(parseStudy(t, strings.Replace(ciliumStudy("    - {name: baseline, profile: none}\n"), "graph: bookinfo", "graph: "+name, 1))); err != nil {
			t.Errorf("built-in graph %s: %v", name, err)
		}
	}
}

// The baseline on a cluster is checked as the local one is: it passes with no pod in a
// mesh, and a pod an injector gave a mesh's sidecar (a namespace injected by default,
// an injector left by an earlier install) fails it, naming the pod and the sidecar.
func TestKubeBaselineRefusesAnInjectedPod(t *testing.T) {
	pods := func(injected string) []kube.PodSidecar {
		return []kube.PodSidecar{
			{Pod: "front-1", App: "front", Sidecar: injected == "front-1"},
			{Pod: "loadgen-1", App: "loadgen", Sidecar: injected == "loadgen-1"},
		}
	}
	enr := judgeBaseline("baseline", map[string][]kube.PodSidecar{"istio-proxy": pods(""), "linkerd-proxy": pods("")})
	if !enr.Pass || len(enr.Pods) != 2 || enr.Pods[0].Meshed || enr.MTLS != mesh.MTLSOff {
		t.Errorf("no pod injected: %+v; want a pass listing both pods, none meshed", enr)
	}
	enr = judgeBaseline("baseline", map[string][]kube.PodSidecar{"istio-proxy": pods("front-1"), "linkerd-proxy": pods("")})
	if enr.Pass || len(enr.Pods) != 2 || !enr.Pods[0].Meshed || enr.Pods[1].Meshed ||
		len(enr.Failures) != 1 || enr.Failures[0] != "pod front-1 carries the sidecar istio-proxy: a mesh's injector took it in" {
		t.Errorf("front-1 injected: %+v; want a failure naming it and istio-proxy", enr)
	}
}
