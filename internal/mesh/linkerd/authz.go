package linkerd

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/linkerd/controlplane"
	"github.com/meshmark/meshmark/internal/mesh/policyfile"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/topology"
)

// policyApplyTimeout bounds how long Authorize waits for the control plane to push a
// policy to every proxy.
const policyApplyTimeout = 10 * time.Second

// Authorize applies what Linkerd makes of an AuthorizationPolicy whose
// MeshTLSAuthentication names the callers' service accounts (mesh.Authorizer): each
// meshed pod of a service named in allowed admits only the identities of the listed
// caller services' pods; a denied HTTP call gets the proxy's 403. meshmark's control
// plane pushes the policy on the proxies' open WatchPort streams, as Linkerd's policy
// controller does, and Authorize returns once every stream has been sent it.
func (p *Profile) Authorize(ctx context.Context, sub substrate.Substrate, app *topology.App, allowed map[string][]string) error {
	pol := controlplane.AuthzPolicy{Pods: map[string][]string{}}
	meshed := map[string]bool{}
	for _, pod := range p.MeshedPods(app) {
		meshed[pod.Name] = true
	}
	callerPods, err := mesh.CallerPods(app, allowed)
	if err != nil {
		return err
	}
	for callee, callers := range callerPods {
		s := app.Service(callee)
		ids := []string{} // naming no caller denies everyone
		for _, ep := range callers {
			if id := p.Identity(app, ep); meshed[ep.Name] && !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
		slices.Sort(ids)
		for _, v := range s.Versions {
			for _, ep := range v.Endpoints {
				if meshed[ep.Name] {
					pol.Pods[ep.Name] = ids
				}
			}
		}
	}
	p.mu.Lock()
	path := p.policyFile
	p.policyVersion++
	pol.Version = p.policyVersion
	p.mu.Unlock()
	if path == "" {
		return fmt.Errorf("%s: the control plane is not running (Install first)", Name)
	}
	js, err := json.MarshalIndent(pol, "", "  ")
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.configs["control-plane/authz-policy.json"] = js
	p.mu.Unlock()
	if err := policyfile.Push(ctx, path, js, pol.Version, policyApplyTimeout); err != nil {
		return fmt.Errorf("%s: %w", Name, err)
	}
	return nil
}
