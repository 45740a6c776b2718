package kubeplatform

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/meshmark/meshmark/internal/loadgen"
	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	"github.com/meshmark/meshmark/internal/mesh/meshprobe"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/study"
	"github.com/meshmark/meshmark/internal/substrate/kube"
	"github.com/meshmark/meshmark/internal/topology"
	"github.com/meshmark/meshmark/internal/workload"
)

// generatorDialLimit is how long a freshly ready generator pod may take to accept its
// port-forwarded connection: its process may still be starting.
const generatorDialLimit = 30 * time.Second

// kubernetesInstall is how a mesh of the study goes onto a cluster: nil for the
// baseline, which installs nothing; an error for a profile or option that cannot be
// carried there yet.
func kubernetesInstall(m study.Mesh) (*meshkube.KubernetesInstall, error) {
	if m.Profile == study.ProfileNone {
		return nil, nil
	}
	p, err := mesh.New(m.Profile, m.Options)
	if err != nil {
		return nil, err
	}
	ki, ok := p.(mesh.KubernetesInstaller)
	if !ok {
		return nil, fmt.Errorf("profile %s cannot be installed on Kubernetes yet (the local substrate runs it); profiles on Kubernetes: %s",
			m.Profile, strings.Join(append([]string{study.ProfileNone}, mesh.KubernetesProfiles()...), ", "))
	}
	install, err := ki.Kubernetes()
	if err != nil {
		return nil, err
	}
	return &install, nil
}

// helmCharts are a mesh's charts as the Kubernetes substrate installs them for run.
func helmCharts(in *meshkube.KubernetesInstall, run string) []kube.Chart {
	var out []kube.Chart
	for _, ch := range in.Charts {
		out = append(out, kube.Chart{Release: ch.Release, Namespace: ch.Namespace, Ref: ch.Chart, Repo: ch.Repo, Version: ch.Version, Values: ch.Values,
			Privileged: slices.Contains(in.PrivilegedNamespaces, ch.Namespace), Run: run})
	}
	return out
}

// kubeDeployment is one mesh's workload on the cluster with its load generators, ready
// for load.
type kubeDeployment struct {
	mesh     *study.Mesh
	cluster  *kube.Cluster
	install  *kube.MeshInstall
	app      *kube.App
	forwards *kube.Forwards
	pool     *loadgen.Pool
	took     time.Duration
	// resources is which containers the trials' resources cover and what each is for.
	resources kube.ResourceScope
	// proxies are where the mesh's proxies serve their own counters, read before and
	// after every trial; services are the app's, which node proxies count into.
	proxies  []meshkube.ProxyEndpoint
	services []string
	// mixUnread says why the request mix is not checked on this bring-up: its pods
	// could not be read.
	mixUnread string
	// network says the mesh is the cluster's pod network (Cilium): its install
	// outlives the bring-up (run.network).
	network bool
	// runs is the last reading of the system under test's containers: a container
	// started again since, or a pod gone, is a fault (containerFaults).
	runs kube.ContainerRuns
	// runsUnread says a reading failed, and that was said.
	runsUnread bool
	// ingress is where the ingress path's requests go; nil when no experiment takes it.
	ingress *ingress
}

// readProxies reads every proxy of the mesh now, through the API server: none for a
// mesh without proxies.
func (d *kubeDeployment) readProxies(ctx context.Context) []meshkube.ProxyCounters {
	if len(d.proxies) == 0 {
		return nil
	}
	return d.cluster.ReadProxyCounters(ctx, d.app, d.proxies, d.services)
}

