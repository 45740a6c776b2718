package ambient

import (
	"fmt"
	"gopkg.in/yaml.v3"
	"net/netip"
	"sort"
	"strings"

	"github.com/meshmark/meshmark/internal/gateway"
	"github.com/meshmark/meshmark/internal/topology"
)

// The types below mirror ztunnel's local configuration (src/xds.rs LocalConfig,
// src/state/workload.rs, src/state/service.rs, src/rbac.rs at commit 62d82653). ztunnel
// reads it with serde_yaml and denies unknown fields.

// LocalConfig is the whole file.
type LocalConfig struct {
	Workloads []LocalWorkload `json:"workloads" yaml:"workloads"`
	Policies  []Policy        `json:"policies" yaml:"policies"`
	Services  []Service       `json:"services" yaml:"services"`
}

// LocalWorkload is a workload and the services it backs (service key "ns/hostname" to
// service port to target port).
type LocalWorkload struct {
	UID            string                 `json:"uid" yaml:"uid"`
	Name           string                 `json:"name" yaml:"name"`
	Namespace      string                 `json:"namespace" yaml:"namespace"`
	ServiceAccount string                 `json:"serviceAccount" yaml:"serviceAccount"`
	TrustDomain    string                 `json:"trustDomain" yaml:"trustDomain"`
	WorkloadIPs    []string               `json:"workloadIps" yaml:"workloadIps"`
	Protocol       string                 `json:"protocol" yaml:"protocol"` // HBONE for enrolled pods, TCP otherwise
	Node           string                 `json:"node" yaml:"node"`
	Network        string                 `json:"network" yaml:"network"`
	ClusterID      string                 `json:"clusterId" yaml:"clusterId"`
	CanonicalName  string                 `json:"canonicalName,omitempty" yaml:"canonicalName,omitempty"`
	CanonicalRev   string                 `json:"canonicalRevision,omitempty" yaml:"canonicalRevision,omitempty"`
	WorkloadName   string                 `json:"workloadName" yaml:"workloadName"`
	Capacity       int                    `json:"capacity" yaml:"capacity"`
	Services       map[string]map[int]int `json:"services" yaml:"services"`
}

// Service is a service with its virtual IPs ("network/ip") and port map.
type Service struct {
	Name      string      `json:"name" yaml:"name"`
	Namespace string      `json:"namespace" yaml:"namespace"`
	Hostname  string      `json:"hostname" yaml:"hostname"`
	VIPs      []string    `json:"vips" yaml:"vips"`
	Ports     map[int]int `json:"ports" yaml:"ports"`
	// Waypoint, when set, makes every ztunnel send this service's traffic to the
	// waypoint over HBONE instead of to an endpoint.
	Waypoint *GatewayAddress `json:"waypoint,omitempty" yaml:"waypoint,omitempty"`
}

// GatewayAddress is where a waypoint listens: "network/ip" and its HBONE port.
type GatewayAddress struct {
	Destination   string `yaml:"destination"`
	HBONEMTLSPort int    `yaml:"hboneMtlsPort"`
}

// WaypointWorkload places the namespace's waypoint: its address, node and identity.
type WaypointWorkload struct {
	Name, ServiceAccount, Node string
	IP                         netip.Addr
}

// Policy is ztunnel's Authorization: rules are OR of AND of OR of matches.
type Policy struct {
	Name      string          `json:"name" yaml:"name"`
	Namespace string          `json:"namespace" yaml:"namespace"`
	Scope     string          `json:"scope" yaml:"scope"`   // Global | Namespace | WorkloadSelector
	Action    string          `json:"action" yaml:"action"` // Allow | Deny
	Rules     [][][]RbacMatch `json:"rules" yaml:"rules"`
	DryRun    bool            `json:"dryRun" yaml:"dryRun"`
}

