package traefikmesh

import (
	"fmt"
	"net"
	"strconv"

	"gopkg.in/yaml.v3"

	"github.com/meshmark/meshmark/internal/topology"
)

// Ports in the node's namespace. Traefik Mesh gives each service port an entry point
// from 5000 up; metrics and ping share an entry point on loopback.
const (
	FirstServicePort = 5000
	MetricsPort      = 8082
)

// MeshDomain is Traefik Mesh's DNS suffix: <svc>.<ns>.traefik.mesh.
const MeshDomain = "traefik.mesh"

// MeshName is the name a client uses for a service.
func MeshName(ns, svc string) string { return svc + "." + ns + "." + MeshDomain }

// EntryPoints assigns each service of app its port on every node proxy, in the
// order of app.Services (stable for one app).
func EntryPoints(app *topology.App) map[string]int {
	out := make(map[string]int, len(app.Services))
	for i, s := range app.Services {
		out[s.Name] = FirstServicePort + i
	}
	return out
}

// Static configuration (traefik.yml), only the fields meshmark sets.
type staticConfig struct {
	Global      map[string]bool       `yaml:"global"`
	EntryPoints map[string]entryPoint `yaml:"entryPoints"`
	Providers   struct {
		File struct {
			Filename string `yaml:"filename"`
			Watch    bool   `yaml:"watch"`
		} `yaml:"file"`
	} `yaml:"providers"`
	Metrics struct {
		Prometheus struct {
			EntryPoint           string `yaml:"entryPoint"`
			AddRoutersLabels     bool   `yaml:"addRoutersLabels"`
			AddServicesLabels    bool   `yaml:"addServicesLabels"`
			AddEntryPointsLabels bool   `yaml:"addEntryPointsLabels"`
		} `yaml:"prometheus"`
	} `yaml:"metrics"`
	Ping struct {
		EntryPoint string `yaml:"entryPoint"`
	} `yaml:"ping"`
	Log       map[string]string `yaml:"log"`
	AccessLog *struct{}         `yaml:"accessLog,omitempty"`
}

type entryPoint struct {
	Address string `yaml:"address"`
}

// Dynamic configuration (file provider).
type dynamicConfig struct {
	HTTP struct {
		Routers     map[string]router     `yaml:"routers"`
		Services    map[string]service    `yaml:"services"`
		Middlewares map[string]middleware `yaml:"middlewares,omitempty"`
	} `yaml:"http"`
}

type router struct {
	EntryPoints []string `yaml:"entryPoints"`
	Rule        string   `yaml:"rule"`
	Service     string   `yaml:"service"`
	Middlewares []string `yaml:"middlewares,omitempty"`
}

type middleware struct {
	IPAllowList *ipAllowList `yaml:"ipAllowList,omitempty"`
}

type ipAllowList struct {
	SourceRange []string `yaml:"sourceRange"`
}

// denyAll is the source range of a service no caller may reach: an address no pod
// has (Traefik refuses an empty range), as Traefik Mesh's block-all middleware does.
const denyAll = "255.255.255.255/32"

// aclMiddleware names a service's access-control middleware.
func aclMiddleware(svc string) string { return "acl-" + svc }

type service struct {
	LoadBalancer *loadBalancer `yaml:"loadBalancer,omitempty"`
	Weighted     *weighted     `yaml:"weighted,omitempty"`
}

type loadBalancer struct {
	Servers        []server `yaml:"servers"`
	PassHostHeader bool     `yaml:"passHostHeader"`
}

type server struct {
	URL string `yaml:"url"`
}

type weighted struct {
	Services []weightedService `yaml:"services"`
}

type weightedService struct {
	Name   string `yaml:"name"`
	Weight int    `yaml:"weight"`
}

// metricsEntryPoint is the entry point of metrics and ping.
const metricsEntryPoint = "mesh-metrics"

