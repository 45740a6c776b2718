package kubeplatform

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/meshmark/meshmark/internal/runner"
	"github.com/meshmark/meshmark/internal/study"
	"github.com/meshmark/meshmark/internal/testbed"
)

// DeployOptions shape Deploy.
type DeployOptions struct {
	// Keep leaves the deployments in place instead of removing them once ready.
	Keep bool
	// Progress receives one line per step.
	Progress io.Writer
	// Version is meshmark's own version, which every pod's meshmark must have.
	Version string
}

// Deployed is one mesh's workload as brought up on the cluster.
type Deployed struct {
	Mesh, Namespace string
	Pods, Objects   int
	Ready           time.Duration
}

// Deploy brings the study's workload up on its Kubernetes cluster, one
// namespace per mesh, waits until every pod is ready, and tears it down again unless
// opts.Keep: the bring-up half of a run, which tells whether a cluster can host the
// study before an hour is spent on it. Everything is checked before the first object is
// created.
func Deploy(ctx context.Context, st *study.Study, opts DeployOptions) (deps []Deployed, err error) {
	k := st.Spec.Substrate.Kubernetes
	if k == nil {
		return nil, fmt.Errorf("%s: spec.substrate: the study runs on the local substrate; deploy is for spec.substrate.kubernetes", st.File)
	}
	h, err := runner.NewHost(st, runner.Options{Version: opts.Version}, opts.Progress)
	if err != nil {
		return nil, err
	}
	r := &run{Host: h}
	if err := r.checkKubernetes(false); err != nil {
		return nil, err
	}
	c, err := r.connectKubernetes(ctx)
	if err != nil {
		return nil, err
	}
	if err := r.checkInstallRights(ctx, c); err != nil {
		return nil, err
	}
	r.Note(fmt.Sprintf("cluster %s (context %s)", c.Server, c.ContextName))
	if err := r.checkPlacement(ctx, c); err != nil {
		return nil, err
	}
	run := testbed.NewRunID()
	for i, m := range st.Spec.Meshes {
		d, err := r.bringUpKube(ctx, c, run, &m, false)
		if err == nil {
			pods := d.app.Pods()
			objects := 1 + len(d.app.Deployments) + len(d.app.Services) + d.app.Files()
			if d.install != nil {
				objects += d.install.Effort.Objects
			}
			deps = append(deps, Deployed{Mesh: m.Name, Namespace: d.app.Namespace, Pods: pods, Objects: objects, Ready: d.took})
			r.Note(fmt.Sprintf("%s up in %s: namespace %s, %d pods", m.Name, d.took.Round(100*time.Millisecond), d.app.Namespace, pods))
		}
		if opts.Keep && err == nil {
			r.Note(fmt.Sprintf("%s kept; remove it with `meshmark clean --kubernetes --all %s`", m.Name, run))
			continue
		}
		// Teardown must run even when the wait was interrupted. cleanup: false keeps the
		// last mesh, as a run keeps the one up at its end.
		r.tearDownKube(c, d, err != nil || i == len(st.Spec.Meshes)-1)
		if err != nil {
			r.uninstallNetwork(c)
			return deps, err
		}
	}
	if !opts.Keep {
		r.uninstallNetwork(c)
	}
	return deps, nil
}
