// Package kube is the Kubernetes substrate: it connects to a user's cluster, puts a
// study's workload graph on it as Deployments and Services in namespaces of its own,
// waits until they are ready, and removes everything it labelled, including what a
// killed run left behind. Every object it creates carries ManagedByLabel and RunLabel,
// and nothing without them is ever touched.
package kube

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	"github.com/meshmark/meshmark/internal/podcmd"
	authv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensions "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"
)

// Labels and annotations meshmark puts on what it creates.
const (
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedBy      = "meshmark"
	RunLabel       = "meshmark.dev/run"
	MeshLabel      = "meshmark.dev/mesh"
	// OwnerAnnotation names the host and process that created a namespace, so that
	// `meshmark clean --kubernetes` can tell a killed run's leftovers from a live run's.
	OwnerAnnotation = "meshmark.dev/owner"
)

// Config says which cluster to use and where to put things on it.
type Config struct {
	// Kubeconfig is the kubeconfig file; empty means $KUBECONFIG, then ~/.kube/config.
	Kubeconfig string
	// Context is the kubeconfig context; empty means its current context.
	Context string
	// NamespacePrefix starts the name of every namespace meshmark creates.
	NamespacePrefix string
	// AppNodeSelector and LoadgenNodeSelector place the workload's pods and the load
	// generators' pods, so that they need not share nodes.
	AppNodeSelector, LoadgenNodeSelector map[string]string
	// Image is the meshmark image (meshmark-pod) the workload and the load generators run.
	Image string
	// RunnerVersion, when set, is the version of the meshmark that drives the pods,
	// given to each of them (RunnerVersionEnv): a pod whose image holds a meshmark-pod
	// of another version refuses to start (podcmd.CheckRunnerVersion), naming both, and
	// the wait for it ends at once with its words.
	RunnerVersion string
	// Timeout bounds every wait for readiness or deletion (the study's readyTimeout);
	// default 5 minutes. A wait for pods ends sooner when the cluster says a pod cannot
	// get ready (StuckError).
	Timeout time.Duration
}

// RunnerVersionEnv is the environment variable that tells meshmark in a pod which
// version started it (Config.RunnerVersion).
const RunnerVersionEnv = podcmd.RunnerVersionEnv

// runnerEnv is the environment every meshmark container of the run gets.
func (c *Cluster) runnerEnv() []corev1.EnvVar {
	if c.cfg.RunnerVersion == "" {
		return nil
	}
	return []corev1.EnvVar{{Name: RunnerVersionEnv, Value: c.cfg.RunnerVersion}}
}

// DefaultNamespacePrefix is used when a study names none.
const DefaultNamespacePrefix = "meshmark"

// Cluster is a connection to a cluster that has been checked to answer and to let
// meshmark do what it needs.
type Cluster struct {
	cfg    Config
	client kubernetes.Interface
	plain  kubernetes.Interface // Client's
	// plainRest is RESTConfig's.
	plainRest *rest.Config
	ext       apiextensions.Interface
	rest      *rest.Config
	// Server and ContextName say which cluster this is, for messages and provenance.
	Server, ContextName string
	// checked are the rights the API server said this user has (rightKey).
	mu      sync.Mutex
	checked map[string]bool
}

// observeRequest, when set (by the package's tests), sees every request a Cluster's
// clients send, with the Cluster.
var observeRequest func(c *Cluster, req *http.Request)

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// hasChecked says whether the API server was asked, and said yes, for a right.
func (c *Cluster) hasChecked(ra authv1.ResourceAttributes) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.checked[rightKey(ra)]
}