// RbacMatch is one match group; all set fields must match.
type RbacMatch struct {
	Principals       []StringMatch `json:"principals,omitempty" yaml:"principals,omitempty"`
	NotPrincipals    []StringMatch `json:"notPrincipals,omitempty" yaml:"notPrincipals,omitempty"`
	DestinationPorts []int         `json:"destinationPorts,omitempty" yaml:"destinationPorts,omitempty"`
	SourceIPs        []string      `json:"sourceIps,omitempty" yaml:"sourceIps,omitempty"`
}

// StringMatch is one of serde's externally tagged enum values, which serde_yaml
// spells as YAML tags: !Exact "ns/x/sa/y", !Prefix, !Suffix, or !Presence [].
type StringMatch struct {
	Kind  string // Exact | Prefix | Suffix | Presence
	Value string
}

// MarshalYAML writes the tagged form.
func (m StringMatch) MarshalYAML() (any, error) {
	if m.Kind == "Presence" {
		return &yaml.Node{Kind: yaml.SequenceNode, Tag: "!Presence", Style: yaml.FlowStyle}, nil
	}
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!" + m.Kind, Value: m.Value, Style: yaml.DoubleQuotedStyle}, nil
}

// Exact matches one principal (a SPIFFE ID without its spiffe:// prefix).
func Exact(s string) StringMatch {
	return StringMatch{Kind: "Exact", Value: strings.TrimPrefix(s, "spiffe://")}
}

// Presence matches any authenticated principal.
func Presence() StringMatch { return StringMatch{Kind: "Presence"} }

// clusterID is ztunnel's default cluster name, used in workload uids.
const clusterID = "Kubernetes"

// workloadUID is the uid Istio gives a pod's workload; the ZDS AddWorkload carries the
// same one.
func workloadUID(ns, pod string) string { return clusterID + "//v1/Pod/" + ns + "/" + pod }

// serviceHost is a service's cluster-local name.
func serviceHost(svc, ns string) string { return svc + "." + ns + ".svc.cluster.local" }

// StrictPolicy is ambient's PeerAuthentication STRICT as ztunnel sees it (istiod
// converts it to a deny of connections without a peer identity, i.e. plaintext).
func StrictPolicy(ns string) Policy {
	return Policy{Name: "meshmark-strict-mtls", Namespace: ns, Scope: "Namespace", Action: "Deny",
		Rules: [][][]RbacMatch{{{{NotPrincipals: []StringMatch{Presence()}}}}}}
}

