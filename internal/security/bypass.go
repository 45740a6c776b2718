package security

import (
	"context"
	"fmt"
	"net"
	"strings"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/meshprobe"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/topology"
)

// bypassRules take a pod's outbound traffic out of interception: a RETURN at the head
// of the nat and mangle OUTPUT chains skips every redirect, TPROXY mark and
// per-uid exclusion a profile put after it (istio-iptables, linkerd2-proxy-init,
// istio-cni's in-pod rules all hook there).
var bypassRules = [][]string{
	{"-t", "nat", "OUTPUT", "-p", "tcp", "-m", "comment", "--comment", "meshmark-bypass-probe", "-j", "RETURN"},
	{"-t", "mangle", "OUTPUT", "-p", "tcp", "-m", "comment", "--comment", "meshmark-bypass-probe", "-j", "RETURN"},
}

// probeBypass tries to get from one meshed pod to another without going through the
// source's proxy, and reports whether the mesh still stops it:
//   - as a workload running under a uid interception skips (the proxy's own);
//   - with the source pod's interception removed.
//
// The plain request then reaches the destination pod directly; only a destination
// that refuses callers without a mesh identity blocks it. Beside them, the ports the
// destination's interception excludes by design are called from outside the mesh,
// and what answers there is recorded as documented evidence, not judged.
func probeBypass(ctx context.Context, tgt Target, p mesh.Posture) results.SecurityProbe {
	r := results.SecurityProbe{Probe: results.ProbeBypass,
		Promised: promise(p.RefusesPlaintext, "a caller that skips its proxy is refused at the destination", "a caller that skips its proxy is served (plaintext accepted)")}
	services := meshedServices(tgt, p)
	if len(services) < 2 {
		return notApplicable(r.Probe, "needs two meshed services")
	}
	src := servicePods(services[0])[0]
	dstSvc := services[1]
	dst := servicePods(dstSvc)[0]
	addr := mesh.Addr(dst.IP, dstSvc.Port)
	host := fmt.Sprintf("%s:%d", dstSvc.Name, dstSvc.Port)
	route := fmt.Sprintf("%s -> pod %s (%s)", src.Name, dst.Name, addr)
	if ud, ok := tgt.Sub.(substrate.UIDDialer); ok {
		for _, uid := range p.ExcludedUIDs {
			res, err := meshprobe.ProbeHTTPWith(ctx, func(ctx context.Context, network, a string) (net.Conn, error) {
				return ud.DialContextAs(ctx, src, uid, network, a)
			}, meshprobe.ProbeRequest{Addr: addr, Host: host, Path: "/"})
			obs, refused := meshprobe.Refusal(res, err)
			r.Checks = append(r.Checks, results.SecurityCheck{Target: fmt.Sprintf("workload as uid %d, %s", uid, route), Observed: bypassWords(obs, refused), Held: refused})
		}
	}
	if obs, refused, err := withoutInterception(ctx, tgt, src, addr, host); err != nil {
		r.Checks = append(r.Checks, results.SecurityCheck{Target: "interception removed, " + route, Observed: "could not remove interception: " + err.Error(), Held: false})
	} else {
		r.Checks = append(r.Checks, results.SecurityCheck{Target: "interception removed, " + route, Observed: bypassWords(obs, refused), Held: refused})
	}
	if from, where, ok := outsider(tgt, p); ok && len(p.ExcludedInboundPorts) > 0 {
		r.Checks = append(r.Checks, excludedPortChecks(ctx, tgt, from, where, dst, p.ExcludedInboundPorts)...)
	}
	judge(&r, p.RefusesPlaintext, "bypass blocked")
	return r
}

func bypassWords(obs string, refused bool) string {
	if refused {
		return "blocked at the destination: " + obs
	}
	return "not blocked, the application answered the unproxied call: " + obs
}

// withoutInterception inserts bypassRules in pod, makes one plain call, and deletes
// them again whatever happened.
func withoutInterception(ctx context.Context, tgt Target, pod topology.Pod, addr, host string) (string, bool, error) {
	var inserted [][]string
	defer func() {
		for _, rule := range inserted {
			del := append([]string{"iptables", "-w", rule[0], rule[1], "-D"}, rule[2:]...)
			tgt.Sub.Exec(context.WithoutCancel(ctx), pod, nil, del...)
		}
	}()
	for _, rule := range bypassRules {
		ins := append([]string{"iptables", "-w", rule[0], rule[1], "-I"}, append([]string{rule[2], "1"}, rule[3:]...)...)
		if out, err := tgt.Sub.Exec(ctx, pod, nil, ins...); err != nil {
			return "", false, fmt.Errorf("%s: %v: %s", strings.Join(ins, " "), err, strings.TrimSpace(string(out)))
		}
		inserted = append(inserted, rule)
	}
	res, err := meshprobe.ProbeHTTPWith(ctx, func(ctx context.Context, network, a string) (net.Conn, error) {
		return tgt.Sub.DialContext(ctx, pod, network, a)
	}, meshprobe.ProbeRequest{Addr: addr, Host: host, Path: "/"})
	obs, refused := meshprobe.Refusal(res, err)
	return obs, refused, nil
}
