// Package none is the baseline mesh profile: no proxy, no interception, no mTLS. Its
// check proves that every pod answers directly, so a failed baseline is never mistaken
// for mesh overhead.
//
// How the baseline balances is its one choice (`balancing`). Per request, the default:
// every workload calls its callees' pods directly, picking one per request by the
// versions' weights (mesh.Spreader), as a mesh's proxies do, so the baseline's request
// mix is the meshes' and their latencies are comparable. Per connection: callers use
// the service addresses, which pick an endpoint per connection as kube-proxy does, so a
// kept-alive connection fixes the split at bring-up (one version may serve nothing):
// what an application without a mesh really gets, and what an L4 mesh compares to.
package none

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/topology"
	"github.com/meshmark/meshmark/internal/workload"
)

// Name is the registry name.
const Name = "none"

// The values of the balancing option.
const (
	PerRequest    = mesh.BalancePerRequest
	PerConnection = mesh.BalancePerConnection
)

func init() {
	mesh.RegisterProfile(mesh.Registration{Name: Name, Summary: "the baseline: no proxy, no interception, no mTLS", New: New,
		Own: map[string]string{
			"balancing": PerRequest + " (default: each caller picks a callee's pod per request by the versions' weights, as the meshes' proxies do) | " +
				PerConnection + " (the service address picks one per connection, as kube-proxy does)",
		}})
}

// Profile is the no-mesh baseline.
type Profile struct {
	balancing string
}

var _ mesh.Spreader = Profile{}

// New accepts only options that make sense without a mesh.
func New(o mesh.Options) (mesh.Profile, error) {
	if m := o.EffectiveMTLS(mesh.MTLSOff); m != mesh.MTLSOff {
		return nil, &mesh.OptionError{Key: "mtls", Msg: fmt.Sprintf("%s needs a mesh; the baseline has none", m)}
	}
	if o.MeshClients == mesh.On {
		return nil, &mesh.OptionError{Key: "mesh_clients", Msg: "the baseline has no mesh to enroll clients in"}
	}
	b, err := o.OwnWord("balancing", PerRequest, PerRequest, PerConnection)
	if err != nil {
		return nil, err
	}
	return Profile{balancing: b}, nil
}

func (Profile) Name() string { return Name }

// Balancing is the balancing option in force.
func (p Profile) Balancing() string { return p.balancing }

// SpreadEndpoints gives, under per-request balancing, the pods of the service's
// versions with a positive weight (every pod when no version has one), each weighing
// its version's weight shared among the version's pods.
func (p Profile) SpreadEndpoints(app *topology.App, service string) ([]workload.Endpoint, bool) {
	s := app.Service(service)
	if p.balancing != PerRequest || s == nil {
		return nil, false
	}
	split := false
	for _, v := range s.Versions {
		split = split || v.Weight > 0
	}
	var out []workload.Endpoint
	for _, v := range s.Versions {
		if split && v.Weight <= 0 {
			continue
		}
		for _, pod := range v.Endpoints {
			w := 1000 // an unsplit service: every pod alike
			if split {
				w = max(1, v.Weight*1000/len(v.Endpoints))
			}
			out = append(out, workload.Endpoint{Addr: mesh.Addr(pod.IP, pod.Port), Weight: w})
		}
	}
	return out, len(out) > 0
}

func (Profile) Install(context.Context, substrate.Substrate, *topology.App) error { return nil }

func (Profile) Uninstall(context.Context, substrate.Substrate) error { return nil }

func (Profile) Configs() map[string][]byte { return map[string][]byte{} }

// Check sends one request to every service pod, straight to its address.
func (Profile) Check(ctx context.Context, sub substrate.Substrate, app *topology.App) (mesh.Enrollment, error) {
	e := mesh.Enrollment{Mesh: Name, MTLS: mesh.MTLSOff, Pass: true, CheckedAt: time.Now().UTC()}
	from, ok := mesh.Prober(app)
	if !ok {
		return e, fmt.Errorf("app %s has no pods", app.Name)
	}
	// Probes are independent; sent together they cost one round trip, not one per pod.
	type probe struct {
		pe  mesh.PodEnrollment
		err error
	}
	var probes []*probe
	var wg sync.WaitGroup
	for _, s := range app.Services {
		for _, v := range s.Versions {
			for _, p := range v.Endpoints {
				pr := &probe{pe: mesh.PodEnrollment{Pod: p.Name, Service: s.Name, MTLSObserved: "plaintext"}}
				probes = append(probes, pr)
				wg.Add(1)
				go func() {
					defer wg.Done()
					start := time.Now()
					r, err := mesh.ProbeHTTP(ctx, sub, from, mesh.Addr(p.IP, p.Port), fmt.Sprintf("%s:%d", s.Name, s.Port), "/")
					took := time.Since(start).Round(time.Millisecond)
					if err != nil {
						pr.err = err
						pr.pe.Notes = append(pr.pe.Notes, err.Error())
						return
					}
					pr.pe.Answered = true
					pr.pe.Notes = append(pr.pe.Notes, fmt.Sprintf("direct probe from %s: HTTP %d in %s", from.Name, r.Status, took))
				}()
			}
		}
	}
	wg.Wait()
	for _, pr := range probes {
		if pr.err != nil {
			e.Fail("pod %s does not answer directly: %v", pr.pe.Pod, pr.err)
		}
		e.Pods = append(e.Pods, pr.pe)
	}
	for _, c := range app.Clients {
		e.Pods = append(e.Pods, mesh.PodEnrollment{Pod: c.Name, MTLSObserved: "none"})
	}
	if ctx.Err() != nil {
		return e, ctx.Err()
	}
	return e, nil
}
