package traefikmesh

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/topology"
)

// reloadTimeout bounds how long Authorize waits for every node proxy to load a new
// configuration.
const reloadTimeout = 10 * time.Second

// Authorize applies Traefik Mesh's ACL mode (mesh.Authorizer): each service named in
// allowed admits, through the mesh, only the pods of the listed caller services, by
// their source address (what Traefik Mesh derives from SMI TrafficTargets: an IP
// allow-list middleware on the service's router); a denied caller gets Traefik's 403.
// Every node proxy's file provider picks the new routes up (Traefik watches the file)
// and Authorize returns once each has reloaded. Traefik Mesh intercepts nothing: a
// pod calling a service's address directly never meets the list, which the bypass
// probe shows.
func (p *Profile) Authorize(ctx context.Context, sub substrate.Substrate, app *topology.App, allowed map[string][]string) error {
	callerPods, err := mesh.CallerPods(app, allowed)
	if err != nil {
		return err
	}
	acl := map[string][]string{}
	for callee, callers := range callerPods {
		sources := []string{}
		for _, ep := range callers {
			sources = append(sources, netip.PrefixFrom(ep.IP, ep.IP.BitLen()).String())
		}
		slices.Sort(sources)
		acl[callee] = sources
	}
	dynamic, err := DynamicConfig(app, acl)
	if err != nil {
		return err
	}
	p.mu.Lock()
	nodes := make([]*nodeProxy, 0, len(p.nodes))
	for _, n := range p.nodes {
		nodes = append(nodes, n)
	}
	p.mu.Unlock()
	if len(nodes) == 0 {
		return fmt.Errorf("%s: no node proxy runs (Install first)", Name)
	}
	before := map[string]uint64{}
	for _, n := range nodes {
		v, err := p.reloads(ctx, sub, n.node)
		if err != nil {
			return err
		}
		before[n.node.Name] = v
	}
	for _, n := range nodes {
		// WriteFile replaces the file by a rename, so Traefik never reads half a file.
		if _, err := sub.WriteFile(n.node, dynamicFile, dynamic, 0o644); err != nil {
			return err
		}
	}
	p.mu.Lock()
	p.configs["dynamic.yml"] = dynamic
	p.mu.Unlock()
	deadline := time.Now().Add(reloadTimeout)
	for _, n := range nodes {
		for {
			v, err := p.reloads(ctx, sub, n.node)
			if err == nil && v > before[n.node.Name] {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s: traefik on %s did not reload its routes within %s (reloads %d, %v)", Name, n.node.Name, reloadTimeout, v, err)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

// reloads reads how many times a node proxy has loaded its dynamic configuration.
func (p *Profile) reloads(ctx context.Context, sub substrate.Substrate, node topology.Pod) (uint64, error) {
	text, err := fetch(ctx, sub, node, "/metrics")
	if err != nil {
		return 0, err
	}
	m, err := ParseMetrics(text)
	if err != nil {
		return 0, err
	}
	v, ok := m.Values["traefik_config_reloads_total"]
	if !ok {
		return 0, fmt.Errorf("traefik on %s reports no traefik_config_reloads_total", node.Name)
	}
	return v, nil
}
