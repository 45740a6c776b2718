// Package traefikmesh is the traefik-mesh profile: Traefik Mesh's data plane, the real
// Traefik proxy (v3.7.9) running once per node like its DaemonSet, configured through
// its file provider from the app graph: one entry point (port) per service, a router
// matching the service's mesh name, and a weighted service for each split. Nothing is
// intercepted: clients call <svc>.<ns>.traefik.mesh on the service's port of their own
// node's proxy, as Traefik Mesh's CoreDNS makes them; the runner hands each workload
// those names (mesh.Addressing). Traefik Mesh has no mTLS, so only mtls: off is taken.
package traefikmesh

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/prereq"
	"github.com/meshmark/meshmark/internal/published"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/topology"
)

// Name is the registry name.
const Name = "traefik-mesh"

const noMTLS = "Traefik Mesh has no mTLS between its proxies (traffic between nodes is plaintext HTTP); use mtls: off"

func init() {
	mesh.RegisterProfile(mesh.Registration{
		Name:    Name,
		Summary: "Traefik Mesh: the real Traefik on every node, file-provider routes from the app graph, clients call <svc>.<ns>.traefik.mesh; no mTLS",
		New:     New,
		Unsupported: map[string]string{
			"mesh_clients":     "clients, the load generator too, always call through their node's proxy by the mesh names; there is no opt-out",
			"trust_domain":     "no workload identities: " + noMTLS,
			"request_id":       "Traefik does not generate x-request-id",
			"retries":          "Traefik Mesh retries nothing by default (a per-service annotation adds a retry middleware); not modelled",
			"circuit_breakers": "Traefik Mesh sets no connection limits by default; not modelled",
			"telemetry":        "Traefik Mesh always exports Prometheus metrics, and the enrollment check reads them",
		},
		Needs:  []string{"traefik"},
		Stands: []published.Stand{{For: "traefik"}},
		// Traefik Mesh was Maesh before its rename; the spec's enum keeps that name.
		SMPType: "maesh",
	})
}

var (
	_ mesh.Telemetry  = (*Profile)(nil)
	_ mesh.Addressing = (*Profile)(nil)
)

// Profile is one traefik-mesh configuration.
type Profile struct {
	opts mesh.Options

	mu      sync.Mutex
	configs map[string][]byte
	ns      string
	ports   map[string]int // service -> entry point port
	nodes   map[string]*nodeProxy
	version string
}

// dynamicFile is the file provider's file in each node's directory; Authorize
// rewrites it while Traefik runs.
const dynamicFile = "traefik-dynamic.yml"

type nodeProxy struct {
	node topology.Pod
	proc substrate.Process
}

// New builds the profile from parsed options. concurrency sets the proxy's
// GOMAXPROCS, Traefik's equivalent of worker threads.
func New(o mesh.Options) (mesh.Profile, error) {
	if m := o.EffectiveMTLS(mesh.MTLSOff); m != mesh.MTLSOff {
		return nil, &mesh.OptionError{Key: "mtls", Msg: fmt.Sprintf("%s is not available: %s", m, noMTLS)}
	}
	return &Profile{opts: o}, nil
}

func (p *Profile) Name() string { return Name }

// Configs returns every node's static and dynamic configuration.
func (p *Profile) Configs() map[string][]byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string][]byte, len(p.configs))
	for k, v := range p.configs {
		out[k] = append([]byte(nil), v...)
	}
	return out
}

type nodePodder interface {
	NodePod(node string) (topology.Pod, error)
}

// CalleeAddress is the mesh name of service on its entry point, resolving to the
// caller's own node's proxy (mesh.Addressing). Valid after Install.
func (p *Profile) CalleeAddress(from topology.Pod, svc string) (authority, dial string, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	port, known := p.ports[svc]
	n, onNode := p.nodes[from.Node]
	if !known || !onNode {
		return "", "", false
	}
	ps := strconv.Itoa(port)
	return net.JoinHostPort(MeshName(p.ns, svc), ps), net.JoinHostPort(n.node.IP.String(), ps), true
}

