// Package meshkube is what a mesh profile tells the Kubernetes substrate, as plain
// data: how the mesh goes onto a cluster and how its enrollment shows (KubernetesInstall:
// charts, manifests, labels, sidecar, proxies' endpoints, node agents, gateways), what
// it is on any cluster whatever its options (ClusterMarks), and the counters its proxies
// report (ProxyCounters), which the local profiles report alike. It imports nothing of
// meshmark: the mesh profiles and the Kubernetes substrate both import it, so that the
// substrate needs no mesh package and no arrow runs back up from it to them.
package meshkube

import (
	"io"
	"time"
)

// KubernetesInstall is how a mesh goes onto a cluster and how its enrollment shows.
type KubernetesInstall struct {
	// Charts are installed in order and uninstalled in reverse.
	Charts []HelmChart
	// Manifests are applied after the charts are ready, each into the namespace it
	// names: the mesh's configuration, such as a mesh-wide PeerAuthentication.
	Manifests []string
	// NamespaceLabels, NamespaceAnnotations and PodAnnotations enroll the workload.
	NamespaceLabels, NamespaceAnnotations, PodAnnotations map[string]string
	// Sidecar is the container the mesh adds to every enrolled pod (as a container or
	// as a native sidecar, an init container that keeps running); a pod without it is
	// not in the mesh. Empty for meshes without sidecars.
	Sidecar string
	// EnrolledAnnotations are what the mesh writes on every pod it enrolled (ambient's
	// CNI agent marks the pods it redirected); a pod without them is not in the mesh.
	EnrolledAnnotations map[string]string
	// Proxies are where the mesh's proxies serve their own counters on the cluster, so
	// that every trial stores what they carried, as the local profile's Telemetry does.
	Proxies []ProxyEndpoint
	// NodeAgents enroll every pod of their node, for meshes without sidecars whose data
	// plane is a node's (Cilium's agent puts every pod of its node in its eBPF
	// datapath): a pod is in the mesh when its node runs a ready pod of each.
	NodeAgents []NodeAgent
	// Requires are what the cluster must hold, or must not, for the mesh to go on it,
	// checked before anything is installed: a mesh that is the cluster's pod network
	// refuses a cluster that already runs another, which its install would break.
	Requires []ClusterRequirement
	// ClusterNetwork says the mesh is the cluster's pod network itself (its CNI, as
	// Cilium is): it goes onto a cluster created without one, where no other mesh's pods
	// could start, so a study that has it compares it only with meshes that are too.
	ClusterNetwork bool
	// OwnPodLabels are labels every pod of the mesh carries. Where the mesh installs
	// into a namespace it shares with the cluster's own pods (Cilium in kube-system),
	// only the pods with them are the mesh's, for resources.
	OwnPodLabels map[string]string
	// Gateways are Gateway API Gateways the mesh needs beside the workload, in the
	// app's namespace, which is not known when the install is described (ambient's
	// waypoint). The mesh's controller turns each into a Deployment of proxies there.
	Gateways []AppGateway
	// Ingress is the mesh's own ingress gateway, for a study's ingress path (Istio's);
	// nil when the mesh takes the plain gateway, enrolled as the app's pods are.
	Ingress *IngressInstall
	// ForLocalCluster, when set, adapts the install to a local cluster (`meshmark
	// cluster up`), which reaches no chart repository and no registry: charts from
	// setup's build, the images cluster up loaded. It returns what differs from the
	// install a real cluster gets, by component, for the run's provenance.
	ForLocalCluster func(*KubernetesInstall) (map[string]string, error)
	// PrivilegedNamespaces are the charts' namespaces whose pods need more than Pod
	// Security's baseline level (istio-cni's and ztunnel's host paths and capabilities,
	// Linkerd's control plane's proxy-init with NET_ADMIN): meshmark creates them
	// labelled PodSecurityEnforce=privileged, as the meshes' docs have their users label
	// them, so that a cluster enforcing baseline by default admits their pods. An app
	// namespace whose pods need it (an init container that writes iptables) says so in
	// NamespaceLabels.
	PrivilegedNamespaces []string
	// AppManifests are objects of the mesh's configuration that go into the app's
	// namespace (without a namespace of their own), created with it before the
	// workload and removed with it: Linkerd's Server that lets the API server read each
	// proxy's admin metrics under its all-authenticated default policy.
	AppManifests []string
}