// appSpec is a mesh's workload for the cluster: the graph's deployments, running
// `meshmark-pod service` with the graph the pods can read, and the study's generators.
func (r *run) appSpec(run string, m *study.Mesh) (kube.AppSpec, error) {
	graphArg, files, err := r.kubeGraph()
	if err != nil {
		return kube.AppSpec{}, err
	}
	spread, err := kubeSpread(r.Graph(), m)
	if err != nil {
		return kube.AppSpec{}, err
	}
	return kube.AppSpec{
		Run: run, Mesh: m.Name, Deployments: r.Graph().Deployments(), Files: files,
		Generators:     r.Study().Spec.Substrate.Kubernetes.Generators,
		SpreadServices: len(spread) > 0,
		Args: func(d workload.Deployment) []string {
			args := r.Graph().ServiceArgs(d, kube.PodNameArg)
			for i := range args {
				if args[i] == "--graph" && i+1 < len(args) {
					args[i+1] = graphArg
				}
			}
			return append(args, spread...)
		},
	}, nil
}

// kubeGraph is the --graph argument for the pods and the files they need: a built-in
// graph by name, a graph file through the ConfigMap mounted at kube.FilesDir.
func (r *run) kubeGraph() (string, map[string][]byte, error) {
	w := r.Study().Spec.Workload
	if !w.IsGraphFile() {
		return r.Graph().Origin, nil, nil
	}
	data, err := os.ReadFile(r.Study().Resolve(w.Graph))
	if err != nil {
		return "", nil, err
	}
	name := "graph-" + filepath.Base(w.Graph)
	return filepath.Join(kube.FilesDir, name), map[string][]byte{name: data}, nil
}

// kubeSpread is how the workload of a mesh that balances per request with no proxy (the
// baseline's `balancing: per-request`, mesh.Spreader) spreads its calls on a cluster:
// `--spread` over each service's versions' headless Services (kube.SpreadServiceName),
// each name standing for every ready pod of its version, weighted by the version's
// weight (a version's weight shared among its pods, as the local profile shares it;
// were every weight 0, every pod alike). None for the meshes, whose
// proxies balance per request, and for `balancing: per-connection`.
func kubeSpread(g *workload.Graph, m *study.Mesh) ([]string, error) {
	p, err := mesh.New(m.Profile, m.Options)
	if err != nil {
		return nil, err
	}
	sp, ok := p.(mesh.Spreader)
	if !ok || sp.Balancing() != mesh.BalancePerRequest {
		return nil, nil
	}
	var args []string
	for _, s := range g.Services {
		split := false
		for _, v := range s.Versions {
			split = split || v.Weight > 0
		}
		var eps []workload.Endpoint
		for _, v := range s.Versions {
			w := 1000 * max(v.Replicas, 1) // an unsplit service: every pod alike
			if split {
				w = v.Weight
			}
			if w > 0 {
				eps = append(eps, workload.Endpoint{Addr: net.JoinHostPort(kube.SpreadServiceName(s.Name, v.Name), strconv.Itoa(s.Port)), Weight: w})
			}
		}
		args = append(args, "--spread", workload.FormatSpread(s.Name, eps))
	}
	return args, nil
}

