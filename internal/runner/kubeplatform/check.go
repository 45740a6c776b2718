package kubeplatform

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/study"
	"github.com/meshmark/meshmark/internal/substrate/kube"
	"github.com/meshmark/meshmark/internal/workload"
)

// kubernetesKinds are the experiment kinds a run on Kubernetes measures so far: load at
// rates and connection counts, capacity searches and users. Security probes run on the
// local substrate only.
var kubernetesKinds = map[study.ExperimentKind]bool{
	study.KindFixedRate: true, study.KindSoak: true, study.KindSteps: true, study.KindConnections: true, study.KindCapacity: true,
	study.KindUsers: true,
}

// checkKubernetes refuses, before anything is created, what cannot be done on
// Kubernetes yet, at the study file's field: meshes that cannot be installed there, and,
// when measure is set, experiments that cannot be measured there.
func (r *run) checkKubernetes(measure bool) error {
	st := r.Study()
	if st.Spec.Substrate.Kubernetes.Image == "" {
		return st.ErrorAt("spec.substrate.kubernetes.image", errors.New("missing: the meshmark image the pods run (build one with `meshmark image build`)"))
	}
	for i, m := range st.Spec.Meshes {
		if _, err := kubernetesInstall(m); err != nil {
			field := fmt.Sprintf("spec.meshes[%d].profile", i)
			var oe *mesh.OptionError
			if errors.As(err, &oe) {
				field, err = fmt.Sprintf("spec.meshes[%d].options.%s", i, oe.Key), errors.New(oe.Msg+" on Kubernetes")
			}
			return st.ErrorAt(field, err)
		}
	}
	if err := checkClusterNetwork(st); err != nil {
		return err
	}
	if err := checkVersionSplit(st, r.Graph()); err != nil {
		return err
	}
	if err := checkKeptUpOnCluster(st); err != nil {
		return err
	}
	if err := checkIngress(st); err != nil {
		return err
	}
	if !measure {
		return nil
	}
	for i, e := range st.Spec.Experiments {
		p := fmt.Sprintf("spec.experiments[%d]", i)
		switch {
		case !kubernetesKinds[e.Kind]:
			return st.ErrorAt(p+".kind", fmt.Errorf("kind %s is not measured on Kubernetes yet (fixed-rate, soak, steps, connections, capacity and users are; the local substrate runs every kind)", e.Kind))
		}
	}
	return nil
}

// checkIngress refuses the ingress path for a mesh with a gateway of its own
// (mesh.IngressGateway: Istio's, which originates its mTLS) that its Kubernetes install
// does not deploy (meshkube.IngressInstall): the plain gateway with the mesh's proxy
// beside it would be a different path from the one the local testbed measures, and
// from the one its users take.
func checkIngress(st *study.Study) error {
	i := st.IngressExperiment()
	if i < 0 {
		return nil
	}
	for _, m := range st.Spec.Meshes {
		p, err := mesh.New(m.Profile, m.Options)
		if err != nil {
			continue // the profile's own check names it
		}
		plan, err := kubernetesInstall(m)
		if err != nil {
			continue // so does the mesh's check
		}
		if _, own := p.(mesh.IngressGateway); own && (plan == nil || plan.Ingress == nil) {
			return st.ErrorAt(fmt.Sprintf("spec.experiments[%d].path", i), fmt.Errorf("mesh %s (%s) has an ingress gateway of its own, which is not deployed on Kubernetes yet; "+
				"the plain gateway is, for meshes without one (the local testbed deploys both)", m.Name, m.Profile))
		}
	}
	return nil
}