// StaticConfig renders a node proxy's traefik.yml: one entry point per service, the
// file provider reading dynamicPath, Prometheus metrics labelled by router.
func StaticConfig(app *topology.App, dynamicPath string, accessLog bool) ([]byte, error) {
	var c staticConfig
	c.Global = map[string]bool{"checkNewVersion": false, "sendAnonymousUsage": false}
	c.EntryPoints = map[string]entryPoint{metricsEntryPoint: {Address: net.JoinHostPort("127.0.0.1", strconv.Itoa(MetricsPort))}}
	for name, port := range EntryPoints(app) {
		if name == metricsEntryPoint {
			return nil, fmt.Errorf("traefik-mesh: a service is named %s, the metrics entry point's name", name)
		}
		c.EntryPoints[name] = entryPoint{Address: ":" + strconv.Itoa(port)}
	}
	c.Providers.File.Filename = dynamicPath
	c.Providers.File.Watch = true // access control changes while the mesh runs
	p := &c.Metrics.Prometheus
	p.EntryPoint, p.AddRoutersLabels, p.AddServicesLabels, p.AddEntryPointsLabels = metricsEntryPoint, true, true, true
	c.Ping.EntryPoint = metricsEntryPoint
	c.Log = map[string]string{"level": "ERROR"}
	if accessLog {
		c.AccessLog = &struct{}{}
	}
	return yaml.Marshal(&c)
}

// versionService names a version's service; "_" cannot occur in a service name (a DNS
// label), so it never collides with one.
func versionService(svc, version string) string { return svc + "_" + version }

// DynamicConfig renders the file provider's routes from the app graph: per service a
// router on its entry point matching its mesh name, and either a load balancer over
// its pods or, for a split, a weighted service over one load balancer per version.
// gRPC and HTTP/2 services are reached in h2c. A service named in acl only admits
// callers from the listed source addresses (Traefik Mesh's ACL mode: an IP allow-list
// middleware on its router, built from the pods a TrafficTarget names; none listed
// admits nobody); other services stay open.
func DynamicConfig(app *topology.App, acl map[string][]string) ([]byte, error) {
	var c dynamicConfig
	c.HTTP.Routers = map[string]router{}
	c.HTTP.Services = map[string]service{}
	for svc, sources := range acl {
		if app.Service(svc) == nil {
			return nil, fmt.Errorf("traefik-mesh: access control for unknown service %q", svc)
		}
		if len(sources) == 0 {
			sources = []string{denyAll}
		}
		if c.HTTP.Middlewares == nil {
			c.HTTP.Middlewares = map[string]middleware{}
		}
		c.HTTP.Middlewares[aclMiddleware(svc)] = middleware{IPAllowList: &ipAllowList{SourceRange: sources}}
	}
	for _, s := range app.Services {
		// Entry points take HTTP/1.1 and h2c alike; toward pods, gRPC and HTTP/2
		// services are spoken to in h2c (prior knowledge), as Traefik Mesh does for
		// services annotated with their scheme.
		scheme := "http"
		if s.Protocol == "grpc" || s.Protocol == "http2" {
			scheme = "h2c"
		}
		lb := func(eps []topology.Pod) *loadBalancer {
			l := &loadBalancer{PassHostHeader: true}
			for _, ep := range eps {
				l.Servers = append(l.Servers, server{URL: scheme + "://" + net.JoinHostPort(ep.IP.String(), strconv.Itoa(ep.Port))})
			}
			return l
		}
		r := router{
			EntryPoints: []string{s.Name},
			Rule:        fmt.Sprintf("Host(`%s`)", MeshName(app.Namespace, s.Name)),
			Service:     s.Name,
		}
		if _, restricted := acl[s.Name]; restricted {
			r.Middlewares = []string{aclMiddleware(s.Name)}
		}
		c.HTTP.Routers[s.Name] = r
		var w weighted
		var all []topology.Pod
		for _, v := range s.Versions {
			all = append(all, v.Endpoints...)
			if v.Weight < 0 {
				return nil, fmt.Errorf("traefik-mesh: service %s version %s: negative weight %d", s.Name, v.Name, v.Weight)
			}
			if v.Weight > 0 && len(v.Endpoints) > 0 {
				w.Services = append(w.Services, weightedService{Name: versionService(s.Name, v.Name), Weight: v.Weight})
				c.HTTP.Services[versionService(s.Name, v.Name)] = service{LoadBalancer: lb(v.Endpoints)}
			}
		}
		if len(all) == 0 {
			return nil, fmt.Errorf("traefik-mesh: service %s has no endpoints", s.Name)
		}
		if len(s.Versions) > 1 && len(w.Services) > 0 {
			c.HTTP.Services[s.Name] = service{Weighted: &w}
		} else {
			c.HTTP.Services[s.Name] = service{LoadBalancer: lb(all)}
		}
	}
	return yaml.Marshal(&c)
}
