// Package workload owns meshmark's application model and the service that plays it: the
// service graph file (an isotope-like YAML subset, see docs/graph.md), the built-in
// graphs (bookinfo, emojivoto, online-boutique, teastore, chain-N, fanout-N), and the server that runs one
// service of a graph (`meshmark service`). Everything a testbed needs to deploy a graph
// (Deployments, Entrypoint, ServiceArgs) is derived here so that the graph file stays
// the single description of the application.
package workload

import (
	"strconv"
	"time"
)

// DefaultPort is the port every service listens on unless the graph says otherwise
// (bookinfo's, so that studies look like the ones people published).
const DefaultPort = 9080

// The protocols a service can speak. A service answers HTTP/1.1 and cleartext HTTP/2
// whatever its protocol; the protocol says how its callers (and mesh proxies) talk to it.
const (
	ProtocolHTTP  = "http"  // HTTP/1.1
	ProtocolHTTP2 = "http2" // HTTP/2 in cleartext with prior knowledge (h2c)
	ProtocolGRPC  = "grpc"  // unary gRPC over h2c
)

// Protocols lists them in the order docs show them.
var Protocols = []string{ProtocolHTTP, ProtocolHTTP2, ProtocolGRPC}

// Graph is a parsed and validated service graph.
type Graph struct {
	Name     string
	Services []*Service
	// Origin is what to pass to `meshmark service --graph` to load this same graph:
	// the absolute path of the file or the built-in name (with options).
	Origin string
}

// Service is one named service of the graph.
type Service struct {
	Name     string
	Port     int
	Protocol string // ProtocolHTTP, ProtocolHTTP2 or ProtocolGRPC
	// Path is the request path callers use when a call does not name one; it is also
	// the path the load generator requests when this service is the entrypoint.
	Path string
	// ResponseSize is the minimum body size of a successful response, in bytes; the
	// trace is padded up to it.
	ResponseSize int64
	// ErrorRate is the probability (0..1) that a request is answered with 500 without
	// running the script.
	ErrorRate    float64
	IsEntrypoint bool
	Versions     []*Version
}

// Version is one version of a service: its share of traffic, its pod count and the
// script each of its pods runs per request.
type Version struct {
	Name string
	// Weight is relative: the version receives Weight/sum(weights) of its service's
	// traffic when a mesh splits traffic. Zero means no traffic.
	Weight   int
	Replicas int
	Script   Script
}

// Script is the sequence of steps a service runs for every request.
type Script []Step

// Step is exactly one of: a call, a sleep, a CPU burn, or a concurrent group of steps
// that all start together and are all waited for.
type Step struct {
	Call       *Call
	Sleep      *Delay
	CPU        time.Duration
	Concurrent []Step
}

// Call is an HTTP request to another service of the graph.
type Call struct {
	Service string
	// Path of the request; empty means the callee's Path.
	Path string
	// Size of the request body in bytes; 0 sends a GET, more sends a POST.
	Size int64
	// Probability (0..1) that the call is made at all.
	Probability float64
}

// Distribution names how a Delay is drawn.
type Distribution string

const (
	Constant    Distribution = "constant"
	Normal      Distribution = "normal"
	Exponential Distribution = "exponential"
	Uniform     Distribution = "uniform"
)

// Delay is a sleep, fixed or drawn from a distribution and clamped to [Min, Max]
// (Max 0 means unbounded). Constant uses Mean; Uniform uses Min and Max.
type Delay struct {
	Distribution Distribution
	Mean         time.Duration
	Stddev       time.Duration
	Min          time.Duration
	Max          time.Duration
}

// Deployment is one version of one service as the testbed deploys it: Replicas pods,
// each running `meshmark service` (see Graph.ServiceArgs) and listening on Port.
type Deployment struct {
	Service  string
	Version  string
	Weight   int
	Replicas int
	Port     int
	Protocol string
}

// Entrypoint is where the load generator sends requests.
type Entrypoint struct {
	Service string
	Port    int
	Path    string
}

// Service returns the service with the given name, or nil.
func (g *Graph) Service(name string) *Service {
	for _, s := range g.Services {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// Version returns the version with the given name, or nil.
func (s *Service) Version(name string) *Version {
	for _, v := range s.Versions {
		if v.Name == name {
			return v
		}
	}
	return nil
}

// WeightPercents returns each version's share of traffic in whole percent, in the order
// of s.Versions, summing to exactly 100 (largest remainder first), as meshes such as
// Istio require for a traffic split.
func (s *Service) WeightPercents() []int {
	total := 0
	for _, v := range s.Versions {
		total += v.Weight
	}
	out := make([]int, len(s.Versions))
	if total == 0 {
		return out
	}
	remainders := make([]int, len(s.Versions))
	given := 0
	for i, v := range s.Versions {
		out[i] = 100 * v.Weight / total
		remainders[i] = 100 * v.Weight % total
		given += out[i]
	}
	for ; given < 100; given++ {
		best := 0
		for i := range remainders {
			if remainders[i] > remainders[best] {
				best = i
			}
		}
		out[best]++
		remainders[best] = -1
	}
	return out
}

// Deployments lists every version of every service, in graph order.
func (g *Graph) Deployments() []Deployment {
	var out []Deployment
	for _, s := range g.Services {
		for _, v := range s.Versions {
			out = append(out, Deployment{
				Service:  s.Name,
				Version:  v.Name,
				Weight:   v.Weight,
				Replicas: v.Replicas,
				Port:     s.Port,
				Protocol: s.Protocol,
			})
		}
	}
	return out
}

// Entrypoint returns the service the load generator calls. Validation guarantees there
// is exactly one: the service marked isEntrypoint, or else the only service nobody calls.
func (g *Graph) Entrypoint() Entrypoint {
	for _, s := range g.Services {
		if s.IsEntrypoint {
			return Entrypoint{Service: s.Name, Port: s.Port, Path: s.Path}
		}
	}
	return Entrypoint{}
}

// SetReplicas gives every version of every service n pods (n >= 1); built-in graphs
// accept it as the option "replicas=N".
func (g *Graph) SetReplicas(n int) {
	for _, s := range g.Services {
		for _, v := range s.Versions {
			v.Replicas = n
		}
	}
}

// ServiceArgs returns the meshmark arguments (after the binary) that run one pod of a
// deployment: `service --graph <origin> --service S --version V --pod P --listen :PORT`.
func (g *Graph) ServiceArgs(d Deployment, pod string) []string {
	return []string{
		"service",
		"--graph", g.Origin,
		"--service", d.Service,
		"--version", d.Version,
		"--pod", pod,
		"--listen", ":" + strconv.Itoa(d.Port),
	}
}

// Calls returns every call the script can make, including those inside concurrent
// groups, in order.
func (sc Script) Calls() []*Call {
	var out []*Call
	for i := range sc {
		st := &sc[i]
		if st.Call != nil {
			out = append(out, st.Call)
		}
		out = append(out, Script(st.Concurrent).Calls()...)
	}
	return out
}
