package runner

import (
	"context"
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/substrate/kube"
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
	err := CheckKubernetes(st)
	want := `study.yaml:10:31: spec.meshes[1].profile: cilium is the cluster's pod network (its CNI): it goes onto a cluster created without one, where the pods of mesh baseline (profile none) could not start`
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "examples/kubernetes/s5-cilium.yaml") {
		t.Errorf("cilium beside the baseline: %v\nwant %s", err, want)
	}

	st = parseStudy(t, ciliumStudy(`    - {name: cni, profile: cilium, options: {encryption: none, l7: off}}
    - {name: cilium, profile: cilium, options: {mutual_auth: spire}}
  baseline: cni
`))
	if err := CheckKubernetes(st); err != nil {
		t.Errorf("Cilium against a plain Cilium: %v", err)
	}
}

// A pod is in Cilium's datapath when its node runs a ready agent: a pod on a node
// without one, or whose agent is not ready, fails the check, once per node, named.
func TestKubeNodeAgentEnrollment(t *testing.T) {
	agent := mesh.NodeAgent{Component: "cilium-agent", Namespace: "kube-system", Labels: map[string]string{"k8s-app": "cilium"}}
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

// A study built in code, past the loader that refuses it, meets the preflight: a
// Kubernetes-only profile has nothing to run on this machine.
func TestPreflightRefusesKubernetesOnlyProfiles(t *testing.T) {
	st := parseStudy(t, `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: local-cilium}
spec:
  workload: {graph: bookinfo}
  meshes:
    - {name: baseline, profile: none}
    - {name: cilium, profile: envoy-sidecar}
  experiments:
    - {name: lat, kind: fixed-rate, rate: 100, duration: 20s}
`)
	st.Spec.Meshes[1].Profile = "cilium"
	err := (&runner{study: st}).preflight(context.Background())
	if err == nil || !strings.Contains(err.Error(), "mesh cilium: profile cilium runs on spec.substrate.kubernetes only: Cilium's data plane is eBPF") {
		t.Errorf("preflight: %v", err)
	}
}
