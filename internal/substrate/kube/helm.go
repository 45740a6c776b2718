package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/cli"
	"helm.sh/helm/v3/pkg/releaseutil"
	authv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset/typed/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"sigs.k8s.io/yaml"
)

// Chart is one Helm chart to install, pinned: a mesh's result is only comparable with
// another's if both ran the same release of it.
type Chart struct {
	// Release is the Helm release name.
	Release string
	// Ref is a local chart directory or archive, or, with Repo, the chart's name there.
	Ref, Repo string
	// Version pins the chart; required with Repo.
	Version string
	// Namespace is where the release goes; meshmark creates it, labelled, when it does
	// not exist, and deletes it on uninstall.
	Namespace string
	// Values are the values a user sets; their number is part of the install's effort.
	Values map[string]any
	// Privileged creates the namespace, when meshmark creates it, labelled with Pod
	// Security's privileged level (meshkube.KubernetesInstall.PrivilegedNamespaces): its pods
	// need more than baseline admits.
	Privileged bool
	// Run, when set, is the run the install is for: the namespace meshmark creates
	// carries it (RunLabel), so that cleaning that run (`clean --kubernetes RUN`, after
	// a run that kept its deployments) takes the mesh's install too.
	Run string
}

// Effort is what installing a chart took, as a user would meet it: the "effort" column
// of a mesh comparison.
type Effort struct {
	// Ready is from the start of the install until every object of the release is
	// ready (Helm's wait).
	Ready time.Duration
	// Objects counts the Kubernetes objects the release created, CRDs included.
	Objects int
	// Kinds counts them by kind.
	Kinds map[string]int
	// CRDs lists the CustomResourceDefinitions the install added to the cluster.
	CRDs []string
	// Values counts the values the user set (leaves of Chart.Values).
	Values int
}

// Installed is a release meshmark installed, to be uninstalled with everything it
// added.
type Installed struct {
	Chart  Chart
	Effort Effort
	// createdNamespace is set when the namespace was made for the release.
	createdNamespace bool
}

// helmConfig is the Helm SDK's connection to this cluster, for one namespace.
func (c *Cluster) helmConfig(namespace string, logw io.Writer) (*action.Configuration, error) {
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig, flags.Context, flags.Namespace = &c.cfg.Kubeconfig, &c.ContextName, &namespace
	if c.cfg.Kubeconfig == "" {
		flags.KubeConfig = nil
	}
	cfg := new(action.Configuration)
	logger := log.New(logw, "helm: ", 0)
	if err := cfg.Init(flags, namespace, "secret", logger.Printf); err != nil {
		return nil, fmt.Errorf("helm: %w", err)
	}
	return cfg, nil
}

