package kubeplatform

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	"github.com/meshmark/meshmark/internal/study"
	"github.com/meshmark/meshmark/internal/substrate/kube"
	"k8s.io/apimachinery/pkg/labels"
)

// What a mesh asks of the cluster itself, beyond its charts: objects the cluster must or
// must not hold before the install (meshkube.KubernetesInstall.Requires), whether the mesh
// is the cluster's pod network (ClusterNetwork), and node agents that enroll the pods of
// their node (NodeAgents). Cilium asks all three.

// installKubeMesh checks that the cluster can take the mesh, then installs it: a mesh
// that the cluster rules out is refused before anything is created.
func installKubeMesh(ctx context.Context, c *kube.Cluster, plan *meshkube.KubernetesInstall, run string, logw io.Writer, progress func(release string, p kube.WaitProgress)) (*kube.MeshInstall, error) {
	if err := c.CheckRequirements(ctx, plan.Requires); err != nil {
		return nil, err
	}
	return c.InstallMesh(ctx, helmCharts(plan, run), plan.Manifests, logw, progress)
}

// checkClusterNetwork refuses a study that puts a mesh which is the cluster's pod
// network (Cilium) beside meshes that need one already there, the baseline included:
// no cluster runs both, since the one goes only onto a cluster created without a CNI,
// where the others' pods never start. It names the first such mesh's profile.
func checkClusterNetwork(st *study.Study) error {
	network, other := -1, -1
	for i, m := range st.Spec.Meshes {
		plan, err := kubernetesInstall(m)
		switch {
		case err != nil:
			return nil // checkKubernetes names it
		case plan != nil && plan.ClusterNetwork:
			if network < 0 {
				network = i
			}
		case other < 0:
			other = i
		}
	}
	if network < 0 || other < 0 {
		return nil
	}
	n, o := st.Spec.Meshes[network], st.Spec.Meshes[other]
	return st.ErrorAt(fmt.Sprintf("spec.meshes[%d].profile", network), fmt.Errorf(
		"%s is the cluster's pod network (its CNI): it goes onto a cluster created without one, where the pods of mesh %s (profile %s) could not start. "+
			"Compare it in a study of its own, every mesh of profile %s, with the one whose mesh features are off as spec.baseline (see examples/kubernetes/s5-cilium.yaml)",
		n.Profile, o.Name, o.Profile, n.Profile))
}

// checkKeptUpOnCluster refuses keepMeshesUp on a cluster where two meshes of the study
// install something: their control planes, webhooks and CRDs would meet on the one
// cluster (two istiods, say, each injecting every enrolled namespace). Meshes that
// install nothing (the baseline and its A/A twins) live in namespaces of their own
// beside the one that does, whose enrollment is by namespace, and stay up together.
// It names the second mesh that installs.
func checkKeptUpOnCluster(st *study.Study) error {
	if !st.Spec.KeepMeshesUp {
		return nil
	}
	first := -1
	for i, m := range st.Spec.Meshes {
		plan, err := kubernetesInstall(m)
		switch {
		case err != nil:
			return nil // checkKubernetes names it
		case plan == nil:
		case first < 0:
			first = i
		default:
			return st.ErrorAt("spec.keepMeshesUp", fmt.Errorf(
				"on Kubernetes, of the meshes kept up together at most one may install anything: meshes %s (profile %s) and %s (profile %s) both do, and their control planes would meet on the one cluster. "+
					"Keep only the baseline beside one of them, or set keepMeshesUp: false to install one at a time",
				st.Spec.Meshes[first].Name, st.Spec.Meshes[first].Profile, m.Name, m.Profile))
		}
	}
	return nil
}

// nodeAgentEnrollment is the node agents' word that the mesh took in every pod of the
// app, for a mesh whose data plane is a node's (Cilium's agent wires every pod of its
// node into its datapath): a pod is enrolled when its node runs a ready agent. It adds
// what it found to enr, and a failure per node that has none ready; a mesh without node
// agents adds nothing.
func nodeAgentEnrollment(ctx context.Context, c *kube.Cluster, app *kube.App, plan *meshkube.KubernetesInstall, enr *mesh.Enrollment) error {
	for _, agent := range plan.NodeAgents {
		placed, err := c.NodeAgents(ctx, app, agent)
		if err != nil {
			return err
		}
		addNodeAgents(enr, agent, placed)
	}
	return nil
}

// addNodeAgents records each pod's node and agent in enr (beside what a sidecar check
// recorded for the same pod, if any), and fails enr once per node whose pods no ready
// agent took in, naming them.
func addNodeAgents(enr *mesh.Enrollment, agent meshkube.NodeAgent, placed []kube.PodAgent) {
	outside := map[string][]string{} // why -> pods
	for _, p := range placed {
		i := slices.IndexFunc(enr.Pods, func(pe mesh.PodEnrollment) bool { return pe.Pod == p.Pod })
		if i < 0 {
			enr.Pods = append(enr.Pods, mesh.PodEnrollment{Pod: p.Pod, Service: p.App, Meshed: true})
			i = len(enr.Pods) - 1
		}
		var why string
		switch {
		case p.Node == "":
			why = "are on no node yet"
		case p.Agent == "":
			why = fmt.Sprintf("are on node %s, which runs no %s (namespace %s, labels %s)", p.Node, agent.Component, agent.Namespace, labels.SelectorFromSet(agent.Labels))
		case !p.Ready:
			why = fmt.Sprintf("are on node %s, whose %s %s is not ready", p.Node, agent.Component, p.Agent)
		default:
			enr.Pods[i].Notes = append(enr.Pods[i].Notes, fmt.Sprintf("node %s: %s %s ready", p.Node, agent.Component, p.Agent))
			continue
		}
		outside[why] = append(outside[why], p.Pod)
		enr.Pods[i].Notes = append(enr.Pods[i].Notes, "outside the mesh: its node has no ready "+agent.Component)
	}
	for _, why := range slices.Sorted(maps.Keys(outside)) {
		enr.Fail("pods %s %s: the mesh did not take them in", strings.Join(outside[why], ", "), why)
	}
}
