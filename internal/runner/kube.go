package runner

import (
	"context"
	"errors"
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

// kubernetesProfiles are the mesh profiles the Kubernetes substrate can bring up so
// far. Every other profile runs on the local substrate only.
var kubernetesProfiles = map[string]bool{"none": true}

// DeployOptions shape DeployKubernetes.
type DeployOptions struct {
	// Keep leaves the deployments in place instead of removing them once ready.
	Keep bool
	// Progress receives one line per step.
	Progress io.Writer
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
	r := &runner{study: st}
	if err := r.prepareGraph(); err != nil {
		return nil, err
	}
	for i, m := range st.Spec.Meshes {
		if !kubernetesProfiles[m.Profile] {
			return nil, fmt.Errorf("%s: spec.meshes[%d] (%s): profile %s cannot be installed on Kubernetes yet (the local substrate runs it); profiles on Kubernetes: none",
				st.File, i, m.Name, m.Profile)
		}
	}
	if k.Image == "" {
		return nil, fmt.Errorf("%s: spec.substrate.kubernetes.image: missing: the meshmark image the pods run (build one with `meshmark image build`)", st.File)
	}
	graphArg, files, err := r.kubeGraph()
	if err != nil {
		return nil, err
	}
	c, err := kube.Connect(ctx, kube.Config{
		Kubeconfig: k.Kubeconfig, Context: k.Context, NamespacePrefix: k.NamespacePrefix,
		AppNodeSelector: k.SUTNodeSelector, LoadgenNodeSelector: k.LoadgenNodeSelector, Image: k.Image,
	})
	if err != nil {
		return nil, fmt.Errorf("%s: spec.substrate.kubernetes: %w", st.File, err)
	}
	fmt.Fprintf(progress, "cluster %s (context %s)\n", c.Server, c.ContextName)
	run := testbed.NewRunID()
	for _, m := range st.Spec.Meshes {
		start := time.Now()
		spec := kube.AppSpec{
			Run: run, Mesh: m.Name, Deployments: r.graph.Deployments(), Files: files, Generators: k.Generators,
			Args: func(d workload.Deployment) []string {
				args := r.graph.ServiceArgs(d, kube.PodNameArg)
				for i := range args {
					if args[i] == "--graph" && i+1 < len(args) {
						args[i+1] = graphArg
					}
				}
				return args
			},
		}
		app, err := c.Deploy(ctx, spec)
		if err != nil {
			return deps, errors.Join(fmt.Errorf("mesh %s: %w", m.Name, err), c.Teardown(context.WithoutCancel(ctx), app))
		}
		fmt.Fprintf(progress, "mesh %s: namespace %s: %d deployments, %d services\n", m.Name, app.Namespace, len(app.Deployments), len(app.Services))
		err = c.WaitReady(ctx, app, func(ready, total int) {
			fmt.Fprintf(progress, "mesh %s: %d/%d pods ready (%s)\n", m.Name, ready, total, time.Since(start).Round(100*time.Millisecond))
		})
		if err == nil {
			pods := 0
			for _, d := range spec.Deployments {
				pods += max(d.Replicas, 1)
			}
			pods += spec.Generators
			deps = append(deps, KubeDeployment{Mesh: m.Name, Namespace: app.Namespace, Pods: pods,
				Objects: 1 + len(app.Deployments) + len(app.Services) + min(len(files), 1), Ready: time.Since(start)})
		}
		if opts.Keep && err == nil {
			fmt.Fprintf(progress, "mesh %s: kept; remove it with `meshmark clean --kubernetes --all %s`\n", m.Name, run)
			continue
		}
		// Teardown must run even when the wait was interrupted.
		fmt.Fprintf(progress, "mesh %s: removing namespace %s\n", m.Name, app.Namespace)
		removing := time.Now()
		if terr := c.Teardown(context.WithoutCancel(ctx), app); terr != nil {
			err = errors.Join(err, terr)
		} else {
			fmt.Fprintf(progress, "mesh %s: namespace %s removed (%s)\n", m.Name, app.Namespace, time.Since(removing).Round(100*time.Millisecond))
		}
		if err != nil {
			return deps, fmt.Errorf("mesh %s: %w", m.Name, err)
		}
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