// Install installs the chart, waits until all its objects are ready (at most the
// cluster's timeout) and measures the effort. While Helm waits, the pods the release
// adds to its namespace are watched: progress hears how many are ready, and a pod the
// cluster says cannot get ready (StuckError) ends the install at once with the reason,
// as does Helm's own time limit with what the pods wait for, and a DaemonSet of the
// release that runs on no node. On failure it removes what it installed. Helm's own
// messages go to logw.
func (c *Cluster) Install(ctx context.Context, ch Chart, logw io.Writer, progress func(WaitProgress)) (inst *Installed, err error) {
	if ch.Repo != "" && ch.Version == "" {
		return nil, fmt.Errorf("chart %s from %s: no version: pin one, so that runs are comparable", ch.Ref, ch.Repo)
	}
	if logw == nil {
		logw = io.Discard
	}
	if err := c.checkRights(ctx, meshRights, "installing chart "+ch.Ref); err != nil {
		return nil, err
	}
	crdsBefore, err := c.crdNames(ctx)
	if err != nil {
		return nil, err
	}
	inst = &Installed{Chart: ch}
	defer func() {
		if err != nil {
			// A failed install may have added CRDs all the same (Helm applies crds/
			// first); they go with the rest.
			if added, aerr := c.addedCRDs(context.WithoutCancel(ctx), crdsBefore); aerr == nil {
				inst.Effort.CRDs = added
			}
			err = errors.Join(err, c.Uninstall(context.WithoutCancel(ctx), inst, logw))
			inst = nil
		}
	}()
	// What a namespace that is not meshmark's already holds (kube-system's, under
	// Cilium) is not the release's: its wait leaves it out.
	var before map[types.UID]bool
	if _, err := c.client.CoreV1().Namespaces().Get(ctx, ch.Namespace, metav1.GetOptions{}); IsNotFound(err) {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
			Name:        ch.Namespace,
			Labels:      map[string]string{ManagedByLabel: ManagedBy},
			Annotations: map[string]string{OwnerAnnotation: ownerRecord()},
		}}
		if ch.Run != "" {
			ns.Labels[RunLabel] = dnsLabel(ch.Run)
		}
		if ch.Privileged {
			ns.Labels[meshkube.PodSecurityEnforce] = meshkube.PodSecurityPrivileged
		}
		if _, err := c.client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			return inst, fmt.Errorf("create namespace %s: %w", ch.Namespace, err)
		}
		inst.createdNamespace = true
	} else if err != nil {
		return inst, fmt.Errorf("namespace %s: %w", ch.Namespace, err)
	} else if before, err = c.existingUIDs(ctx, ch.Namespace); err != nil {
		return inst, err
	}
	cfg, err := c.helmConfig(ch.Namespace, logw)
	if err != nil {
		return inst, err
	}
	install := action.NewInstall(cfg)
	install.ReleaseName, install.Namespace = ch.Release, ch.Namespace
	install.Wait, install.Timeout = true, c.cfg.Timeout
	install.RepoURL, install.Version = ch.Repo, ch.Version
	path, err := install.LocateChart(ch.Ref, cli.New())
	if err != nil {
		return inst, fmt.Errorf("chart %s: %w", ch.Ref, err)
	}
	loaded, err := loader.Load(path)
	if err != nil {
		return inst, fmt.Errorf("chart %s: %w", ch.Ref, err)
	}
	if err := loadLocalDependencies(loaded, path); err != nil {
		return inst, fmt.Errorf("chart %s: %w", ch.Ref, err)
	}
	start := time.Now()
	// The chart's crds/ are applied here rather than by Helm, labelled with their owner,
	// so that `meshmark clean --kubernetes` can remove them after a killed run: Helm
	// neither labels nor ever deletes them.
	if err := c.createCRDs(ctx, loaded, ch); err != nil {
		return inst, err
	}
	install.SkipCRDs = true
	// Helm's wait knows only ready or not; the watch knows when waiting is pointless.
	// Cancelling stops the wait at once (Helm's own waiter keeps polling until its time
	// limit in the background, and then finds the release uninstalled).
	wctx, stop := context.WithCancelCause(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		c.watchInstall(wctx, stop, ch.Namespace, before, progress)
	}()
	rel, err := install.RunWithContext(wctx, loaded, ch.Values)
	stop(nil)
	<-watched
	if err != nil {
		var stuck *StuckError
		if errors.As(context.Cause(wctx), &stuck) && ctx.Err() == nil {
			err = stuck
		} else if why := c.whyPodsWait(context.WithoutCancel(ctx), ch.Namespace, before); why != "" {
			err = fmt.Errorf("%w (spec.substrate.kubernetes.readyTimeout %s)%s", err, c.cfg.Timeout, why)
		}
		return inst, fmt.Errorf("install %s (chart %s %s) into %s: %w", ch.Release, loaded.Name(), loaded.Metadata.Version, ch.Namespace, err)
	}
	if err := c.daemonSetsPlaced(ctx, ch.Namespace, ch.Release); err != nil {
		return inst, fmt.Errorf("install %s (chart %s %s) into %s: %w", ch.Release, loaded.Name(), loaded.Metadata.Version, ch.Namespace, err)
	}
	inst.Effort.Ready = time.Since(start)
	if inst.Effort.CRDs, err = c.addedCRDs(ctx, crdsBefore); err != nil {
		return inst, err
	}
	inst.Effort.Kinds = map[string]int{}
	for _, m := range releaseutil.SplitManifests(rel.Manifest) {
		var head struct {
			Kind string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(m), &head); err == nil && head.Kind != "" {
			inst.Effort.Kinds[head.Kind]++
			inst.Effort.Objects++
		}
	}
	// Helm applies crds/ outside the release's manifest.
	if n := len(loaded.CRDObjects()); n > 0 {
		inst.Effort.Kinds["CustomResourceDefinition"] += n
		inst.Effort.Objects += n
	}
	inst.Effort.Values = countLeaves(ch.Values)
	return inst, nil
}