// bringUpKube installs the mesh, deploys its workload and generators, waits until
// every pod is ready, checks that the mesh enrolled every pod, and, with connect,
// connects to each generator through its port-forward and proves with a burst of load
// through them that every proxy of the mesh carried traffic (proveTraffic). It returns
// what it created even when it fails, for teardown.
func (r *run) bringUpKube(ctx context.Context, c *kube.Cluster, run string, m *study.Mesh, connect bool) (*kubeDeployment, error) {
	start := time.Now()
	d := &kubeDeployment{mesh: m, cluster: c}
	plan, err := kubernetesInstall(*m)
	if err != nil {
		return nil, err
	}
	spec, err := r.appSpec(run, m)
	if err != nil {
		return nil, err
	}
	if d.ingress, err = r.planIngress(plan, &spec, c.NamespaceFor(run, m.Name)); err != nil {
		return nil, err
	}
	if plan != nil && plan.ForLocalCluster != nil {
		if err := r.adaptToLocalCluster(ctx, c, m, plan); err != nil {
			return nil, err
		}
	}
	if plan != nil {
		d.network = plan.ClusterNetwork
		verb := "installing"
		if d.network && r.network != nil {
			verb = "reconfiguring in place"
		}
		var shown time.Time
		progress := func(release string, p kube.WaitProgress) {
			if time.Since(shown) > 2*time.Second || p.Ready == p.Total {
				r.Note(fmt.Sprintf("%s: %s %s: %s", m.Name, verb, release, p))
				shown = time.Now()
			}
		}
		if d.network && r.network != nil {
			// The cluster's network from the last bring-up: uninstalling it would leave
			// the nodes without one, so it changes to this mesh's configuration in place.
			r.Note(fmt.Sprintf("%s: reconfiguring the cluster's network in place (Helm upgrade of %s)", m.Name, describeCharts(plan.Charts)))
			d.install, r.network = r.network, nil
			if err := c.ReconfigureMesh(ctx, d.install, helmCharts(plan, run), plan.Manifests, r.helmLog(m.Name), progress); err != nil {
				return d, fmt.Errorf("mesh %s: %w", m.Name, err)
			}
		} else {
			r.Note(fmt.Sprintf("%s: installing %s", m.Name, describeCharts(plan.Charts)))
			if d.install, err = installKubeMesh(ctx, c, plan, run, r.helmLog(m.Name), progress); err != nil {
				return nil, fmt.Errorf("mesh %s: %w", m.Name, err)
			}
		}
		e := d.install.Effort
		r.Note(fmt.Sprintf("%s: installed in %s: %d objects, %d CRDs added, %d values set", m.Name, e.Ready.Round(100*time.Millisecond), e.Objects, len(e.CRDs), e.Values))
		if err := r.recordEffort(ctx, m, plan, e); err != nil {
			return d, err
		}
		spec.NamespaceLabels, spec.NamespaceAnnotations, spec.PodAnnotations = plan.NamespaceLabels, plan.NamespaceAnnotations, plan.PodAnnotations
		spec.Gateways, spec.Manifests, spec.Sidecar = plan.Gateways, plan.AppManifests, plan.Sidecar
	}
	d.app, err = c.Deploy(ctx, spec)
	if err != nil {
		return d, fmt.Errorf("mesh %s: %w", m.Name, err)
	}
	known := mesh.KnownClusterMarks()
	d.resources = kube.ResourceScope{Mesh: m.Name, App: d.app.Namespace, Sidecars: known.Sidecars, GatewayPodLabels: known.GatewayPodLabels}
	if plan != nil {
		if plan.Sidecar != "" && !slices.Contains(d.resources.Sidecars, plan.Sidecar) {
			d.resources.Sidecars = append(d.resources.Sidecars, plan.Sidecar)
		}
		d.resources.MeshPodLabels = plan.OwnPodLabels
		d.proxies = plan.Proxies
		for _, p := range plan.Proxies {
			if p.Namespace != "" {
				d.resources.NodeProxies = append(d.resources.NodeProxies, p.Labels)
			}
		}
	}
	for _, s := range r.Graph().Services {
		d.services = append(d.services, s.Name)
	}
	d.resources.AddMesh(d.install)
	last := time.Time{}
	err = c.WaitReady(ctx, d.app, func(p kube.WaitProgress) {
		if time.Since(last) > 2*time.Second || p.Ready == p.Total {
			r.Note(fmt.Sprintf("%s: %s", m.Name, p))
			last = time.Now()
		}
	})
	if err != nil {
		return d, fmt.Errorf("mesh %s: %w", m.Name, err)
	}
	r.recordImages(ctx, d)
	if plan != nil {
		// The enrollment check, in order: the mesh's own record on the cluster, the
		// plaintext probe where it promises to refuse plaintext, then (with the
		// generators connected) the burst that every proxy must have counted. It is
		// stored whatever it found, and the run stops unless it passed.
		enr, err := kubeEnrollment(ctx, c, d.app, m, plan)
		if err != nil {
			return d, fmt.Errorf("mesh %s: %w", m.Name, err)
		}
		if enr.Pass {
			r.Note(fmt.Sprintf("%s: every pod is in the mesh (%d pods; %s)", m.Name, len(enr.Pods), enrollmentProof(plan)))
		}
		if err := r.checkPlaintextOnCluster(ctx, c, run, d.app, m, plan, &enr); err != nil {
			return d, fmt.Errorf("mesh %s: %w", m.Name, err)
		}
		if enr.Pass && len(plan.Proxies) > 0 {
			if !connect {
				// meshmark deploy: no generator is driven, so no burst.
				why := "no probe burst sent: deploy drives no load generator, so that every pod's proxy carries traffic is not proven here (`meshmark run` proves it before it measures)"
				enr.Traffic = &mesh.TrafficProof{Notes: []string{why}}
				r.Note(fmt.Sprintf("%s: %s", m.Name, why))
			} else {
				if err := r.connectGenerators(ctx, c, d); err != nil {
					enr.Traffic = &mesh.TrafficProof{Notes: []string{"no probe burst was sent: the load generators could not be reached: " + err.Error()}}
					return d, errors.Join(fmt.Errorf("mesh %s: %w", m.Name, err), r.StoreEnrollment(context.WithoutCancel(ctx), m.Name, enr))
				}
				if err := r.proveTraffic(ctx, d, plan, &enr); err != nil {
					return d, fmt.Errorf("mesh %s: %w", m.Name, err)
				}
			}
		}
		if err := r.StoreEnrollment(ctx, m.Name, enr); err != nil {
			return d, err
		}
		if !enr.Pass {
			return d, fmt.Errorf("mesh %s is not set up as claimed, refusing to measure it: %s", m.Name, strings.Join(enr.Failures, "; "))
		}
	} else {
		enr, err := baselineEnrollment(ctx, c, d.app, m)
		if err != nil {
			return d, fmt.Errorf("mesh %s: %w", m.Name, err)
		}
		if err := r.StoreEnrollment(ctx, m.Name, enr); err != nil {
			return d, err
		}
		if !enr.Pass {
			return d, fmt.Errorf("mesh %s is not the baseline it claims, refusing to measure it: %s", m.Name, strings.Join(enr.Failures, "; "))
		}
		r.Note(fmt.Sprintf("%s: no pod is in a mesh (%d pods; none carries a sidecar of %s)", m.Name, len(enr.Pods),
			strings.Join(mesh.KnownClusterMarks().Sidecars, ", ")))
	}
	if connect && d.pool == nil {
		if err := r.connectGenerators(ctx, c, d); err != nil {
			return d, fmt.Errorf("mesh %s: %w", m.Name, err)
		}
		// Where no probe burst went first (no mesh, or none whose proxies count), the
		// first trial would be the first traffic: it must not meet a Service not yet
		// programmed (awaitEntry).
		if err := r.awaitEntry(ctx, d); err != nil {
			return d, fmt.Errorf("mesh %s: %w", m.Name, err)
		}
	}
	d.took = time.Since(start)
	return d, nil
}

