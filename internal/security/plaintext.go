package security

import (
	"context"
	"errors"
	"fmt"
	"syscall"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/meshprobe"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/topology"
)

// probePlaintext: a caller with no mesh identity sends plain HTTP to every meshed
// service, on its service address and on each pod's own address and port, and to a
// second port the application opens in one pod of each service (the probe's own
// listener). Under strict mTLS every one must be refused (reset, closed, or a proxy's
// 403); a request the application answers got through.
func probePlaintext(ctx context.Context, tgt Target, p mesh.Posture) results.SecurityProbe {
	r := results.SecurityProbe{Probe: results.ProbePlaintext, Promised: promise(p.RefusesPlaintext, "callers without a mesh identity refused", "plaintext callers accepted")}
	from, where, ok := outsider(tgt, p)
	if !ok {
		return notApplicable(r.Probe, "no pod outside the mesh to call from")
	}
	services := meshedServices(tgt, p)
	if len(services) == 0 {
		return notApplicable(r.Probe, "no meshed service")
	}
	unreachable := 0
	for _, s := range services {
		host := fmt.Sprintf("%s:%d", s.Name, s.Port)
		if s.VIP.IsValid() {
			if c, ok := plainCall(ctx, tgt, from, where, "service "+s.Name, mesh.Addr(s.VIP, s.Port), host); ok {
				r.Checks = append(r.Checks, c)
			} else {
				unreachable++
			}
		}
		for _, pod := range servicePods(s) {
			if c, ok := plainCall(ctx, tgt, from, where, "pod "+pod.Name, mesh.Addr(pod.IP, s.Port), host); ok {
				r.Checks = append(r.Checks, c)
			} else {
				unreachable++
			}
		}
		if c, ok := secondPortCheck(ctx, tgt, from, where, servicePods(s)[0]); ok {
			r.Checks = append(r.Checks, c)
		}
	}
	judge(&r, p.RefusesPlaintext, "plaintext refused")
	if unreachable > 0 {
		r.Summary += fmt.Sprintf(" (%d addresses not routable from %s, not judged)", unreachable, where)
	}
	return r
}

// plainCall sends one plain request; ok is false when the address is not routable
// from the vantage point at all (a node's namespace has no service address
// translation), which says nothing about the mesh.
func plainCall(ctx context.Context, tgt Target, from topology.Pod, where, what, addr, host string) (results.SecurityCheck, bool) {
	c := results.SecurityCheck{Target: fmt.Sprintf("%s -> %s (%s)", where, what, addr)}
	res, err := mesh.ProbeHTTP(ctx, tgt.Sub, from, addr, host, "/")
	if errors.Is(err, syscall.ENETUNREACH) || errors.Is(err, syscall.EHOSTUNREACH) {
		return c, false
	}
	c.Observed, c.Held = meshprobe.Refusal(res, err)
	return c, true
}

func promise(on bool, yes, no string) string {
	if on {
		return yes
	}
	return no
}
