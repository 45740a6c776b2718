package runner

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/meshmark/meshmark/internal/study"
	"github.com/meshmark/meshmark/internal/substrate/kube"
	"github.com/meshmark/meshmark/internal/testbed"
	"github.com/meshmark/meshmark/internal/workload"
)

// DeployOptions shape DeployKubernetes.
type DeployOptions struct {
	// Keep leaves the deployments in place instead of removing them once ready.
	Keep bool
	// Progress receives one line per step.
	Progress io.Writer
	// Version is meshmark's own version, which every pod's meshmark must have.
	Version string
}

// KubeDeployment is one mesh's workload as brought up on the cluster.
type KubeDeployment struct {
	Mesh, Namespace string
	Pods, Objects   int
	Ready           time.Duration
}

// DeployKubernetes brings the study's workload up on its Kubernetes cluster, one
// namespace per mesh, waits until every pod is ready, and tears it down again unless
// opts.Keep: the bring-up half of a run, which tells whether a cluster can host the
// study before an hour is spent on it. Everything is checked before the first object is
// created.
func DeployKubernetes(ctx context.Context, st *study.Study, opts DeployOptions) (deps []KubeDeployment, err error) {
	k := st.Spec.Substrate.Kubernetes
	if k == nil {
		return nil, fmt.Errorf("%s: spec.substrate: the study runs on the local substrate; deploy is for spec.substrate.kubernetes", st.File)
	}
	progress := opts.Progress
	if progress == nil {
		progress = io.Discard
	}
	r := &runner{study: st, opts: Options{Version: opts.Version}}
	if err := r.prepareGraph(); err != nil {
		return nil, err
	}
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
	r.progress = newProgress(progress, false, 0)
	r.progress.note(fmt.Sprintf("cluster %s (context %s)", c.Server, c.ContextName))
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
			deps = append(deps, KubeDeployment{Mesh: m.Name, Namespace: d.app.Namespace, Pods: pods, Objects: objects, Ready: d.took})
			r.progress.note(fmt.Sprintf("%s up in %s: namespace %s, %d pods", m.Name, d.took.Round(100*time.Millisecond), d.app.Namespace, pods))
		}
		if opts.Keep && err == nil {
			r.progress.note(fmt.Sprintf("%s kept; remove it with `meshmark clean --kubernetes --all %s`", m.Name, run))
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

// prepareGraph loads the study's graph with its replica overrides, as prepare does for
// a run.
func (r *runner) prepareGraph() error {
	w := r.study.Spec.Workload
	src := w.Graph
	if w.IsGraphFile() {
		src = r.study.Resolve(w.Graph)
	}
	g, err := workload.Load(src)
	if err != nil {
		return err
	}
	for svc, n := range w.Replicas {
		s := g.Service(svc)
		if s == nil {
			return fmt.Errorf("%s: spec.workload.replicas.%s: graph %s has no service %q", r.study.File, svc, g.Name, svc)
		}
		for _, v := range s.Versions {
			v.Replicas = n
		}
	}
	r.graph = g
	return nil
}

// kubeGraph is the --graph argument for the pods and the files they need: a built-in
// graph by name, a graph file through the ConfigMap mounted at kube.FilesDir.
func (r *runner) kubeGraph() (string, map[string][]byte, error) {
	w := r.study.Spec.Workload
	if !w.IsGraphFile() {
		return r.graph.Origin, nil, nil
	}
	data, err := os.ReadFile(r.study.Resolve(w.Graph))
	if err != nil {
		return "", nil, err
	}
	name := "graph-" + filepath.Base(w.Graph)
	return filepath.Join(kube.FilesDir, name), map[string][]byte{name: data}, nil
}