// ClusterMarks are how a mesh shows on a Kubernetes cluster whatever options a study
// gives it: what its injector names the container it adds, how its own gateways' pods
// are labelled, and how it is told to leave a namespace or a pod alone. They are plain
// data in the mesh's registration, so that the Kubernetes substrate knows no mesh by
// name: the runner hands it KnownClusterMarks.
type ClusterMarks struct {
	// Sidecar is the container the mesh's injector adds beside each application's
	// (the same as its KubernetesInstall's Sidecar). Empty for meshes without sidecars.
	Sidecar string
	// GatewayPodLabels mark the pods of the mesh's own gateways, beside the Gateway API
	// ones every mesh's controller labels alike; a value "" matches any value.
	GatewayPodLabels map[string]string
	// Outside is how the mesh is told to leave a namespace and a pod out of it.
	Outside OptOut
}

// OptOut are the labels and annotations that keep a namespace and a pod out of a mesh.
type OptOut struct {
	NamespaceLabels, NamespaceAnnotations map[string]string
	PodLabels, PodAnnotations             map[string]string
}

// KnownMarks are the ClusterMarks of every registered mesh together.
type KnownMarks struct {
	// Sidecars are the containers the meshes' injectors add, sorted.
	Sidecars []string
	// GatewayPodLabels mark the pods of any mesh's own gateways.
	GatewayPodLabels map[string]string
	// Outside keeps a namespace and a pod out of every mesh.
	Outside OptOut
}

// AppGateway is a Gateway API Gateway of the mesh in the app's namespace. It is created
// there with the namespace, before the workload; the workload is ready once the Gateway
// is Programmed and its Deployment is available; it goes first at teardown, with its
// Deployment and pods.
type AppGateway struct {
	// Manifest is the Gateway, without a namespace: it goes into the app's.
	Manifest string
	// Deployment is the name the mesh's controller gives the Deployment it makes for
	// the Gateway (istiod: the Gateway's own name, for a waypoint).
	Deployment string
}

// IngressInstall is a mesh's own ingress gateway on a cluster: a Gateway API Gateway of
// the mesh's class in the app's namespace, which the mesh's controller deploys and
// configures, and which an HTTPRoute of meshmark's sends to the app's entry service. A
// study's ingress path then sends its requests to the Service the controller makes.
type IngressInstall struct {
	// Gateway listens for HTTP on Port; its Deployment is also the name of its Service.
	Gateway AppGateway
	Port    int
	// Charts are what the Gateway needs that the mesh's install lacks (the Gateway
	// API's CRDs), installed after the install's first chart and before the rest, as
	// Istio's documentation puts them before istiod.
	Charts []HelmChart
}

// NodeAgent is a mesh's per-node agent: the pods of a DaemonSet, found by namespace and
// labels, one on each node.
type NodeAgent struct {
	// Component names the agent in enrollment failures, e.g. "cilium-agent".
	Component string
	Namespace string
	Labels    map[string]string
}

// ClusterRequirement is one object the cluster must hold, or must not, before a mesh is
// installed on it.
type ClusterRequirement struct {
	// Kind is DaemonSet or Secret.
	Kind string
	// Namespace is where to look; empty for every namespace.
	Namespace, Name string
	// Absent refuses the cluster when the object is there; otherwise the cluster is
	// refused when it is missing.
	Absent bool
	// Why is the refusal: what the object means for the mesh and what the user can do.
	Why string
}

