// Package kube is the Kubernetes substrate: it connects to a user's cluster, puts a
// study's workload graph on it as Deployments and Services in namespaces of its own,
// waits until they are ready, and removes everything it labelled, including what a
// killed run left behind. Every object it creates carries ManagedByLabel and RunLabel,
// and nothing without them is ever touched.
package kube

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/go-logr/logr"
	authv1 "k8s.io/api/authorization/v1"
	apiextensions "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/klog/v2"
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
	// Timeout bounds every wait for readiness or deletion (the study's readyTimeout);
	// default 5 minutes. A wait for pods ends sooner when the cluster says a pod cannot
	// get ready (StuckError).
	Timeout time.Duration
}

// DefaultNamespacePrefix is used when a study names none.
const DefaultNamespacePrefix = "meshmark"

// Cluster is a connection to a cluster that has been checked to answer and to let
// meshmark do what it needs.
type Cluster struct {
	cfg    Config
	client kubernetes.Interface
	ext    apiextensions.Interface
	rest   *rest.Config
	// Server and ContextName say which cluster this is, for messages and provenance.
	Server, ContextName string
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
	c := &Cluster{cfg: cfg, client: client, ext: ext, rest: rc, Server: rc.Host, ContextName: name}
	if err := c.reach(ctx); err != nil {
		return nil, err
	}
	if err := c.checkRights(ctx); err != nil {
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

// Client is the clientset, for installers and tests.
func (c *Cluster) Client() kubernetes.Interface { return c.client }

// RESTConfig is the connection's configuration, for the Helm SDK.
func (c *Cluster) RESTConfig() *rest.Config { return rest.CopyConfig(c.rest) }

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

// neededRights is what a run does on the cluster: create and delete its namespaces and
// the workload's objects in them, watch the pods, start the plaintext probe's pods
// under strict mTLS (ProbePlaintext), reach the load generators, read every node's
// kubelet resource metrics through the API server (SampleResources), and the mesh's
// proxies' counters the same way (ReadProxyCounters).
var neededRights = []authv1.ResourceAttributes{
	{Verb: "create", Resource: "namespaces"},
	{Verb: "delete", Resource: "namespaces"},
	{Verb: "list", Resource: "namespaces"},
	{Verb: "create", Group: "apps", Resource: "deployments"},
	{Verb: "create", Resource: "services"},
	{Verb: "create", Resource: "configmaps"},
	{Verb: "list", Resource: "pods"},
	{Verb: "create", Resource: "pods"},
	{Verb: "create", Resource: "pods", Subresource: "portforward"},
	{Verb: "get", Resource: "nodes", Subresource: "proxy"},
	{Verb: "get", Resource: "pods", Subresource: "proxy"},
}

// checkRights asks the API server, before anything is created, whether the caller may
// do each thing a run does, so that an RBAC denial is one clear message up front rather
// than a half-made deployment.
func (c *Cluster) checkRights(ctx context.Context) error {
	var denied []string
	for _, ra := range neededRights {
		ra := ra
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
		return fmt.Errorf("cluster %s (context %s): RBAC denies this user: %s; meshmark needs these cluster-wide (for example, bind the cluster-admin ClusterRole, or a role granting them)",
			c.Server, c.ContextName, strings.Join(denied, ", "))
	}
	return nil
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
