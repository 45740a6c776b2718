// Package security owns the security experiment: it asks a mesh profile what it
// promises (mesh.Secured), then tries each promise against the running deployment —
// on the wire, with callers that have no identity, with an allow-list policy, with a
// workload that tries to get around its proxy, and by reading the certificates the
// proxies present — and turns what it saw into one verdict per probe, with every
// observation kept as evidence. Probes only ever send traffic between the
// deployment's own pods.
package security

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/topology"
)

// Target is the running deployment the probes examine.
type Target struct {
	Sub     substrate.Substrate
	App     *topology.App
	Profile mesh.Profile
	// Gateway names the service that is the app's front door (the ingress gateway),
	// which accepts callers from outside the mesh by design; empty when there is none.
	Gateway string
	// Traffic sends n requests into the app through its entry, the way the load
	// generator does, so that every edge of the graph carries calls while the wire is
	// captured.
	Traffic func(ctx context.Context, n int) error
	// Progress receives one line per probe; nil discards them.
	Progress func(string)
}

// Options says which probes to run and how much traffic the wire capture sees.
type Options struct {
	Probes   []string // results.SecurityProbes when empty
	Requests int
}

// Run runs the probes against the target, in results.SecurityProbes order, and
// returns one result per probe. A probe that cannot run on this deployment is not
// applicable, with why; an error is returned only when the context ends.
func Run(ctx context.Context, tgt Target, opts Options) ([]results.SecurityProbe, error) {
	probes := opts.Probes
	if len(probes) == 0 {
		probes = results.SecurityProbes
	}
	var posture *mesh.Posture
	if s, ok := tgt.Profile.(mesh.Secured); ok {
		p := s.SecurityPosture(tgt.App)
		posture = &p
	}
	var out []results.SecurityProbe
	for _, name := range results.SecurityProbes {
		if !slices.Contains(probes, name) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return out, err
		}
		start := time.Now()
		var r results.SecurityProbe
		if posture == nil {
			r = notApplicable(name, fmt.Sprintf("profile %s makes no security promises", tgt.Profile.Name()))
		} else {
			r = run(ctx, name, tgt, *posture, opts)
		}
		if err := ctx.Err(); err != nil {
			return out, err
		}
		r.Probe = name
		if tgt.Progress != nil {
			tgt.Progress(fmt.Sprintf("security %-17s %-8s %s (%s)", name, r.Outcome, r.Summary, time.Since(start).Round(time.Millisecond)))
		}
		out = append(out, r)
	}
	return out, nil
}

func run(ctx context.Context, name string, tgt Target, p mesh.Posture, opts Options) results.SecurityProbe {
	switch name {
	case results.ProbeEncryption:
		return probeEncryption(ctx, tgt, p, opts.Requests)
	case results.ProbePlaintext:
		return probePlaintext(ctx, tgt, p)
	case results.ProbeAuthorization:
		return probeAuthorization(ctx, tgt, p)
	case results.ProbeBypass:
		return probeBypass(ctx, tgt, p)
	case results.ProbeIdentity:
		return probeIdentity(ctx, tgt, p)
	}
	return notApplicable(name, "unknown probe")
}

func notApplicable(name, why string) results.SecurityProbe {
	return results.SecurityProbe{Probe: name, Outcome: results.SecurityNotApplicable, Summary: why}
}

// judge turns observations into a verdict: a promised property must hold on every
// check (pass, else fail); an unpromised one that indeed does not hold anywhere is
// expected, and one that holds everywhere anyway passes. An unpromised property that
// holds on some checks and not others is expected too, but the summary says so.
// Documented checks (paths the mesh leaves open by design) are evidence, not judged.
func judge(r *results.SecurityProbe, promised bool, what string) {
	held, n := 0, 0
	var documented []string
	for _, c := range r.Checks {
		if c.Documented {
			if !c.Held {
				documented = append(documented, c.Target)
			}
			continue
		}
		n++
		if c.Held {
			held++
		}
	}
	defer func() {
		if len(documented) > 0 {
			r.Summary += fmt.Sprintf("; reachable outside the proxy by the mesh's design: %s", strings.Join(documented, ", "))
		}
	}()
	switch {
	case n == 0:
		r.Outcome = results.SecurityNotApplicable
		if r.Summary == "" {
			r.Summary = "nothing to check"
		}
		return
	case promised && held == n:
		r.Outcome = results.SecurityPass
	case promised:
		r.Outcome = results.SecurityFail
	case held == n:
		r.Outcome = results.SecurityPass
	default:
		r.Outcome = results.SecurityExpected
	}
	r.Summary = fmt.Sprintf("%s on %d of %d checks", what, held, n)
	if !promised && held > 0 && held < n {
		r.Summary += " (not promised; it held only in part)"
	}
	if r.Outcome == results.SecurityFail {
		var broke []string
		for _, c := range r.Checks {
			if !c.Held && !c.Documented && len(broke) < 3 {
				broke = append(broke, c.Target+": "+c.Observed)
			}
		}
		r.Summary += "; broken: " + strings.Join(broke, "; ")
	}
}

// meshedSet indexes the posture's meshed pods by name.
func meshedSet(p mesh.Posture) map[string]bool {
	m := make(map[string]bool, len(p.Meshed))
	for _, pod := range p.Meshed {
		m[pod.Name] = true
	}
	return m
}

// nodePodder is implemented by substrates that can run probes from a node's own
// namespace (the local testbed).
type nodePodder interface {
	NodePod(node string) (topology.Pod, error)
}

// outsider is a vantage point without a mesh identity: an unmeshed client pod, else
// the namespace of a node.
func outsider(tgt Target, p mesh.Posture) (topology.Pod, string, bool) {
	meshed := meshedSet(p)
	for _, c := range tgt.App.Clients {
		if !meshed[c.Name] {
			return c, "unmeshed client " + c.Name, true
		}
	}
	if np, ok := tgt.Sub.(nodePodder); ok {
		for _, pod := range tgt.App.Pods() {
			if pod.Node == "" {
				continue
			}
			if n, err := np.NodePod(pod.Node); err == nil {
				return n, "node " + pod.Node + " namespace", true
			}
		}
	}
	return topology.Pod{}, "", false
}

// meshedServices are the app's services whose pods are all meshed, the gateway
// excepted (it faces the outside by design).
func meshedServices(tgt Target, p mesh.Posture) []topology.Service {
	meshed := meshedSet(p)
	var out []topology.Service
	for _, s := range tgt.App.Services {
		if s.Name == tgt.Gateway {
			continue
		}
		all := true
		n := 0
		for _, v := range s.Versions {
			for _, pod := range v.Endpoints {
				n++
				all = all && meshed[pod.Name]
			}
		}
		if all && n > 0 {
			out = append(out, s)
		}
	}
	return out
}

// servicePods lists a service's pods.
func servicePods(s topology.Service) []topology.Pod {
	var out []topology.Pod
	for _, v := range s.Versions {
		out = append(out, v.Endpoints...)
	}
	return out
}