// Upgrade changes an installed release to the chart's values in place (Helm's upgrade,
// waited for as Install waits, its pods watched the same way) and returns the effort of
// the change: its time to ready, the release's objects, the values set. The release
// keeps the CRDs and the namespace of its install, which Uninstall removes. A mesh
// that is the cluster's pod network (Cilium) changes its configuration so, as its docs
// do, rather than leave the cluster without one between two configurations.
func (c *Cluster) Upgrade(ctx context.Context, inst *Installed, ch Chart, logw io.Writer, progress func(WaitProgress)) error {
	if ch.Release != inst.Chart.Release || ch.Namespace != inst.Chart.Namespace {
		return fmt.Errorf("upgrade %s in %s to release %s in %s: not the same release", inst.Chart.Release, inst.Chart.Namespace, ch.Release, ch.Namespace)
	}
	if logw == nil {
		logw = io.Discard
	}
	before, err := c.existingUIDs(ctx, ch.Namespace)
	if err != nil {
		return err
	}
	cfg, err := c.helmConfig(ch.Namespace, logw)
	if err != nil {
		return err
	}
	up := action.NewUpgrade(cfg)
	up.Namespace, up.Wait, up.Timeout = ch.Namespace, true, c.cfg.Timeout
	up.RepoURL, up.Version = ch.Repo, ch.Version
	up.ResetValues, up.SkipCRDs = true, true
	path, err := up.LocateChart(ch.Ref, cli.New())
	if err != nil {
		return fmt.Errorf("chart %s: %w", ch.Ref, err)
	}
	loaded, err := loader.Load(path)
	if err != nil {
		return fmt.Errorf("chart %s: %w", ch.Ref, err)
	}
	if err := loadLocalDependencies(loaded, path); err != nil {
		return fmt.Errorf("chart %s: %w", ch.Ref, err)
	}
	start := time.Now()
	wctx, stop := context.WithCancelCause(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		c.watchInstall(wctx, stop, ch.Namespace, before, progress)
	}()
	rel, err := up.RunWithContext(wctx, ch.Release, loaded, ch.Values)
	stop(nil)
	<-watched
	if err != nil {
		var stuck *StuckError
		if errors.As(context.Cause(wctx), &stuck) && ctx.Err() == nil {
			err = stuck
		} else if why := c.whyPodsWait(context.WithoutCancel(ctx), ch.Namespace, before); why != "" {
			err = fmt.Errorf("%w (spec.substrate.kubernetes.readyTimeout %s)%s", err, c.cfg.Timeout, why)
		}
		return fmt.Errorf("upgrade %s (chart %s %s) in %s: %w", ch.Release, loaded.Name(), loaded.Metadata.Version, ch.Namespace, err)
	}
	if err := c.daemonSetsPlaced(ctx, ch.Namespace, ch.Release); err != nil {
		return fmt.Errorf("upgrade %s (chart %s %s) in %s: %w", ch.Release, loaded.Name(), loaded.Metadata.Version, ch.Namespace, err)
	}
	crds := inst.Effort.CRDs // the install's, which go at Uninstall
	inst.Chart.Values, inst.Chart.Version, inst.Chart.Ref, inst.Chart.Repo = ch.Values, ch.Version, ch.Ref, ch.Repo
	inst.Effort = Effort{Ready: time.Since(start), Kinds: map[string]int{}, Values: countLeaves(ch.Values), CRDs: crds}
	for _, m := range releaseutil.SplitManifests(rel.Manifest) {
		var head struct {
			Kind string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(m), &head); err == nil && head.Kind != "" {
			inst.Effort.Kinds[head.Kind]++
			inst.Effort.Objects++
		}
	}
	return nil
}

