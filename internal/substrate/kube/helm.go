package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"sort"
	"strings"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/cli"
	"helm.sh/helm/v3/pkg/releaseutil"
	corev1 "k8s.io/api/core/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset/typed/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
// cluster's timeout) and measures the effort. On failure it removes what it installed.
// Helm's own messages go to logw.
func (c *Cluster) Install(ctx context.Context, ch Chart, logw io.Writer) (inst *Installed, err error) {
	if ch.Repo != "" && ch.Version == "" {
		return nil, fmt.Errorf("chart %s from %s: no version: pin one, so that runs are comparable", ch.Ref, ch.Repo)
	}
	if logw == nil {
		logw = io.Discard
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
	if _, err := c.client.CoreV1().Namespaces().Get(ctx, ch.Namespace, metav1.GetOptions{}); IsNotFound(err) {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
			Name:        ch.Namespace,
			Labels:      map[string]string{ManagedByLabel: ManagedBy},
			Annotations: map[string]string{OwnerAnnotation: ownerRecord()},
		}}
		if _, err := c.client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			return inst, fmt.Errorf("create namespace %s: %w", ch.Namespace, err)
		}
		inst.createdNamespace = true
	} else if err != nil {
		return inst, fmt.Errorf("namespace %s: %w", ch.Namespace, err)
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
	start := time.Now()
	rel, err := install.RunWithContext(ctx, loaded, ch.Values)
	if err != nil {
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
	inst.Effort.Kinds["CustomResourceDefinition"] += len(loaded.CRDObjects())
	inst.Effort.Objects += len(loaded.CRDObjects())
	inst.Effort.Values = countLeaves(ch.Values)
	return inst, nil
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
	for _, name := range inst.Effort.CRDs {
		if err := c.crdClient().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete CustomResourceDefinition %s: %w", name, err))
		}
	}
	// A CRD goes once the API server has deleted its remaining custom resources.
	for deadline := time.Now().Add(deleteTimeout); len(inst.Effort.CRDs) > 0; {
		left, err := c.crdNames(ctx)
		if err != nil {
			errs = append(errs, err)
			break
		}
		var still []string
		for _, name := range inst.Effort.CRDs {
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
		time.Sleep(200 * time.Millisecond)
	}
	if inst.createdNamespace {
		if err := c.deleteNamespaces(ctx, []string{inst.Chart.Namespace}, nil); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// RequireCRDs checks that the cluster has every CustomResourceDefinition named (like
// peerauthentications.security.istio.io), so that a mesh's configuration is refused
// with a clear message before anything is applied, not half-way through.
func (c *Cluster) RequireCRDs(ctx context.Context, why string, names ...string) error {
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
