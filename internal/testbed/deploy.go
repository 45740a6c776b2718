package testbed

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/meshmark/meshmark/internal/topology"
)

// Deployment is one version of a service with its replicas.
type Deployment struct {
	Service  string
	Version  string // e.g. "v1"; empty means "v1"
	Weight   int    // traffic share when a mesh splits traffic
	Replicas int    // default 1
	Port     int    // the port the workload listens on, and the service port
	// Protocol the service speaks ("http", "http2", "grpc"); empty means AppSpec.Protocol.
	Protocol string
}

// AppSpec describes an application to deploy.
type AppSpec struct {
	Name        string // e.g. "bookinfo"
	Deployments []Deployment
	// Protocol of every service that does not name its own, default "http".
	Protocol string
	// Client is the name of the client pod for the load generator (default
	// "loadgen"); NoClient skips it.
	Client   string
	NoClient bool
	// ClientNode places the client pod; the service pods then go round-robin over the
	// other nodes (if there are any), so the load generator has a node of its own.
	// Empty means the client is placed round-robin like any pod.
	ClientNode string
}

// Deploy creates every pod (named <service>-<version>-<i>, round-robin over the nodes),
// one service per distinct Deployment.Service with a VIP, and the client pod, and
// returns the filled topology.App. Pods are created several at a time and the service
// rules are written once per namespace.
func (tb *Testbed) Deploy(ctx context.Context, spec AppSpec) (topology.App, error) {
	app := topology.App{Name: spec.Name, Namespace: tb.opts.Namespace}
	protocol := spec.Protocol
	if protocol == "" {
		protocol = "http"
	}
	serviceNodes := tb.Nodes()
	if spec.ClientNode != "" {
		if _, err := tb.nodeByName(spec.ClientNode); err != nil {
			return app, err
		}
		if len(serviceNodes) > 1 {
			serviceNodes = without(serviceNodes, spec.ClientNode)
		}
	}

	// Plan first, so that bad input fails before anything is created.
	type planned struct {
		spec    PodSpec
		service int
		version int
	}
	var plan []planned
	next := 0
	for i, d := range spec.Deployments {
		if d.Service == "" {
			return app, fmt.Errorf("testbed: deployment %d: service name is empty", i)
		}
		if d.Port < 1 || d.Port > 65535 {
			return app, fmt.Errorf("testbed: deployment %d (%s): port %d out of range", i, d.Service, d.Port)
		}
		version := d.Version
		if version == "" {
			version = "v1"
		}
		replicas := d.Replicas
		if replicas == 0 {
			replicas = 1
		}
		if d.Weight < 0 {
			return app, fmt.Errorf("testbed: deployment %d (%s %s): weight %d is negative", i, d.Service, version, d.Weight)
		}
		if replicas < 0 {
			return app, fmt.Errorf("testbed: deployment %d (%s): replicas %d is negative", i, d.Service, replicas)
		}
		svc := app.Service(d.Service)
		if svc == nil {
			p := d.Protocol
			if p == "" {
				p = protocol
			}
			app.Services = append(app.Services, topology.Service{Name: d.Service, Port: d.Port, Protocol: p})
			svc = &app.Services[len(app.Services)-1]
		} else if svc.Port != d.Port {
			return app, fmt.Errorf("testbed: deployment %d (%s %s): port %d differs from the service's port %d", i, d.Service, version, d.Port, svc.Port)
		}
		for _, v := range svc.Versions {
			if v.Name == version {
				return app, fmt.Errorf("testbed: deployment %d: %s %s is listed twice", i, d.Service, version)
			}
		}
		svc.Versions = append(svc.Versions, topology.Version{Name: version, Weight: d.Weight})
		si, vi := serviceIndex(app, d.Service), len(svc.Versions)-1
		for r := 0; r < replicas; r++ {
			plan = append(plan, planned{
				spec: PodSpec{
					Name:    fmt.Sprintf("%s-%s-%d", d.Service, version, r),
					Node:    serviceNodes[next%len(serviceNodes)],
					Service: d.Service,
					Version: version,
					Port:    d.Port,
				},
				service: si, version: vi,
			})
			next++
		}
	}
	if !spec.NoClient {
		name := spec.Client
		if name == "" {
			name = "loadgen"
		}
		clientNode := spec.ClientNode
		if clientNode == "" {
			clientNode = serviceNodes[next%len(serviceNodes)]
		}
		plan = append(plan, planned{spec: PodSpec{Name: name, Node: clientNode}, service: -1})
	}

	pods := make([]*pod, len(plan))
	errs := make([]error, len(plan))
	// Namespace creation and netlink calls serialize in the kernel on the rtnl lock,
	// but a few in flight hide the syscall and scheduling latency between them.
	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	for i, pl := range plan {
		if ctx.Err() != nil {
			errs[i] = ctx.Err()
			break
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			pods[i], errs[i] = tb.createPodNetwork(pl.spec)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return app, err
	}

	for i, pl := range plan {
		if pl.service < 0 {
			app.Clients = append(app.Clients, pods[i].topo)
			continue
		}
		v := &app.Services[pl.service].Versions[pl.version]
		v.Endpoints = append(v.Endpoints, pods[i].topo)
	}
	var specs []ServiceSpec
	for _, s := range app.Services {
		ss := ServiceSpec{Name: s.Name, Port: s.Port}
		for _, v := range s.Versions {
			ss.Endpoints = append(ss.Endpoints, v.Endpoints...)
		}
		specs = append(specs, ss)
	}
	vips, err := tb.AddServices(ctx, specs)
	if err != nil {
		return app, err
	}
	for i := range app.Services {
		app.Services[i].VIP = vips[i]
	}
	if err := tb.WaitForwarding(ctx); err != nil {
		return app, err
	}
	return app, nil
}

func serviceIndex(app topology.App, name string) int {
	for i, s := range app.Services {
		if s.Name == name {
			return i
		}
	}
	return -1
}

func without(list []string, drop string) []string {
	var out []string
	for _, s := range list {
		if s != drop {
			out = append(out, s)
		}
	}
	return out
}