// checkVersionSplit refuses a graph whose versions' weights a cluster would not keep.
// A Service spreads its requests over all its pods, whatever their version, and the
// baseline has nothing else to split them with; so on Kubernetes the weights are carried
// by the replicas, which must be in the ratio of the weights for every mesh and the
// baseline to serve the mix the graph means.
func checkVersionSplit(st *study.Study, g *workload.Graph) error {
	for _, s := range g.Services {
		if len(s.Versions) < 2 {
			continue
		}
		first := s.Versions[0]
		proportional := true
		divisor := 0
		var weights, replicas []string
		for _, v := range s.Versions {
			if v.Weight*max(first.Replicas, 1) != first.Weight*max(v.Replicas, 1) {
				proportional = false
			}
			divisor = gcd(divisor, v.Weight)
			weights = append(weights, strconv.Itoa(v.Weight))
			replicas = append(replicas, strconv.Itoa(max(v.Replicas, 1)))
		}
		if proportional {
			continue
		}
		var want []string
		for _, v := range s.Versions {
			want = append(want, strconv.Itoa(v.Weight/max(divisor, 1)))
		}
		how := "give its versions replicas in the ratio of their weights (" + strings.Join(want, ", ") + ", or a multiple)"
		if slices.Contains(weights, "0") {
			how = "leave out the versions of weight 0, which a Service would still send their share, and give the others replicas in the ratio of their weights"
		}
		return st.ErrorAt("spec.workload.graph", fmt.Errorf("graph %s: service %s splits its requests by weights %s over versions of %s replicas: on Kubernetes a Service spreads requests over all its pods, so the versions' shares follow their replicas; %s",
			g.Name, s.Name, strings.Join(weights, ":"), strings.Join(replicas, ", "), how))
	}
	return nil
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// connectKubernetes reaches the study's cluster with its placement settings.
func (r *run) connectKubernetes(ctx context.Context) (*kube.Cluster, error) {
	k := r.Study().Spec.Substrate.Kubernetes
	c, err := kube.Connect(ctx, kube.Config{
		Kubeconfig: k.Kubeconfig, Context: k.Context, NamespacePrefix: k.NamespacePrefix,
		AppNodeSelector: k.SUTNodeSelector, LoadgenNodeSelector: k.LoadgenNodeSelector, Image: k.Image,
		Timeout: k.ReadyTimeout.D(), RunnerVersion: r.Options().Version,
	})
	if err != nil {
		return nil, fmt.Errorf("%s: spec.substrate.kubernetes: %w", r.Study().File, err)
	}
	return c, nil
}

// checkPlacement refuses, before anything is created, a node selector of the study that
// no node of the cluster matches, and says where the app's and the load generators'
// pods can go when they may share a node.
func (r *run) checkPlacement(ctx context.Context, c *kube.Cluster) error {
	p, err := c.CheckPlacement(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", r.Study().File, err)
	}
	k := r.Study().Spec.Substrate.Kubernetes
	if shared := p.Shared(); len(shared) > 0 {
		how := "no node selectors set"
		if len(k.SUTNodeSelector) > 0 || len(k.LoadgenNodeSelector) > 0 {
			how = "the node selectors both match it"
		}
		r.Note(fmt.Sprintf("placement: the app's pods and the load generators may share node %s (%s): they then compete for its CPUs", strings.Join(shared, ", "), how))
	}
	return nil
}

// checkInstallRights asks the cluster, before anything is created, whether this user
// may do what installing each mesh of the study asks of meshmark's own requests (its
// CRDs, its requirements' lookups, its manifests' and Gateways' kinds), so that the third
// mesh's denial is not found hours into the run.
func (r *run) checkInstallRights(ctx context.Context, c *kube.Cluster) error {
	for _, m := range r.Study().Spec.Meshes {
		plan, err := kubernetesInstall(m)
		if err != nil || plan == nil {
			continue // checkKubernetes names the error; the baseline installs nothing
		}
		if err := c.CheckInstallRights(ctx, plan.Manifests, plan.Gateways, plan.AppManifests); err != nil {
			return fmt.Errorf("%s: mesh %s: %w", r.Study().File, m.Name, err)
		}
	}
	return nil
}
