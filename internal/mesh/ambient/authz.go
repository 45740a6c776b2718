package ambient

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/ambient/workloadapi/security"
	"github.com/meshmark/meshmark/internal/mesh/policyfile"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/topology"
	"google.golang.org/protobuf/encoding/protojson"
)

// policyApplyTimeout bounds how long Authorize waits for every ztunnel to acknowledge
// a policy.
const policyApplyTimeout = 10 * time.Second

// AuthorizationPolicies is what ztunnel enforces for an allow-list of callers per
// service: for each service named, a DENY of every connection to its pods from a
// principal not listed (an empty list denies everyone). It is the L4 meaning of an
// Istio ALLOW AuthorizationPolicy on the service's workloads with
// `from.source.principals`, written as one namespace-wide DENY per service scoped by
// the pods' addresses, so that no workload entry has to change.
func (p *Profile) AuthorizationPolicies(app *topology.App, allowed map[string][]string) ([]*security.Authorization, error) {
	meshed := map[string]bool{}
	for _, pod := range p.MeshedPods(app) {
		meshed[pod.Name] = true
	}
	callerPods, err := mesh.CallerPods(app, allowed)
	if err != nil {
		return nil, err
	}
	callees := make([]string, 0, len(allowed))
	for callee := range allowed {
		callees = append(callees, callee)
	}
	slices.Sort(callees)
	var out []*security.Authorization
	for _, callee := range callees {
		s := app.Service(callee)
		var principals []string
		for _, ep := range callerPods[callee] {
			if id := strings.TrimPrefix(p.Identity(app, ep), "spiffe://"); meshed[ep.Name] && !slices.Contains(principals, id) {
				principals = append(principals, id)
			}
		}
		slices.Sort(principals)
		match := &security.Match{}
		for _, v := range s.Versions {
			for _, ep := range v.Endpoints {
				if meshed[ep.Name] {
					a := ep.IP.As4()
					match.DestinationIps = append(match.DestinationIps, &security.Address{Address: a[:], Length: 32})
				}
			}
		}
		if len(match.DestinationIps) == 0 {
			continue // nothing of it is in the mesh
		}
		for _, id := range principals {
			match.NotPrincipals = append(match.NotPrincipals, &security.StringMatch{MatchType: &security.StringMatch_Exact{Exact: id}})
		}
		out = append(out, &security.Authorization{
			Name:      "meshmark-allow-" + callee,
			Namespace: app.Namespace,
			Scope:     security.Scope_NAMESPACE,
			Action:    security.Action_DENY,
			Rules:     []*security.Rule{{Clauses: []*security.Clause{{Matches: []*security.Match{match}}}}},
		})
	}
	return out, nil
}

// Authorize applies the policies of AuthorizationPolicies (mesh.Authorizer): the
// control plane pushes them to every ztunnel over xDS and Authorize returns once each
// has acknowledged them; a denied caller's connection is then closed by the callee's
// ztunnel. Behind a waypoint the callee's ztunnel sees the waypoint, not the caller, as
// its peer; Istio enforces such policies in the waypoint, which meshmark's does not
// do, so Authorize refuses rather than apply a policy that would not hold.
func (p *Profile) Authorize(ctx context.Context, sub substrate.Substrate, app *topology.App, allowed map[string][]string) error {
	if p.withWaypoint && len(allowed) > 0 {
		return fmt.Errorf("%s: with a waypoint, callers reach services through it and Istio enforces their policies there; meshmark's waypoint does not", Name)
	}
	policies, err := p.AuthorizationPolicies(app, allowed)
	if err != nil {
		return err
	}
	doc := policyDoc{Policies: []json.RawMessage{}}
	for _, pol := range policies {
		b, err := protojson.Marshal(pol)
		if err != nil {
			return err
		}
		doc.Policies = append(doc.Policies, b)
	}
	p.mu.Lock()
	path := p.policyFile
	p.policyVersion++
	doc.Version = p.policyVersion
	p.mu.Unlock()
	if path == "" {
		return fmt.Errorf("%s: the control plane is not running (Install first)", Name)
	}
	js, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.configs["control-plane/"+PolicyFile] = js
	p.mu.Unlock()
	if err := policyfile.Push(ctx, path, js, doc.Version, policyApplyTimeout); err != nil {
		return fmt.Errorf("%s: %w", Name, err)
	}
	return nil
}
