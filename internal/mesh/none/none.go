// Package none is the baseline mesh profile: no proxy, no interception, no mTLS. Its
// check proves that every pod answers directly, so a failed baseline is never mistaken
// for mesh overhead.
package none

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/topology"
)

// Name is the registry name.
const Name = "none"

func init() {
	mesh.RegisterProfile(mesh.Registration{Name: Name, Summary: "the baseline: no proxy, no interception, no mTLS", New: New})
}

// Profile is the no-mesh baseline.
type Profile struct{}

// New accepts only options that make sense without a mesh.
func New(o mesh.Options) (mesh.Profile, error) {
	if m := o.EffectiveMTLS(mesh.MTLSOff); m != mesh.MTLSOff {
		return nil, &mesh.OptionError{Key: "mtls", Msg: fmt.Sprintf("%s needs a mesh; the baseline has none", m)}
	}
	if o.MeshClients == mesh.On {
		return nil, &mesh.OptionError{Key: "mesh_clients", Msg: "the baseline has no mesh to enroll clients in"}
	}
	return Profile{}, nil
}

func (Profile) Name() string { return Name }

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
