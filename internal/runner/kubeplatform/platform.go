// Package kubeplatform is the runner's Kubernetes platform: it installs each mesh from
// its charts onto the study's cluster, deploys the workload and the load generators in
// a namespace named after the run, proves the mesh enrolled every pod (its own record,
// a plaintext probe, a burst every proxy must count), drives each load run from the
// generator pods, reads the containers' resources, the proxies' counters and what
// every pod served around it, and tears everything down. The runner keeps the plan,
// the translation of experiments into load and the assembly of trials; this package
// registers itself for spec.substrate.kubernetes and brings only what a cluster does
// its own way.
package kubeplatform

import (
	"context"
	"fmt"
	"time"

	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/runner"
	"github.com/meshmark/meshmark/internal/study"
	"github.com/meshmark/meshmark/internal/substrate/kube"
)

func init() {
	runner.RegisterPlatform(runner.PlatformKind{
		Substrate: "kubernetes",
		Check:     func(h *runner.Host) error { return (&run{Host: h}).checkKubernetes(true) },
		Open:      open,
	})
}

// run is a run on a cluster: the runner's host, and what outlives one deployment.
type run struct {
	*runner.Host
	// network is a mesh that is the cluster's pod network (Cilium), kept installed
	// between its bring-ups and reconfigured in place, until the run ends.
	network *kube.MeshInstall
}

// open reaches the study's cluster and checks, before anything is created, that this
// user may install every mesh and that the node selectors match nodes; the run is
// stored with the cluster's provenance.
func open(ctx context.Context, h *runner.Host) (func(ctx context.Context) error, error) {
	r := &run{Host: h}
	c, err := r.connectKubernetes(ctx)
	if err != nil {
		return nil, err
	}
	if err := r.checkInstallRights(ctx, c); err != nil {
		return nil, err
	}
	if err := r.checkPlacement(ctx, c); err != nil {
		return nil, err
	}
	r.Note(fmt.Sprintf("cluster %s (context %s)", c.Server, c.ContextName))
	// The run's provenance is the cluster's, beside the machine that drove it.
	cp, err := c.Describe(ctx)
	if err != nil {
		r.Note(fmt.Sprintf("warning: the cluster's nodes and versions are not recorded with the run: %v", err))
	} else {
		r.Note(describeCluster(cp))
	}
	h.Describe("kubernetes", cp)
	return func(ctx context.Context) error {
		if h.Study().Spec.KeepMeshesUp {
			// the other meshes' pods sit idle beside every trial, on the same nodes
			err := h.UpdateProvenance(ctx, func(p *results.Provenance) bool {
				p.Placement["meshes-up"] = "all together, each in a namespace of its own, on the same nodes"
				return true
			})
			if err != nil {
				return err
			}
		}
		return runner.Walk(ctx, h, &platform{r: r, c: c})
	}, nil
}

// platform is a Kubernetes cluster as the runner walks a plan over it: each deployment
// is a mesh installed from its charts and the workload in a namespace named after the
// run.
type platform struct {
	r *run
	c *kube.Cluster
}

func (p *platform) BringUp(ctx context.Context, t *study.Trial) (*kubeDeployment, error) {
	r := p.r
	r.Phase(fmt.Sprintf("bring-up %s (repeat %d) on %s", t.Mesh.Name, t.Repeat+1, p.c.Server))
	// The namespaces carry the stored run's id, so that the id `meshmark ls` and the
	// report show is the one `meshmark clean --kubernetes RUN` takes.
	d, err := r.bringUpKube(ctx, p.c, r.RunID(), t.Mesh, true)
	if err != nil {
		return d, err
	}
	r.Note(fmt.Sprintf("%s up in %s: namespace %s, %d load generators (%s)", t.Mesh.Name, d.took.Round(100*time.Millisecond),
		d.app.Namespace, len(d.forwards.Generators), describeGenerators(d.forwards.Generators)))
	r.containerFaults(ctx, d, true) // the first reading: what a trial's faults are measured from
	return d, nil
}

func (p *platform) Measure(ctx context.Context, d *kubeDeployment, t *study.Trial) error {
	return p.r.RunLoad(t, p.r.kubeLoad(ctx, d, t))
}

func (p *platform) TearDown(d *kubeDeployment, final bool) { p.r.tearDownKube(p.c, d, final) }

func (p *platform) Finish() { p.r.uninstallNetwork(p.c) }