// BuildLocalConfig renders the app graph as ztunnel's local config: every pod is a
// workload (HBONE when enrolled, plain TCP otherwise), every service has its VIP and
// port, and only versions with a positive weight are endpoints. ztunnel balances a
// service's connections over its endpoints by their capacity, so a version's weight
// is spread over its pods as capacity: the reviews split is honoured per connection
// (L4), not per request.
func BuildLocalConfig(app *topology.App, meshed map[string]bool, identity func(topology.Pod) (sa string), trustDomain string, policies []Policy, wp *WaypointWorkload) (LocalConfig, error) {
	ns := app.Namespace
	var cfg LocalConfig
	seen := map[string]bool{}
	add := func(pod topology.Pod, backs map[string]map[int]int, capacity int) {
		if seen[pod.Name] {
			return
		}
		if backs == nil {
			backs = map[string]map[int]int{} // ztunnel wants a map, even an empty one
		}
		seen[pod.Name] = true
		proto := "TCP"
		if meshed[pod.Name] {
			proto = "HBONE"
		}
		cfg.Workloads = append(cfg.Workloads, LocalWorkload{
			UID: workloadUID(ns, pod.Name), Name: pod.Name, Namespace: ns,
			ServiceAccount: identity(pod), TrustDomain: trustDomain,
			WorkloadIPs: []string{pod.IP.String()}, Protocol: proto, Node: pod.Node,
			ClusterID: clusterID, WorkloadName: pod.Name, CanonicalName: pod.Service, CanonicalRev: pod.Version,
			Capacity: capacity, Services: backs,
		})
	}
	for _, s := range app.Services {
		if !s.VIP.IsValid() || s.Port == 0 {
			return LocalConfig{}, fmt.Errorf("service %s has no VIP or port", s.Name)
		}
		host := serviceHost(s.Name, ns)
		svc := Service{Name: s.Name, Namespace: ns, Hostname: host, VIPs: []string{"/" + s.VIP.String()}, Ports: map[int]int{s.Port: 0}}
		if wp != nil && s.Name != gateway.Service {
			svc.Waypoint = &GatewayAddress{Destination: "/" + wp.IP.String(), HBONEMTLSPort: HBONEPort}
		}
		// As envoy-sidecar: weights only split a service with several versions; a
		// service whose versions all weigh 0 spreads evenly over every endpoint.
		split := false
		if len(s.Versions) > 1 {
			for _, v := range s.Versions {
				split = split || v.Weight > 0
			}
		}
		for _, v := range s.Versions {
			if v.Weight < 0 {
				return LocalConfig{}, fmt.Errorf("service %s version %s: negative weight %d", s.Name, v.Name, v.Weight)
			}
			for _, pod := range v.Endpoints {
				var backs map[string]map[int]int
				capacity := 1
				switch {
				case !split:
					backs = map[string]map[int]int{ns + "/" + host: {s.Port: pod.Port}}
					svc.Ports[s.Port] = pod.Port
				case v.Weight > 0:
					backs = map[string]map[int]int{ns + "/" + host: {s.Port: pod.Port}}
					capacity = max(1, v.Weight*100/len(v.Endpoints))
					svc.Ports[s.Port] = pod.Port
				}
				add(pod, backs, capacity)
			}
		}
		cfg.Services = append(cfg.Services, svc)
	}
	for _, c := range app.Clients {
		add(c, nil, 1)
	}
	if wp != nil {
		cfg.Workloads = append(cfg.Workloads, LocalWorkload{
			UID: workloadUID(ns, wp.Name), Name: wp.Name, Namespace: ns, ServiceAccount: wp.ServiceAccount,
			TrustDomain: trustDomain, WorkloadIPs: []string{wp.IP.String()}, Protocol: "HBONE", Node: wp.Node,
			ClusterID: clusterID, WorkloadName: wp.Name, CanonicalName: wp.Name, Capacity: 1,
			Services: map[string]map[int]int{},
		})
	}
	sort.Slice(cfg.Workloads, func(i, j int) bool { return cfg.Workloads[i].Name < cfg.Workloads[j].Name })
	cfg.Policies = append([]Policy{}, policies...)
	if cfg.Services == nil {
		cfg.Services = []Service{}
	}
	return cfg, nil
}

// Marshal renders the config file as YAML (port maps need integer keys, which JSON
// cannot express).
func (c LocalConfig) Marshal() ([]byte, error) { return yaml.Marshal(c) }

// SplitNote says, for the record kept with the results, how each split service is
// balanced without a waypoint: per connection, by endpoint capacity.
func SplitNote(app *topology.App, waypoint bool) string {
	var b strings.Builder
	level := "connection-level"
	if waypoint {
		level = "request-level, in the waypoint"
		b.WriteString("Waypoint: version splits are applied per request by the namespace waypoint (Envoy, L7).\n")
	} else {
		b.WriteString("No waypoint: ztunnel is L4. Version splits are applied per connection (endpoint capacity), not per request;\n" +
			"with keep-alive connections, the request split follows the connection split only on average.\n")
	}
	for _, s := range app.Services {
		if len(s.Versions) < 2 {
			continue
		}
		fmt.Fprintf(&b, "%s:", s.Name)
		for _, v := range s.Versions {
			fmt.Fprintf(&b, " %s=%d", v.Name, v.Weight)
		}
		fmt.Fprintf(&b, " (%s)\n", level)
	}
	return b.String()
}