// connectGenerators opens a port-forward to every generator and connects to each. A
// generator pod is ready as soon as its container runs, which may be before its process
// listens, and a forwarded connection that finds nothing ends the whole forward (as
// kubectl port-forward's does): so forwards that fail are opened again, until
// generatorDialLimit.
func (r *run) connectGenerators(ctx context.Context, c *kube.Cluster, d *kubeDeployment) error {
	deadline := time.Now().Add(generatorDialLimit)
	for {
		fw, err := c.ForwardGenerators(ctx, d.app)
		if err == nil {
			addrs := make([]string, len(fw.Generators))
			for i, g := range fw.Generators {
				addrs[i] = g.Addr
			}
			dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			d.pool, err = loadgen.Dial(dctx, addrs)
			cancel()
			if err == nil {
				d.forwards = fw
				return nil
			}
			err = fmt.Errorf("load generators %s: %w", describeGenerators(fw.Generators), err)
			fw.Close()
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(time.Second)
	}
}

// kubeEnrollment is the mesh's own record, on the cluster, that it enrolled every pod of
// the app: its sidecar in every pod spec, or the annotations it writes on the pods it
// took in.
func kubeEnrollment(ctx context.Context, c *kube.Cluster, app *kube.App, m *study.Mesh, plan *meshkube.KubernetesInstall) (mesh.Enrollment, error) {
	enr := mesh.Enrollment{Mesh: m.Name, Pass: true, CheckedAt: time.Now()}
	// The mode the study configured, which the mesh's install on the cluster carries
	// out (the report's security posture says it).
	if p, err := mesh.New(m.Profile, m.Options); err == nil {
		if withMode, ok := p.(interface{ MTLS() mesh.MTLSMode }); ok {
			enr.MTLS = withMode.MTLS()
		}
	}
	if err := nodeAgentEnrollment(ctx, c, app, plan, &enr); err != nil {
		return enr, err
	}
	if plan.Sidecar == "" && len(plan.EnrolledAnnotations) == 0 {
		return enr, nil
	}
	pods, err := c.Sidecars(ctx, app, plan.Sidecar)
	if err != nil {
		return enr, err
	}
	for _, p := range pods {
		pe := mesh.PodEnrollment{Pod: p.Pod, Service: p.App, Meshed: true, Sidecar: p.Sidecar}
		var missing []string
		if plan.Sidecar != "" && !p.Sidecar {
			missing = append(missing, "no "+plan.Sidecar+" container")
		}
		for _, k := range slices.Sorted(maps.Keys(plan.EnrolledAnnotations)) {
			if want := plan.EnrolledAnnotations[k]; p.Annotations[k] != want {
				missing = append(missing, fmt.Sprintf("no %s=%s", k, want))
			}
		}
		if len(missing) > 0 {
			enr.Pass = false
			enr.Failures = append(enr.Failures, fmt.Sprintf("pod %s has %s: the mesh did not take it in", p.Pod, strings.Join(missing, ", ")))
		}
		enr.Pods = append(enr.Pods, pe)
	}
	return enr, nil
}

// baselineEnrollment is the no-mesh configuration's check, as the local baseline's
// is: no pod of the app carries any known mesh's sidecar. A cluster whose mesh injects
// every namespace, or an injector left by an earlier install, would otherwise have the
// baseline measured through proxies.
func baselineEnrollment(ctx context.Context, c *kube.Cluster, app *kube.App, m *study.Mesh) (mesh.Enrollment, error) {
	bySidecar := map[string][]kube.PodSidecar{}
	for _, sidecar := range mesh.KnownClusterMarks().Sidecars {
		pods, err := c.Sidecars(ctx, app, sidecar)
		if err != nil {
			return mesh.Enrollment{Mesh: m.Name}, err
		}
		bySidecar[sidecar] = pods
	}
	return judgeBaseline(m.Name, bySidecar), nil
}

// judgeBaseline judges the app's pods, as listed for each known sidecar: the baseline
// passes when none carries one.
func judgeBaseline(name string, bySidecar map[string][]kube.PodSidecar) mesh.Enrollment {
	enr := mesh.Enrollment{Mesh: name, MTLS: mesh.MTLSOff, Pass: true, CheckedAt: time.Now()}
	sidecars := slices.Sorted(maps.Keys(bySidecar))
	carried := map[string][]string{}
	for _, sidecar := range sidecars {
		for _, p := range bySidecar[sidecar] {
			if p.Sidecar {
				carried[p.Pod] = append(carried[p.Pod], sidecar)
			}
		}
	}
	if len(sidecars) > 0 {
		// Every list holds the same pods.
		for _, p := range bySidecar[sidecars[0]] {
			enr.Pods = append(enr.Pods, mesh.PodEnrollment{Pod: p.Pod, Service: p.App})
		}
	}
	for i := range enr.Pods {
		if cs := carried[enr.Pods[i].Pod]; len(cs) > 0 {
			enr.Pods[i].Meshed, enr.Pods[i].Sidecar = true, true
			enr.Pass = false
			enr.Failures = append(enr.Failures, fmt.Sprintf("pod %s carries the sidecar %s: a mesh's injector took it in", enr.Pods[i].Pod, strings.Join(cs, " and ")))
		}
	}
	return enr
}

// plaintextRefusalPromised says whether the mesh, as the study configures it, refuses
// callers without a mesh identity: its security posture's promise, which its install
// on a cluster carries out (Istio's mesh-wide STRICT PeerAuthentication for mtls:
// strict, in sidecar and ambient mode; Linkerd's all-authenticated default inbound
// policy). The promise depends on the options only, not on the app.
func plaintextRefusalPromised(m study.Mesh) (bool, error) {
	if m.Profile == study.ProfileNone {
		return false, nil
	}
	p, err := mesh.New(m.Profile, m.Options)
	if err != nil {
		return false, err
	}
	sec, ok := p.(mesh.Secured)
	if !ok {
		return false, nil
	}
	return sec.SecurityPosture(&topology.App{}).RefusesPlaintext, nil
}

// checkPlaintextOnCluster is the other half of the enrollment check where the mesh
// promises to refuse plaintext, as the local profiles' checks do it: a caller with no
// mesh identity, pods meshmark starts outside the mesh, calls every service of the app
// in plaintext by its cluster name, and every one must refuse. It runs once every pod
// is enrolled: before that the run stops anyway, and plaintext served by a pod outside
// the mesh would only repeat the first half. A service that answers fails the check,
// naming the service and its answer; a probe that cannot run or report fails it too,
// saying why, so that refusal is never taken as proven when it was not tried. Only an
// interrupt is returned as an error.
func (r *run) checkPlaintextOnCluster(ctx context.Context, c *kube.Cluster, run string, app *kube.App, m *study.Mesh, plan *meshkube.KubernetesInstall, enr *mesh.Enrollment) error {
	if !enr.Pass {
		return nil
	}
	promised, err := plaintextRefusalPromised(*m)
	if err != nil || !promised {
		return err
	}
	r.Note(fmt.Sprintf("%s: the mesh should refuse plaintext: calling every service in plaintext from a pod outside the mesh", m.Name))
	res, err := c.ProbePlaintext(ctx, app, kube.PlaintextCheck{Run: run, Mesh: m.Name, Sidecar: plan.Sidecar, EnrolledAnnotations: plan.EnrolledAnnotations,
		Outside: mesh.KnownClusterMarks().Outside})
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if res.Probes == nil {
		enr.Fail("refusal of plaintext unproven: the plaintext probe could not run: %v", err)
		return nil
	}
	if err != nil {
		r.Note(fmt.Sprintf("warning: %s: %v; `meshmark clean --kubernetes` removes it", m.Name, err))
	}
	enr.JudgePlaintext(res.Probes, res.Control)
	r.Note(fmt.Sprintf("%s: %s", m.Name, meshprobe.DescribeProof(enr.Plaintext, enr.PlaintextControl)))
	return nil
}

// adaptToLocalCluster lets the mesh adapt its install to a local cluster (meshmark
// cluster up), when this is one, and records what that changed in the run's
// provenance, where the report shows it beside the components' versions.
func (r *run) adaptToLocalCluster(ctx context.Context, c *kube.Cluster, m *study.Mesh, plan *meshkube.KubernetesInstall) error {
	local, err := c.LocalCluster(ctx)
	if err != nil || local == "" {
		return err
	}
	notes, err := plan.ForLocalCluster(plan)
	if err != nil {
		return fmt.Errorf("mesh %s on local cluster %s: %w", m.Name, local, err)
	}
	return r.UpdateProvenance(ctx, func(p *results.Provenance) bool {
		if len(notes) == 0 {
			return false
		}
		if p.Components == nil {
			p.Components = map[string]string{}
		}
		for k, v := range notes {
			r.Note(fmt.Sprintf("%s on local cluster %s: %s: %s", m.Name, local, k, v))
			p.Components[k] = v
		}
		return true
	})
}

// describeCluster is the cluster's provenance in a line: its version, its nodes and
// what runs them.
func describeCluster(cp *results.ClusterProvenance) string {
	kinds := map[string]int{}
	var order []string
	for _, n := range cp.Nodes {
		k := fmt.Sprintf("kubelet %s, %s, kernel %s, %s", n.KubeletVersion, orUnknown(n.OSImage), orUnknown(n.KernelVersion), orUnknown(n.ContainerRuntime))
		if kinds[k] == 0 {
			order = append(order, k)
		}
		kinds[k]++
	}
	var parts []string
	for _, k := range order {
		parts = append(parts, fmt.Sprintf("%d× %s", kinds[k], k))
	}
	return fmt.Sprintf("cluster: Kubernetes %s, %d nodes (%s)", cp.ServerVersion, len(cp.Nodes), strings.Join(parts, "; "))
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// recordImages stores, with the run's provenance, the images the pods of the mesh's
// bring-up ran (the app's namespace and the namespaces meshmark made for the mesh), each
// with the digest its node resolved it to, once per image and digest: a tag that moves
// between bring-ups shows as two digests.
func (r *run) recordImages(ctx context.Context, d *kubeDeployment) {
	var readErr error
	err := r.UpdateProvenance(ctx, func(p *results.Provenance) (added bool) {
		cp := p.Cluster
		if cp == nil {
			return false
		}
		images, err := d.cluster.PodImages(ctx, d.mesh.Name, append([]string{d.app.Namespace}, d.install.OwnNamespaces()...)...)
		if err != nil {
			readErr = err
			return false
		}
		for _, im := range images {
			if !slices.ContainsFunc(cp.Images, func(have results.PodImage) bool {
				return have.Mesh == im.Mesh && have.Container == im.Container && have.Image == im.Image && have.ImageID == im.ImageID
			}) {
				cp.Images = append(cp.Images, im)
				added = true
			}
		}
		return added
	})
	if err = errors.Join(readErr, err); err != nil {
		r.Note(fmt.Sprintf("warning: %s: the images its pods ran are not recorded: %v", d.mesh.Name, err))
	}
}

// recordEffort stores, with the run's provenance, what installing the mesh took and
// which charts at which versions: the effort column of a comparison.
func (r *run) recordEffort(ctx context.Context, m *study.Mesh, plan *meshkube.KubernetesInstall, e kube.Effort) error {
	rec := results.InstallEffort{Manifests: plan.Manifests, Ready: e.Ready, Objects: e.Objects, Kinds: e.Kinds, CRDs: e.CRDs, Values: e.Values}
	for _, ch := range plan.Charts {
		rec.Charts = append(rec.Charts, results.InstalledChart{Release: ch.Release, Namespace: ch.Namespace, Chart: ch.Chart, Repo: ch.Repo, Version: ch.Version})
	}
	doc, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	return r.AddConfigs(ctx, results.NewGeneratedConfig(results.InstallEffortConfig, m.Name, m.Profile, doc))
}

// helmLog is where Helm's own messages go: a file under the run's log directory, when
// the run keeps logs.
func (r *run) helmLog(meshName string) io.Writer {
	if r.Options().LogDir == "" {
		return io.Discard
	}
	if err := os.MkdirAll(r.Options().LogDir, 0o755); err != nil {
		return io.Discard
	}
	f, err := os.OpenFile(filepath.Join(r.Options().LogDir, meshName+"-helm.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return io.Discard
	}
	return f
}

// enrollmentProof says what the enrollment check looked for.
func enrollmentProof(plan *meshkube.KubernetesInstall) string {
	var what []string
	if plan.Sidecar != "" {
		what = append(what, "each carries "+plan.Sidecar)
	}
	for _, k := range slices.Sorted(maps.Keys(plan.EnrolledAnnotations)) {
		what = append(what, "each marked "+k+"="+plan.EnrolledAnnotations[k])
	}
	for _, a := range plan.NodeAgents {
		what = append(what, "each on a node with a ready "+a.Component)
	}
	return strings.Join(what, ", ")
}

func describeCharts(charts []meshkube.HelmChart) string {
	var out []string
	for _, ch := range charts {
		s := ch.Chart
		if ch.Version != "" {
			s += " " + ch.Version
		}
		out = append(out, s+" into "+ch.Namespace)
	}
	return strings.Join(out, ", ")
}

// tearDownKube closes the generators' connections and forwards, removes the mesh's
// namespace and uninstalls the mesh, whatever state the run is in. With cleanup: false
// it keeps them when final, that is when the run ends with d up; before another
// bring-up it removes them all the same, since the next install would meet them.
func (r *run) tearDownKube(c *kube.Cluster, d *kubeDeployment, final bool) {
	if d == nil {
		return
	}
	if d.pool != nil {
		d.pool.Close()
	}
	if d.forwards != nil {
		d.forwards.Close()
	}
	if final && !r.Study().Spec.Substrate.Kubernetes.Cleanup {
		run := r.RunID()
		if run == "" {
			run = "RUN"
		}
		r.Note(fmt.Sprintf("%s kept (cleanup: false); remove it with `meshmark clean --kubernetes --all %s`", d.mesh.Name, run))
		return
	}
	start := time.Now()
	if d.app != nil {
		if err := c.Teardown(context.Background(), d.app); err != nil {
			r.Note(fmt.Sprintf("warning: %s: %v; `meshmark clean --kubernetes` removes what is left", d.mesh.Name, err))
			return
		}
	}
	what := "torn down"
	if d.app != nil {
		what += ", namespace " + d.app.Namespace + " removed"
	}
	switch {
	case d.install != nil && d.network:
		// The cluster's pod network stays until the run ends: the next bring-up of a
		// mesh of that kind reconfigures it in place (uninstallNetwork removes it).
		r.network = d.install
		what += ", the mesh kept as the cluster's network"
	case d.install != nil:
		if err := c.UninstallMesh(context.Background(), d.install, r.helmLog(d.mesh.Name)); err != nil {
			r.Note(fmt.Sprintf("warning: %s: uninstalling the mesh: %v; `meshmark clean --kubernetes` removes what is left", d.mesh.Name, err))
			return
		}
		what += ", mesh uninstalled"
	}
	r.Note(fmt.Sprintf("%s %s (%s)", d.mesh.Name, what, time.Since(start).Round(100*time.Millisecond)))
}

// uninstallNetwork uninstalls the mesh kept as the cluster's pod network, once the run
// has no more use for it.
func (r *run) uninstallNetwork(c *kube.Cluster) {
	if r.network == nil || !r.Study().Spec.Substrate.Kubernetes.Cleanup {
		return
	}
	start := time.Now()
	mi := r.network
	r.network = nil
	if err := c.UninstallMesh(context.Background(), mi, r.helmLog("network")); err != nil {
		r.Note(fmt.Sprintf("warning: uninstalling the cluster's network: %v; `meshmark clean --kubernetes` removes what is left", err))
		return
	}
	r.Note(fmt.Sprintf("the cluster's network uninstalled (%s)", time.Since(start).Round(100*time.Millisecond)))
}
