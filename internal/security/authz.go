package security

import (
	"context"
	"fmt"
	"slices"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/meshprobe"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/topology"
)

// probeAuthorization applies, through the profile, a policy that lets each meshed
// service be called only by the services that really call it (the graph's edges).
// Per callee a real caller must still be served and a meshed pod of another service
// must get the mesh's denial; once the policy is removed the same other pod must be
// served again, so a denial is the policy's doing and not a broken path.
func probeAuthorization(ctx context.Context, tgt Target, p mesh.Posture) results.SecurityProbe {
	r := results.SecurityProbe{Probe: results.ProbeAuthorization, Promised: "only the allowed callers reach each service"}
	az, ok := tgt.Profile.(mesh.Authorizer)
	if !ok {
		return notApplicable(r.Probe, fmt.Sprintf("meshmark cannot apply %s's authorization policy", tgt.Profile.Name()))
	}
	services := meshedServices(tgt, p)
	meshed := meshedSet(p)
	callersOf := map[string][]string{}
	for caller, callees := range tgt.App.Calls {
		if s := tgt.App.Service(caller); s == nil || !allMeshed(*s, meshed) {
			continue // an unmeshed caller has no identity to allow
		}
		for _, callee := range callees {
			callersOf[callee] = append(callersOf[callee], caller)
		}
	}
	allowed := map[string][]string{}
	type pair struct {
		callee        topology.Service
		caller, other topology.Pod
	}
	var plan []pair
	for _, s := range services {
		callers := callersOf[s.Name]
		if len(callers) == 0 {
			continue
		}
		slices.Sort(callers)
		allowed[s.Name] = callers
		pr := pair{callee: s}
		for _, c := range callers {
			if cs := tgt.App.Service(c); cs != nil && len(servicePods(*cs)) > 0 {
				pr.caller = servicePods(*cs)[0]
				break
			}
		}
		for _, o := range services {
			if o.Name != s.Name && !slices.Contains(callers, o.Name) {
				pr.other = servicePods(o)[0]
				break
			}
		}
		if pr.other.Name == "" {
			// no other meshed service: a meshed client holds an identity too. Not the
			// callee's own pods: a call can land on the caller itself, which meshes
			// treat as local traffic.
			for _, c := range tgt.App.Clients {
				if meshed[c.Name] {
					pr.other = c
					break
				}
			}
		}
		plan = append(plan, pr)
	}
	if len(plan) == 0 {
		return notApplicable(r.Probe, "no meshed service has a meshed caller in the graph")
	}
	if !slices.ContainsFunc(plan, func(p pair) bool { return p.other.Name != "" }) {
		return notApplicable(r.Probe, "no meshed pod outside the allowed callers to try a denial from")
	}
	if err := az.Authorize(ctx, tgt.Sub, tgt.App, allowed); err != nil {
		return notApplicable(r.Probe, "policy not applied: "+err.Error())
	}
	removed := false
	defer func() {
		if !removed {
			az.Authorize(context.WithoutCancel(ctx), tgt.Sub, tgt.App, nil)
		}
	}()
	// Calls go the way the app's own do: by the mesh's names where it has them
	// (Traefik Mesh), else to the service address.
	call := func(from topology.Pod, s topology.Service) (meshprobe.ProbeResult, error) {
		if ma, ok := tgt.Profile.(mesh.Addressing); ok {
			if authority, dial, ok := ma.CalleeAddress(from, s.Name); ok {
				return mesh.ProbeHTTP(ctx, tgt.Sub, from, dial, authority, "/")
			}
		}
		return mesh.ProbeHTTP(ctx, tgt.Sub, from, mesh.Addr(s.VIP, s.Port), fmt.Sprintf("%s:%d", s.Name, s.Port), "/")
	}
	var denied []pair
	for _, pr := range plan {
		if pr.caller.Name != "" {
			res, err := call(pr.caller, pr.callee)
			obs, refused := meshprobe.Refusal(res, err)
			r.Checks = append(r.Checks, results.SecurityCheck{Target: fmt.Sprintf("%s -> %s (allowed)", pr.caller.Service, pr.callee.Name),
				Observed: obs, Held: !refused && res.Status < 400})
		}
		if pr.other.Name != "" {
			res, err := call(pr.other, pr.callee)
			obs, refused := meshprobe.Refusal(res, err)
			r.Checks = append(r.Checks, results.SecurityCheck{Target: fmt.Sprintf("%s -> %s (not allowed)", callerName(pr.other), pr.callee.Name),
				Observed: obs, Held: refused})
			denied = append(denied, pr)
		}
	}
	if err := az.Authorize(ctx, tgt.Sub, tgt.App, nil); err != nil {
		r.Checks = append(r.Checks, results.SecurityCheck{Target: "policy removal", Observed: err.Error()})
	} else {
		removed = true
		for _, pr := range denied {
			res, err := call(pr.other, pr.callee)
			obs, refused := meshprobe.Refusal(res, err)
			r.Checks = append(r.Checks, results.SecurityCheck{Target: fmt.Sprintf("%s -> %s (policy removed)", callerName(pr.other), pr.callee.Name),
				Observed: obs, Held: !refused && res.Status < 400})
		}
	}
	judge(&r, true, "policy enforced")
	return r
}

func allMeshed(s topology.Service, meshed map[string]bool) bool {
	pods := servicePods(s)
	for _, p := range pods {
		if !meshed[p.Name] {
			return false
		}
	}
	return len(pods) > 0
}

// callerName names a caller by its service, or by its pod for a client.
func callerName(p topology.Pod) string {
	if p.Service != "" {
		return p.Service
	}
	return p.Name
}
