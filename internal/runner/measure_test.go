package runner

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/load"
	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/sampler"
)

func TestSteadyRoundsTrimWarmup(t *testing.T) {
	t0 := time.Unix(100, 0)
	var rounds []sampler.Round
	for i := 0; i <= 10; i++ {
		rounds = append(rounds, sampler.Round{Time: t0.Add(time.Duration(i) * time.Second)})
	}
	// Measured window 2.5 s .. 7.5 s: keep the rounds at 2 s through 8 s.
	got := steadyRounds(rounds, t0.Add(2500*time.Millisecond), t0.Add(7500*time.Millisecond))
	if len(got) != 7 || !got[0].Time.Equal(t0.Add(2*time.Second)) || !got[6].Time.Equal(t0.Add(8*time.Second)) {
		t.Fatalf("kept %d rounds from %v to %v, want 7 from 2s to 8s", len(got), got[0].Time.Sub(t0), got[len(got)-1].Time.Sub(t0))
	}
	// A window past the last round keeps from its start to the end of the samples.
	if got := steadyRounds(rounds, t0.Add(9500*time.Millisecond), t0.Add(20*time.Second)); len(got) != 2 {
		t.Errorf("kept %d rounds for a window past the samples, want 2", len(got))
	}
}

// The bypass check judges each kind of proxy in its own unit: a waypoint that counted
// no request for the entry service (callers from outside the mesh do not pass it) is
// no bypass when the ztunnels counted connections into it; with neither, it is.
func TestBypassedByUnit(t *testing.T) {
	res := &load.Result{Completed: 600}
	delta := func(unit string, n uint64) mesh.ProxyDelta {
		return mesh.ProxyDelta{Unit: unit, Inbound: map[string]uint64{"productpage": n}}
	}
	for _, tc := range []struct {
		name   string
		deltas []mesh.ProxyDelta
		bypass bool
	}{
		{"sidecars counted every request", []mesh.ProxyDelta{delta(meshkube.UnitRequests, 620)}, false},
		{"sidecars short of the answered", []mesh.ProxyDelta{delta(meshkube.UnitRequests, 100)}, true},
		{"ztunnels counted connections", []mesh.ProxyDelta{delta(meshkube.UnitConnections, 8)}, false},
		{"ztunnels counted none", []mesh.ProxyDelta{delta(meshkube.UnitConnections, 0)}, true},
		{"waypoint none, ztunnels some", []mesh.ProxyDelta{delta(meshkube.UnitRequests, 0), delta(meshkube.UnitConnections, 8), delta(meshkube.UnitConnections, 0)}, false},
		{"waypoint none, ztunnels none", []mesh.ProxyDelta{delta(meshkube.UnitRequests, 0), delta(meshkube.UnitConnections, 0)}, true},
		// An ingress that keeps its connections to the entry opens none in the trial;
		// ztunnel's bytes, counted as they flow, still show every request crossing it.
		{"ztunnels no new connection, the trial's bytes", []mesh.ProxyDelta{withBytes(delta(meshkube.UnitConnections, 0), 412_000)}, false},
		{"ztunnels no new connection, too few bytes", []mesh.ProxyDelta{withBytes(delta(meshkube.UnitConnections, 0), 599)}, true},
		{"ztunnels no new connection, no bytes", []mesh.ProxyDelta{withBytes(delta(meshkube.UnitConnections, 0), 0)}, true},
	} {
		if got := bypassed("productpage", tc.deltas, res); (got != "") != tc.bypass {
			t.Errorf("%s: %q, want bypass %v", tc.name, got, tc.bypass)
		}
	}
}

func withBytes(d mesh.ProxyDelta, n uint64) mesh.ProxyDelta {
	d.InboundBytes = map[string]uint64{"productpage": n}
	return d
}

// A proxy that could not be read is stored with the failure and flags the trial, with
// a warning naming it and why, and the run goes on; a proxy read behind it still counts
// toward the bypass check. (On a real cluster every proxy of a healthy mesh is read:
// cli's TestStudyOnRealNodes holds the trials to that.)
func TestProxyEvidenceFlagsAnUnreadableProxy(t *testing.T) {
	var out bytes.Buffer
	r := &runner{progress: newProgress(&out, false, 0)}
	trial := &results.Trial{Mesh: "istio"}
	why := "GET /api/v1/namespaces/mm-1/pods/meshmark-loadgen-0:15090/proxy/stats/prometheus: 503"
	r.proxyEvidence(trial, []mesh.ProxyDelta{
		{Component: "envoy", Pod: "productpage-v1-0", Unit: meshkube.UnitRequests, Inbound: map[string]uint64{"productpage": 640}},
		{Component: "envoy", Pod: "meshmark-loadgen-0", Err: why},
	}, "productpage", &load.Result{Completed: 600}, "latency 200 req/s")

	if !trial.Result.HasFlag(results.FlagProxyUnreadable) || trial.Result.HasFlag(results.FlagProxyBypassed) {
		t.Errorf("flags %v; want proxy-unreadable and not proxy-bypassed", trial.Result.Flags)
	}
	if len(trial.Result.ProxyStats) != 2 {
		t.Fatalf("stored %d proxies' counters, want both, the unreadable one too", len(trial.Result.ProxyStats))
	}
	var d mesh.ProxyDelta
	if err := json.Unmarshal(trial.Result.ProxyStats[1].Stats, &d); err != nil || d.Err != why || trial.Result.ProxyStats[1].Mesh != "istio" {
		t.Errorf("the unreadable proxy stored %+v (%v); want its failure", d, err)
	}
	if want := "warning: envoy in meshmark-loadgen-0 could not be read (" + why + ") in latency 200 req/s on istio; this trial is flagged"; !strings.Contains(out.String(), want) {
		t.Errorf("progress %q; want %q", out.String(), want)
	}
}