// ProxyEndpoint is a metrics endpoint that a mesh's proxies serve on their pods' own
// addresses, which the Kubernetes substrate reads through the API server's pod proxy
// (so that no pod need be reachable from where meshmark runs), and how to turn what it
// serves into the ProxyCounters the local substrate stores.
type ProxyEndpoint struct {
	// Component names the proxy among a trial's counters, as the local profile names it.
	Component string
	// Container, for sidecars: every pod of the app's namespace that carries it.
	Container string
	// Namespace and Labels, for node proxies: the pods of that namespace with those
	// labels, on the nodes that host the app's pods. Each is stored under its node's
	// name, as the local substrate stores a node proxy.
	Namespace string
	Labels    map[string]string
	// AppLabels, for proxies that run as pods of their own in the app's namespace
	// (ambient's waypoint, which the mesh's controller makes there): the pods there
	// with those labels, each stored under its pod's name. Finding none is a proxy
	// that could not be read.
	AppLabels map[string]string
	// Port and Path are where the proxy serves its metrics on its pod's address.
	Port int
	Path string
	// Read parses one answer of the endpoint into the proxy's version, inbound counts,
	// counters and gauges; the substrate sets the component, pod and time.
	Read func(body io.Reader, of ProxyScrape) (ProxyCounters, error)
}

// PodSecurityEnforce is Pod Security admission's enforce label for a namespace, and
// PodSecurityPrivileged its level that admits any pod.
const (
	PodSecurityEnforce    = "pod-security.kubernetes.io/enforce"
	PodSecurityPrivileged = "privileged"
)

// ProxyScrape is what the substrate tells a ProxyEndpoint's Read about the proxy.
type ProxyScrape struct {
	// Service is the app's service whose pod the sidecar is in: empty for a node proxy,
	// and for a load generator's pod, which serves nothing.
	Service string
	// Namespace is the app's namespace and Services its services, for a node proxy,
	// which counts the traffic of every pod of its node.
	Namespace string
	Services  []string
}

// HelmChart is one chart of a mesh, pinned.
type HelmChart struct {
	Release, Namespace string
	// Chart is the chart's name in Repo, or a local chart directory when Repo is empty.
	Chart, Repo, Version string
	Values               map[string]any
}

// Units of ProxyCounters.Inbound.
const (
	UnitRequests    = "requests"    // L7 proxies count HTTP requests or gRPC calls
	UnitConnections = "connections" // L4 proxies (ztunnel without a waypoint) count connections
)

// ProxyCounters are one proxy's own counters at one instant.
type ProxyCounters struct {
	// Component is the proxy, e.g. "envoy", "linkerd2-proxy", "ztunnel".
	Component string
	// Pod is the namespace the proxy runs in: the pod for a sidecar, the node for a
	// node proxy.
	Pod     string
	Version string
	Time    time.Time
	Err     error
	// Inbound counts, per destination service, what the proxy accepted on the way into
	// that service, in Unit.
	Inbound map[string]uint64
	Unit    string
	// InboundMTLS and InboundPlaintext split what the proxy accepted inbound, per
	// service, by whether it came over the mesh's mTLS, in WireUnit: the wire's own word
	// on mTLS, for proxies whose counters tell it (WireUnit empty otherwise). WireUnit
	// may differ from Unit: an Envoy without Istio's telemetry counts TLS handshakes
	// per connection, not per request.
	InboundMTLS, InboundPlaintext map[string]uint64
	WireUnit                      string
	// InboundBytes counts, per destination service, the bytes the proxy received on the
	// way into it, for an L4 proxy that counts them as they flow (ztunnel): a connection
	// opened before a trial and kept through it (an ingress's pool) carries the trial's
	// requests while no new connection is counted.
	InboundBytes map[string]uint64
	// Counters and Gauges are everything else the proxy exposes that is worth keeping.
	Counters map[string]uint64
	Gauges   map[string]uint64
}