// Install starts Traefik on every node that hosts a pod of app and waits until each
// serves every service's router.
func (p *Profile) Install(ctx context.Context, sub substrate.Substrate, app *topology.App) error {
	bin, err := prereq.ProxyBin("traefik")
	if err != nil {
		return fmt.Errorf("%s: %w", Name, err)
	}
	np, ok := sub.(nodePodder)
	if !ok {
		return fmt.Errorf("%s: the substrate cannot run processes on a node (no NodePod)", Name)
	}
	dynamic, err := DynamicConfig(app, nil)
	if err != nil {
		return err
	}
	version := ""
	if out, err := exec.CommandContext(ctx, bin, "version").Output(); err == nil {
		for _, l := range strings.Split(string(out), "\n") {
			if f := strings.Fields(l); len(f) == 2 && f[0] == "Version:" {
				version = f[1]
			}
		}
	}
	p.mu.Lock()
	p.configs = map[string][]byte{"dynamic.yml": dynamic}
	p.ns = app.Namespace
	p.ports = EntryPoints(app)
	p.nodes = map[string]*nodeProxy{}
	p.version = version
	p.mu.Unlock()
	var nodes []topology.Pod
	seen := map[string]bool{}
	for _, pod := range app.Pods() {
		if pod.Node == "" || seen[pod.Node] {
			continue
		}
		seen[pod.Node] = true
		n, err := np.NodePod(pod.Node)
		if err != nil {
			return fmt.Errorf("%s: %w", Name, err)
		}
		nodes = append(nodes, n)
	}
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].Name < nodes[j].Name })
	for _, n := range nodes {
		if err := p.installNode(ctx, sub, app, n, bin, dynamic); err != nil {
			_ = p.Uninstall(context.WithoutCancel(ctx), sub)
			return fmt.Errorf("%s install: node %s: %w", Name, n.Name, err)
		}
	}
	return nil
}

func (p *Profile) installNode(ctx context.Context, sub substrate.Substrate, app *topology.App, n topology.Pod, bin string, dynamic []byte) error {
	dynPath, err := sub.WriteFile(n, dynamicFile, dynamic, 0o644)
	if err != nil {
		return err
	}
	static, err := StaticConfig(app, dynPath, p.opts.AccessLog)
	if err != nil {
		return err
	}
	staticPath, err := sub.WriteFile(n, "traefik.yml", static, 0o644)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.configs[n.Name+"/traefik.yml"] = static
	np := &nodeProxy{node: n}
	p.nodes[n.Name] = np
	p.mu.Unlock()
	proc, err := sub.Start(ctx, n, substrate.ProcessSpec{
		Name: "traefik",
		Role: substrate.RoleNodeProxy,
		Argv: []string{bin, "--configFile=" + staticPath},
		Env:  []string{"GOMAXPROCS=" + strconv.Itoa(p.opts.Concurrency)},
		UID:  substrate.ProxyUID,
		Ready: func(ctx context.Context) error {
			return p.routersReady(ctx, sub, app, n)
		},
	})
	if err != nil {
		return fmt.Errorf("start traefik: %w", err)
	}
	p.mu.Lock()
	np.proc = proc
	p.mu.Unlock()
	return nil
}

// routersReady holds until Traefik answers ping and every entry point has its router:
// with no router Traefik answers 404, with one whose pods are not up yet 502.
func (p *Profile) routersReady(ctx context.Context, sub substrate.Substrate, app *topology.App, n topology.Pod) error {
	r, err := mesh.ProbeHTTP(ctx, sub, n, metricsAddr, "", "/ping")
	if err != nil {
		return err
	}
	if r.Status != 200 {
		return fmt.Errorf("traefik /ping: HTTP %d", r.Status)
	}
	for _, s := range app.Services {
		port := EntryPoints(app)[s.Name]
		r, err := mesh.ProbeHTTP(ctx, sub, n, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), MeshName(app.Namespace, s.Name), "/")
		if err != nil {
			return err
		}
		if r.Status == 404 {
			return fmt.Errorf("traefik entry point %d has no router for %s yet", port, s.Name)
		}
	}
	return nil
}

// Uninstall stops every node proxy, continuing past errors.
func (p *Profile) Uninstall(ctx context.Context, sub substrate.Substrate) error {
	p.mu.Lock()
	nodes := p.nodes
	p.nodes = map[string]*nodeProxy{}
	p.mu.Unlock()
	var errs []error
	for _, n := range nodes {
		if n.proc != nil {
			if err := n.proc.Stop(); err != nil {
				errs = append(errs, fmt.Errorf("node %s: stop traefik: %w", n.node.Name, err))
			}
		}
	}
	return errors.Join(errs...)
}