// watchInstall watches the pods an install adds to its namespace (all of them but
// exclude) until ctx ends: progress hears how many are ready as that changes, and a pod
// the cluster says cannot get ready ends the install (stop, with a StuckError).
func (c *Cluster) watchInstall(ctx context.Context, stop context.CancelCauseFunc, namespace string, exclude map[types.UID]bool, progress func(WaitProgress)) {
	last := ""
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
		stuck, p, err := c.podsWait(ctx, namespace, exclude)
		if err != nil {
			continue // the next round may list them; Helm's wait decides meanwhile
		}
		if stuck == "" {
			stuck = c.controllersStuck(ctx, namespace, exclude)
		}
		if stuck != "" {
			stop(&StuckError{Namespace: namespace, Why: stuck})
			return
		}
		if line := p.String(); progress != nil && p.Total > 0 && line != last {
			progress(p)
			last = line
		}
	}
}

// loadLocalDependencies adds the dependencies a chart directory names as file://
// paths and does not hold in its charts/ (Linkerd's charts depend on ../partials
// that way in their source), as `helm install --dependency-update` would, without
// writing into the chart's directory.
func loadLocalDependencies(ch *chart.Chart, path string) error {
	have := map[string]bool{}
	for _, d := range ch.Dependencies() {
		have[d.Name()] = true
	}
	for _, dep := range ch.Metadata.Dependencies {
		rel, ok := strings.CutPrefix(dep.Repository, "file://")
		if !ok || have[dep.Name] {
			continue
		}
		if !filepath.IsAbs(rel) {
			rel = filepath.Join(path, rel)
		}
		sub, err := loader.Load(rel)
		if err != nil {
			return fmt.Errorf("dependency %s (%s): %w", dep.Name, dep.Repository, err)
		}
		if sub.Name() != dep.Name {
			return fmt.Errorf("dependency %s (%s) is chart %s", dep.Name, dep.Repository, sub.Name())
		}
		ch.AddDependency(sub)
		have[dep.Name] = true
	}
	return nil
}

// ReleaseAnnotation names the Helm release (namespace/name) a CRD was installed for.
const ReleaseAnnotation = "meshmark.dev/release"

