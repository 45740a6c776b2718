package security

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"strings"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/security/wire"
	"github.com/meshmark/meshmark/internal/substrate"
)

// probeEncryption captures every frame on the substrate's bridges while requests
// cross the app, then judges each TCP flow between two parts of the mesh (meshed
// pods, and the nodes, where node proxies live): under mTLS not one payload byte may
// travel outside TLS. Flows with a pod outside the mesh (the load generator) are
// left out: that traffic is not the mesh's to protect.
func probeEncryption(ctx context.Context, tgt Target, p mesh.Posture, requests int) results.SecurityProbe {
	r := results.SecurityProbe{Probe: results.ProbeEncryption, Promised: promise(p.Encrypts, "mTLS on every flow between meshed pods", "plaintext between meshed pods")}
	wt, ok := tgt.Sub.(substrate.WireTapper)
	if !ok {
		return notApplicable(r.Probe, "the substrate cannot capture its traffic")
	}
	if tgt.Traffic == nil {
		return notApplicable(r.Probe, "no traffic to capture")
	}
	inMesh := map[netip.Addr]string{}
	for _, pod := range p.Meshed {
		inMesh[pod.IP] = pod.Name
	}
	if np, ok := tgt.Sub.(nodePodder); ok {
		for _, pod := range tgt.App.Pods() {
			if n, err := np.NodePod(pod.Node); err == nil {
				inMesh[n.IP] = "node " + n.Name
			}
		}
	}
	capture, err := wire.Start(ctx, wt.WireTaps())
	if err != nil {
		return notApplicable(r.Probe, "capture: "+err.Error())
	}
	// Requests that fail still put their first bytes on the wire, which is what is
	// judged: a caller whose plaintext is refused has leaked it all the same.
	terr := tgt.Traffic(ctx, requests)
	rep, cerr := capture.Stop()
	if cerr != nil {
		return notApplicable(r.Probe, "capture: "+cerr.Error())
	}
	type pair struct{ from, to string }
	type tally struct {
		flows, encrypted int
		classes          map[string]int
		sample           string
	}
	byPair := map[pair]*tally{}
	var outside, empty int
	for _, f := range rep.Flows {
		from, okc := inMesh[f.Client.Addr()]
		to, oks := inMesh[f.Server.Addr()]
		if !okc || !oks {
			outside++
			continue
		}
		if f.Class == wire.ClassNoPayload {
			empty++
			continue
		}
		k := pair{from, fmt.Sprintf("%s:%d", to, f.Server.Port())}
		t := byPair[k]
		if t == nil {
			t = &tally{classes: map[string]int{}}
			byPair[k] = t
		}
		t.flows++
		desc := string(f.Class)
		if f.TLSVersion != "" {
			desc += " " + f.TLSVersion
		}
		if len(f.ALPN) > 0 {
			desc += " alpn " + strings.Join(f.ALPN, ",")
		}
		if f.Midstream {
			desc += " (opened before the capture)"
		}
		t.classes[desc]++
		if f.Class.Encrypted() && f.PlaintextBytes == 0 {
			t.encrypted++
		} else if t.sample == "" {
			t.sample = f.String()
		}
	}
	pairs := make([]pair, 0, len(byPair))
	for k := range byPair {
		pairs = append(pairs, k)
	}
	sort.Slice(pairs, func(i, j int) bool {
		if pairs[i].from != pairs[j].from {
			return pairs[i].from < pairs[j].from
		}
		return pairs[i].to < pairs[j].to
	})
	for _, k := range pairs {
		t := byPair[k]
		var cs []string
		for c, n := range t.classes {
			cs = append(cs, fmt.Sprintf("%d %s", n, c))
		}
		sort.Strings(cs)
		obs := fmt.Sprintf("%d flows: %s", t.flows, strings.Join(cs, ", "))
		if t.sample != "" {
			obs += "; e.g. " + t.sample
		}
		r.Checks = append(r.Checks, results.SecurityCheck{Target: k.from + " -> " + k.to, Observed: obs, Held: t.encrypted == t.flows})
	}
	if len(r.Checks) == 0 {
		r.Summary = fmt.Sprintf("no flow between two parts of the mesh in %d captured packets (%d flows with pods outside it)", rep.Packets, outside)
		if terr != nil {
			r.Summary += "; the app's traffic failed: " + terr.Error()
		}
	}
	judge(&r, p.Encrypts, "encrypted")
	if len(r.Checks) > 0 {
		r.Summary += fmt.Sprintf(" (pod pairs; %d packets captured, %d flows with pods outside the mesh not judged", rep.Packets, outside)
		if rep.KernelDrops > 0 {
			r.Summary += fmt.Sprintf(", %d packets dropped by the kernel", rep.KernelDrops)
		}
		if terr != nil {
			r.Summary += "; the app's requests failed: " + terr.Error()
		}
		r.Summary += ")"
	}
	return r
}
