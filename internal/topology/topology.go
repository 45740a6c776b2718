// Package topology describes a deployed application the way a mesh profile sees it:
// services with a virtual IP and port, their versions with traffic weights, and the
// pods (endpoints) that serve each version. The substrate fills it in; mesh profiles
// and the enrollment check read it. It holds data only, so every other package can
// depend on it.
package topology

import "net/netip"

// App is one deployed service graph.
type App struct {
	// Name of the graph, e.g. "bookinfo".
	Name string
	// Namespace is the logical (Kubernetes-style) namespace the app lives in; it is
	// part of every workload identity.
	Namespace string
	Services  []Service
	// Clients are pods outside the service graph that send traffic into it, such as
	// the load generator.
	Clients []Pod
}

// Service is what callers address: a name, a virtual IP and a port.
type Service struct {
	Name     string
	VIP      netip.Addr
	Port     int
	Protocol string // "http" (HTTP/1.1), "http2" (h2c) or "grpc" (unary gRPC over h2c)
	Versions []Version
}

// Version is one subset of a service's pods, e.g. reviews v2.
type Version struct {
	Name string
	// Weight is the share of the service's traffic this version receives when the
	// mesh splits traffic; versions with weight 0 receive none. Weights need not sum
	// to 100.
	Weight    int
	Endpoints []Pod
}

// Pod is one workload instance: a network namespace with an address.
type Pod struct {
	Name           string // unique within the app, e.g. "reviews-v2-0"
	Service        string // owning service; empty for clients
	Version        string
	Node           string
	NetNS          string // the Linux network namespace name
	IP             netip.Addr
	Port           int    // the port the workload listens on
	Identity       string // SPIFFE ID, spiffe://cluster.local/ns/<namespace>/sa/<service>
	ServiceAccount string
}

// SPIFFEID returns the workload identity Istio would give a pod in namespace ns running
// under service account sa.
func SPIFFEID(trustDomain, ns, sa string) string {
	return "spiffe://" + trustDomain + "/ns/" + ns + "/sa/" + sa
}

// Service returns the service with the given name, or nil.
func (a *App) Service(name string) *Service {
	for i := range a.Services {
		if a.Services[i].Name == name {
			return &a.Services[i]
		}
	}
	return nil
}

// Pods returns every pod of every service, then the clients.
func (a *App) Pods() []Pod {
	var out []Pod
	for _, s := range a.Services {
		for _, v := range s.Versions {
			out = append(out, v.Endpoints...)
		}
	}
	return append(out, a.Clients...)
}