// createCRDs creates the chart's crds/ that the cluster does not have yet, labelled as
// meshmark's and annotated with the owner, and waits until the API server serves them.
func (c *Cluster) createCRDs(ctx context.Context, ch *chart.Chart, spec Chart) error {
	var created []string
	for _, obj := range ch.CRDObjects() {
		for _, doc := range releaseutil.SplitManifests(string(obj.File.Data)) {
			var crd apiextv1.CustomResourceDefinition
			if err := yaml.Unmarshal([]byte(doc), &crd); err != nil {
				return fmt.Errorf("chart %s: %s: %w", ch.Name(), obj.Filename, err)
			}
			if crd.Name == "" {
				continue
			}
			if crd.Labels == nil {
				crd.Labels = map[string]string{}
			}
			if crd.Annotations == nil {
				crd.Annotations = map[string]string{}
			}
			crd.Labels[ManagedByLabel] = ManagedBy
			crd.Annotations[OwnerAnnotation] = ownerRecord()
			crd.Annotations[ReleaseAnnotation] = spec.Namespace + "/" + spec.Release
			_, err := c.crdClient().Create(ctx, &crd, metav1.CreateOptions{})
			switch {
			case apierrors.IsAlreadyExists(err):
				continue // the cluster's own, or another release's: not ours to own
			case err != nil:
				return fmt.Errorf("chart %s: create CustomResourceDefinition %s: %w", ch.Name(), crd.Name, err)
			}
			created = append(created, crd.Name)
		}
	}
	deadline := time.Now().Add(c.cfg.Timeout)
	for _, name := range created {
		for {
			crd, err := c.crdClient().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if established(crd) {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("CustomResourceDefinition %s not established after %s", name, c.cfg.Timeout)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}

func established(crd *apiextv1.CustomResourceDefinition) bool {
	for _, cond := range crd.Status.Conditions {
		if cond.Type == apiextv1.Established && cond.Status == apiextv1.ConditionTrue {
			return true
		}
	}
	return false
}

// Uninstall removes the release, the CRDs its install added (Helm leaves CRDs behind on
// purpose; a benchmark must not) and the namespace if it was made for the release.
func (c *Cluster) Uninstall(ctx context.Context, inst *Installed, logw io.Writer) error {
	if inst == nil {
		return nil
	}
	if logw == nil {
		logw = io.Discard
	}
	var errs []error
	cfg, err := c.helmConfig(inst.Chart.Namespace, logw)
	if err == nil {
		un := action.NewUninstall(cfg)
		un.Wait, un.Timeout = true, c.cfg.Timeout
		if _, err := un.Run(inst.Chart.Release); err != nil && !strings.Contains(err.Error(), "not found") {
			errs = append(errs, fmt.Errorf("uninstall %s: %w", inst.Chart.Release, err))
		}
	} else {
		errs = append(errs, err)
	}
	if err := c.deleteCRDs(ctx, inst.Effort.CRDs); err != nil {
		errs = append(errs, err)
	}
	if inst.createdNamespace {
		if err := c.deleteNamespaces(ctx, []string{inst.Chart.Namespace}, nil); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// deleteCRDs deletes the CRDs and waits until they are gone, which is once the API
// server has deleted their remaining custom resources.
func (c *Cluster) deleteCRDs(ctx context.Context, names []string) error {
	var errs []error
	for _, name := range names {
		if err := c.crdClient().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete CustomResourceDefinition %s: %w", name, err))
		}
	}
	for deadline := time.Now().Add(deleteTimeout); len(names) > 0; {
		left, err := c.crdNames(ctx)
		if err != nil {
			return errors.Join(append(errs, err)...)
		}
		var still []string
		for _, name := range names {
			if left[name] {
				still = append(still, name)
			}
		}
		if len(still) == 0 {
			break
		}
		if time.Now().After(deadline) {
			errs = append(errs, fmt.Errorf("CustomResourceDefinitions still terminating after %s: %s", deleteTimeout, strings.Join(still, ", ")))
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return errors.Join(errs...)
}

// RequireCRDs checks that the cluster has every CustomResourceDefinition named (like
// peerauthentications.security.istio.io), so that a mesh's configuration is refused
// with a clear message before anything is applied, not half-way through.
func (c *Cluster) RequireCRDs(ctx context.Context, why string, names ...string) error {
	if err := c.checkRights(ctx, []authv1.ResourceAttributes{{Verb: "list", Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions"}}, "looking for CRDs"); err != nil {
		return err
	}
	have, err := c.crdNames(ctx)
	if err != nil {
		return err
	}
	var missing []string
	for _, n := range names {
		if !have[n] {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("cluster %s (context %s) lacks CustomResourceDefinition %s: %s", c.Server, c.ContextName, strings.Join(missing, ", "), why)
	}
	return nil
}

// addedCRDs lists the CRDs the cluster has now that were not in before, sorted.
func (c *Cluster) addedCRDs(ctx context.Context, before map[string]bool) ([]string, error) {
	now, err := c.crdNames(ctx)
	if err != nil {
		return nil, err
	}
	var added []string
	for name := range now {
		if !before[name] {
			added = append(added, name)
		}
	}
	sort.Strings(added)
	return added, nil
}

func (c *Cluster) crdNames(ctx context.Context) (map[string]bool, error) {
	list, err := c.crdClient().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("cluster %s: list CustomResourceDefinitions: %w", c.Server, err)
	}
	names := map[string]bool{}
	for _, crd := range list.Items {
		names[crd.Name] = true
	}
	return names, nil
}

// countLeaves counts the scalar values in a values tree: what a user had to decide.
func countLeaves(v any) int {
	switch x := v.(type) {
	case map[string]any:
		n := 0
		for _, e := range x {
			n += countLeaves(e)
		}
		return n
	case []any:
		n := 0
		for _, e := range x {
			n += countLeaves(e)
		}
		return n
	case nil:
		return 0
	default:
		return 1
	}
}

func (c *Cluster) crdClient() apiextclient.CustomResourceDefinitionInterface {
	return c.ext.ApiextensionsV1().CustomResourceDefinitions()
}