// Connect loads the kubeconfig, reaches the API server and checks the caller's rights.
// Each failure names what is wrong in the user's terms: the file, the context, the
// server, or the missing permissions.
func Connect(ctx context.Context, cfg Config) (*Cluster, error) {
	if cfg.NamespacePrefix == "" {
		cfg.NamespacePrefix = DefaultNamespacePrefix
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Minute
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	source := "the default kubeconfig ($KUBECONFIG or ~/.kube/config)"
	if cfg.Kubeconfig != "" {
		rules.ExplicitPath = cfg.Kubeconfig
		source = "kubeconfig " + cfg.Kubeconfig
		if _, err := os.Stat(cfg.Kubeconfig); err != nil {
			return nil, fmt.Errorf("%s: %w", source, err)
		}
	}
	raw, err := rules.Load()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	name := cfg.Context
	if name == "" {
		name = raw.CurrentContext
	}
	if name == "" {
		return nil, fmt.Errorf("%s names no current context: set spec.substrate.kubernetes.context (contexts: %s)", source, contextNames(raw.Contexts))
	}
	if _, ok := raw.Contexts[name]; !ok {
		return nil, fmt.Errorf("%s has no context %q (contexts: %s)", source, name, contextNames(raw.Contexts))
	}
	rc, err := clientcmd.NewDefaultClientConfig(*raw, &clientcmd.ConfigOverrides{CurrentContext: name}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("%s, context %s: %w", source, name, err)
	}
	rc.QPS, rc.Burst = 50, 100
	var c *Cluster
	// Client and RESTConfig hand out a connection of their own, whose requests are not
	// meshmark's.
	plainRest := rest.CopyConfig(rc)
	plain, err := kubernetes.NewForConfig(plainRest)
	if err != nil {
		return nil, fmt.Errorf("%s, context %s: %w", source, name, err)
	}
	if observeRequest != nil {
		rc.Wrap(func(rt http.RoundTripper) http.RoundTripper {
			return roundTripFunc(func(req *http.Request) (*http.Response, error) {
				observeRequest(c, req)
				return rt.RoundTrip(req)
			})
		})
	}
	// client-go also logs the errors it returns (a port-forward's failed connection,
	// for one) through klog, onto stderr, between meshmark's own progress lines; they
	// reach meshmark as errors, which say more.
	klog.SetLogger(logr.Discard())
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("%s, context %s: %w", source, name, err)
	}
	ext, err := apiextensions.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("%s, context %s: %w", source, name, err)
	}
	c = &Cluster{cfg: cfg, client: client, plain: plain, plainRest: plainRest, ext: ext, rest: rc, Server: rc.Host, ContextName: name, checked: map[string]bool{}}
	if err := c.reach(ctx); err != nil {
		return nil, err
	}
	if err := c.checkRights(ctx, neededRights, "a run"); err != nil {
		return nil, err
	}
	return c, nil
}

func contextNames(m map[string]*clientcmdapi.Context) string {
	var names []string
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// Client is a clientset on the connection, for tests and tools: what it does is
// theirs, not meshmark's (the rights check does not cover it).
func (c *Cluster) Client() kubernetes.Interface { return c.plain }

// RESTConfig is the connection's configuration, for tests and tools (see Client).
func (c *Cluster) RESTConfig() *rest.Config { return rest.CopyConfig(c.plainRest) }

func (c *Cluster) reach(ctx context.Context) error {
	done := make(chan error, 1)
	go func() {
		_, err := c.client.Discovery().ServerVersion()
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("cluster %s (context %s) does not answer: %w", c.Server, c.ContextName, err)
		}
		return nil
	case <-time.After(15 * time.Second):
		return fmt.Errorf("cluster %s (context %s) does not answer within 15s", c.Server, c.ContextName)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// neededRights is what any run does on the cluster, the baseline's included, through
// meshmark's own requests: create and delete its namespaces and the workload's objects
// in them (Deployments, Services, the graph's ConfigMap; at teardown and by `clean`,
// Deployments, ReplicaSets and pods by collection), watch the pods and their Services'
// endpoints (WaitReady), read a crashing container's log, start the plaintext probe's
// pods under strict mTLS (ProbePlaintext), reach the load generators
// (pods/portforward), describe the nodes (Describe, CheckPlacement, LocalCluster), read
// every node's kubelet resource metrics (SampleResources) and the mesh's proxies'
// counters (ReadProxyCounters) through the API server. A test records every request the
// package's tests make and holds it to these and to meshRights (TestMain).
var neededRights = []authv1.ResourceAttributes{
	{Verb: "create", Resource: "namespaces"},
	{Verb: "get", Resource: "namespaces"},
	{Verb: "list", Resource: "namespaces"},
	{Verb: "delete", Resource: "namespaces"},
	{Verb: "create", Group: "apps", Resource: "deployments"},
	{Verb: "get", Group: "apps", Resource: "deployments"},
	{Verb: "list", Group: "apps", Resource: "deployments"},
	{Verb: "delete", Group: "apps", Resource: "deployments"},
	{Verb: "deletecollection", Group: "apps", Resource: "deployments"},
	{Verb: "deletecollection", Group: "apps", Resource: "replicasets"},
	{Verb: "create", Resource: "services"},
	{Verb: "list", Resource: "services"},
	{Verb: "create", Resource: "configmaps"},
	{Verb: "list", Group: "discovery.k8s.io", Resource: "endpointslices"},
	{Verb: "create", Resource: "pods"},
	{Verb: "get", Resource: "pods"},
	{Verb: "list", Resource: "pods"},
	{Verb: "deletecollection", Resource: "pods"},
	{Verb: "get", Resource: "pods", Subresource: "log"},
	// SPDY asks with POST (create), WebSockets with GET (get), and a cluster that
	// checks WebSocket upgrades for create too asks both.
	{Verb: "create", Resource: "pods", Subresource: "portforward"},
	{Verb: "get", Resource: "pods", Subresource: "portforward"},
	{Verb: "get", Resource: "pods", Subresource: "proxy"},
	{Verb: "list", Resource: "nodes"},
	{Verb: "get", Resource: "nodes", Subresource: "proxy"},
}

// meshRights is what installing any mesh adds, through meshmark's own requests (Helm's
// own go through Helm, whose error names a right it lacks): the charts'
// CustomResourceDefinitions, which meshmark creates, waits for and deletes itself, and
// the cluster objects a mesh's requirements look for (meshkube.ClusterRequirement:
// DaemonSets, Secrets), and the events that say why a chart's DaemonSet cannot create
// its pods (the install's wait). The kinds of the mesh's manifests and Gateways are
// added per mesh (InstallRights).
var meshRights = []authv1.ResourceAttributes{
	{Verb: "create", Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions"},
	{Verb: "get", Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions"},
	{Verb: "list", Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions"},
	{Verb: "delete", Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions"},
	{Verb: "list", Group: "apps", Resource: "daemonsets"},
	{Verb: "list", Resource: "secrets"},
	{Verb: "list", Resource: "events"},
}

// InstallRights is what installing a mesh with these manifests, app Gateways and app
// manifests asks of the cluster beyond neededRights: meshRights, creating and deleting
// each manifest's kind, creating, reading and deleting each Gateway's, and creating
// each app manifest's (its namespace takes it away).
func InstallRights(manifests []string, gateways []meshkube.AppGateway, appManifests []string) ([]authv1.ResourceAttributes, error) {
	out := slices.Clone(meshRights)
	add := func(doc string, verbs ...string) error {
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			return fmt.Errorf("mesh configuration: %w", err)
		}
		gv, err := schema.ParseGroupVersion(head.APIVersion)
		if err != nil || head.Kind == "" {
			return fmt.Errorf("mesh configuration: apiVersion %q, kind %q", head.APIVersion, head.Kind)
		}
		for _, v := range verbs {
			ra := authv1.ResourceAttributes{Verb: v, Group: gv.Group, Resource: resourceOf(head.Kind)}
			if !slices.Contains(out, ra) {
				out = append(out, ra)
			}
		}
		return nil
	}
	for _, m := range manifests {
		if err := add(m, "create", "delete"); err != nil {
			return nil, err
		}
	}
	for _, g := range gateways {
		if err := add(g.Manifest, "create", "get", "delete"); err != nil {
			return nil, err
		}
	}
	for _, m := range appManifests {
		if err := add(m, "create"); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// resourceOf is the resource name of a kind as CRDs and the built-in kinds name them:
// lower case and plural (Gateway: gateways, NetworkPolicy: networkpolicies). The kind's
// CRD may not exist yet when its right is checked, so it cannot be looked up.
func resourceOf(kind string) string {
	k := strings.ToLower(kind)
	switch {
	case strings.HasSuffix(k, "s"), strings.HasSuffix(k, "x"), strings.HasSuffix(k, "ch"), strings.HasSuffix(k, "sh"):
		return k + "es"
	case strings.HasSuffix(k, "y") && len(k) > 1 && !strings.ContainsRune("aeiou", rune(k[len(k)-2])):
		return k[:len(k)-1] + "ies"
	}
	return k + "s"
}

// CheckInstallRights asks the API server, before anything of the mesh is created,
// whether the caller may do what installing it asks (InstallRights), and names every
// right it lacks in one error.
func (c *Cluster) CheckInstallRights(ctx context.Context, manifests []string, gateways []meshkube.AppGateway, appManifests []string) error {
	rights, err := InstallRights(manifests, gateways, appManifests)
	if err != nil {
		return err
	}
	return c.checkRights(ctx, rights, "installing the mesh")
}

// checkRights asks the API server, before anything is created, whether the caller may
// do each thing a run does, so that an RBAC denial is one clear message up front rather
// than a half-made deployment. The rights it checked are remembered (checked), which
// the package's tests hold every request to.
func (c *Cluster) checkRights(ctx context.Context, rights []authv1.ResourceAttributes, what string) error {
	var denied []string
	for _, ra := range rights {
		review := &authv1.SelfSubjectAccessReview{Spec: authv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &ra}}
		got, err := c.client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("cluster %s (context %s): asking what this user may do: %w", c.Server, c.ContextName, err)
		}
		if !got.Status.Allowed {
			denied = append(denied, describe(ra))
		}
	}
	if len(denied) > 0 {
		return fmt.Errorf("cluster %s (context %s): RBAC denies this user, for %s: %s; meshmark needs these cluster-wide (for example, bind the cluster-admin ClusterRole, or a role granting them)",
			c.Server, c.ContextName, what, strings.Join(denied, ", "))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ra := range rights {
		c.checked[rightKey(ra)] = true
	}
	return nil
}

// rightKey is a right as the package's tests compare requests to it.
func rightKey(ra authv1.ResourceAttributes) string {
	return strings.Join([]string{ra.Verb, ra.Group, ra.Resource, ra.Subresource}, "/")
}

func describe(ra authv1.ResourceAttributes) string {
	res := ra.Resource
	if ra.Subresource != "" {
		res += "/" + ra.Subresource
	}
	if ra.Group != "" {
		res += "." + ra.Group
	}
	return ra.Verb + " " + res
}

// IsNotFound reports whether err is the API server's "not found".
func IsNotFound(err error) bool { return apierrors.IsNotFound(err) }

// LocalClusterLabel is what `meshmark cluster up` labels its nodes with (localcluster
// .NodeLabel), the cluster's name as its value.
const LocalClusterLabel = "meshmark.dev/cluster"

// LocalCluster is the name of the meshmark local cluster this is, or "" for any other
// cluster: one whose every node carries LocalClusterLabel.
func (c *Cluster) LocalCluster(ctx context.Context) (string, error) {
	nodes, err := c.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", fmt.Errorf("cluster %s: listing nodes: %w", c.Server, err)
	}
	name := ""
	for i, n := range nodes.Items {
		v := n.Labels[LocalClusterLabel]
		if v == "" || (i > 0 && v != name) {
			return "", nil
		}
		name = v
	}
	return name, nil
}
