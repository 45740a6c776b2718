package report

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/results"
)

// synthMesh describes how a synthetic mesh behaves: its latency distribution
// (log-normal, median and shape), the extra delay a step's utilisation adds, and the
// rate beyond which it drops requests.
type synthMesh struct {
	label, profile string
	options        map[string]string
	medianUs       float64
	sigma          float64
	capacityRPS    float64
	proxies        bool
}

var synthMeshes = []synthMesh{
	{label: "baseline", profile: "none", medianUs: 450, sigma: 0.35, capacityRPS: 5000},
	{label: "sidecar", profile: "envoy-sidecar", options: map[string]string{"mtls": "off", "concurrency": "2", "telemetry": "on"},
		medianUs: 900, sigma: 0.4, capacityRPS: 1500, proxies: true},
	{label: "sidecar-mtls", profile: "envoy-sidecar", options: map[string]string{"mtls": "strict", "concurrency": "2", "telemetry": "on"},
		medianUs: 1100, sigma: 0.45, capacityRPS: 1250, proxies: true},
}

// syntheticRun builds a realistic run in memory: three meshes, three interleaved
// repeats, a fixed-rate experiment and a 7-step sweep, latencies drawn from
// log-normal distributions that queue up as the rate nears each mesh's capacity,
// per-second interval histograms, resource and network samples and equivalence checks.
func syntheticRun(t testing.TB) *results.Run {
	t.Helper()
	return syntheticRunOf(t, synthMeshes, true)
}

// syntheticRunOf builds a synthetic run of the given meshes: the fixed-rate point,
// and the sweep when sweep is set.
func syntheticRunOf(t testing.TB, synthMeshes []synthMesh, sweep bool) *results.Run {
	t.Helper()
	rng := rand.New(rand.NewPCG(7, 11))
	start := time.Date(2026, 11, 22, 3, 0, 0, 0, time.UTC)
	run := &results.Run{ID: "20261122-030000-5f3a9c", Study: "bookinfo sidecar overhead", StudyPath: "studies/demo.yaml",
		StudyFile: []byte("name: bookinfo sidecar overhead\nworkload: bookinfo\nmeshes: [none, envoy-sidecar]\n"),
		Status:    results.StatusComplete, Started: start, Seed: 42, Substrate: "local",
		Provenance: results.Provenance{Hostname: "bench-1", Kernel: "6.1.0-28-amd64", OS: "Debian GNU/Linux 12 (bookworm)",
			CPUModel: "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz", Cores: 2, MemoryBytes: 8 << 30, MeshmarkVersion: "v0.1.0-test",
			GoVersion: "go1.26.8", Components: map[string]string{"envoy": "1.40.0", "envoy-sidecar": "meshmark envoy-sidecar profile v1"},
			Placement: map[string]string{"load-generator": "cpu 0", "proxies": "cpu 1", "node n1": "cpus 0-1"},
			Configs: []results.GeneratedConfig{
				results.NewGeneratedConfig("envoy-productpage.yaml", "sidecar", "envoy", []byte("static_resources: {}\n")),
				results.NewGeneratedConfig("iptables-productpage.rules", "sidecar", "iptables", []byte("-A MESHMARK_OUTPUT -p tcp -j REDIRECT --to-ports 15001\n")),
			}},
	}
	for _, m := range synthMeshes {
		e := mesh.Enrollment{Mesh: m.label, MTLS: mesh.MTLSMode(m.options["mtls"]), Pass: true, CheckedAt: start}
		for _, pod := range []string{"client", "productpage-0", "details-0", "reviews-0", "ratings-0"} {
			svc := ""
			if pod != "client" {
				svc = pod[:len(pod)-2]
			}
			pe := mesh.PodEnrollment{Pod: pod, Service: svc, Meshed: m.proxies, Sidecar: m.proxies, Answered: true, MTLSObserved: "none"}
			if svc != "" {
				pe.InboundRequests = 10
				if m.options["mtls"] == "strict" {
					pe.InboundMTLS, pe.MTLSObserved = 10, "mtls"
				} else {
					pe.InboundPlaintext, pe.MTLSObserved = 10, "plaintext"
				}
			}
			e.Pods = append(e.Pods, pe)
		}
		if m.options["mtls"] == "strict" {
			refused := true
			e.PlaintextRefused = &refused
		}
		raw, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		run.Meshes = append(run.Meshes, results.Mesh{Label: m.label, Profile: m.profile, Options: m.options, Enrollment: raw})
	}

	type exp struct {
		name, kind string
		rates      []float64
	}
	exps := []exp{{"fixed", results.KindFixedRate, []float64{600}}, {"sweep", results.KindSteps, []float64{200, 400, 600, 800, 1000, 1200, 1400}}}
	if !sweep {
		exps = exps[:1]
	}
	const trialSeconds = 4
	now := start
	for rep := 0; rep < 3; rep++ {
		for _, e := range exps {
			for step, rate := range e.rates {
				for _, m := range synthMeshes {
					now = now.Add(2 * time.Second) // bring-up and warm-up, trimmed
					run.Trials = append(run.Trials, synthTrial(rng, m, rep, e.name, e.kind, step, rate, now, trialSeconds))
					now = now.Add(trialSeconds * time.Second)
				}
			}
		}
	}
	// One security experiment per mesh, with a failure to show.
	secOutcomes := map[string][]results.SecurityOutcome{
		"baseline":     {"n/a", "n/a", "n/a", "n/a", "n/a"},
		"sidecar":      {"expected", "expected", "n/a", "expected", "n/a"},
		"sidecar-mtls": {"pass", "pass", "pass", "fail", "pass"},
	}
	for _, m := range synthMeshes {
		if secOutcomes[m.label] == nil {
			continue
		}
		var probes []results.SecurityProbe
		for i, p := range results.SecurityProbes {
			o := secOutcomes[m.label][i]
			held := o == results.SecurityPass
			probes = append(probes, results.SecurityProbe{Probe: p, Outcome: o, Promised: "synthetic promise", Summary: p + " " + string(o),
				Checks: []results.SecurityCheck{{Target: "productpage-0 -> reviews-0", Observed: "synthetic observation", Held: held}}})
		}
		now = now.Add(2 * time.Second)
		run.Trials = append(run.Trials, results.Trial{Mesh: m.label, Experiment: "security", Kind: results.KindSecurity,
			Start: now, End: now.Add(time.Second), Result: results.TrialResult{Security: probes}})
	}
	run.Ended = now.Add(time.Second)
	return run
}

func synthTrial(rng *rand.Rand, m synthMesh, rep int, exp, kind string, step int, rate float64, start time.Time, seconds int) results.Trial {
	tr := results.Trial{Repeat: rep, Mesh: m.label, Experiment: exp, Kind: kind, Start: start, End: start.Add(time.Duration(seconds) * time.Second),
		WarmupTrimmed: 2 * time.Second,
		Params: results.TrialParams{RequestedRate: rate, Connections: 16, Step: step, KeepAlive: true, Path: "internal",
			Extra: map[string]string{"url": "http://198.18.0.10:9080/productpage", "method": "GET", "protocol": "http"}}}
	util := rate / m.capacityRPS
	// Queueing: the median grows like 1/(1-ρ); past capacity requests wait ever longer.
	factor := 1 / math.Max(1-util, 0.08)
	served := math.Min(rate, m.capacityRPS*1.02)
	drift := 1 + 0.03*rng.NormFloat64() // run-to-run drift between repeats
	res := &tr.Result
	res.Latency, res.ServiceTime = results.NewLatencyHistogram(), results.NewLatencyHistogram()
	res.Generator.SendLag = results.NewLatencyHistogram()
	res.StatusCodes = map[int]int64{}
	for s := 0; s < seconds; s++ {
		iv := results.Interval{Start: start.Add(time.Duration(s) * time.Second), Duration: time.Second, RequestedRate: rate,
			Histogram: results.NewLatencyHistogram()}
		n := int(served)
		var errs int64
		for i := 0; i < n; i++ {
			v := m.medianUs * factor * drift * math.Exp(m.sigma*rng.NormFloat64())
			if rng.Float64() < 0.002 { // rare stalls: GC, retransmits
				v *= 8 + 20*rng.Float64()
			}
			us := results.Micros(time.Duration(v * float64(time.Microsecond)))
			_ = iv.Histogram.RecordValue(us)
			_ = res.Latency.RecordValue(us)
			_ = res.ServiceTime.RecordValue(max(us*9/10, 1))
			_ = res.Generator.SendLag.RecordValue(int64(5 + rng.IntN(40)))
			if util > 1 && rng.Float64() < 0.02 {
				errs++
			}
		}
		iv.Count, iv.Errors = int64(n), errs
		iv.AchievedRate = float64(int64(n) - errs)
		iv.P50, iv.P99 = iv.Histogram.ValueAtQuantile(50), iv.Histogram.ValueAtQuantile(99)
		res.Requests += int64(n)
		res.Errors += errs
		res.Intervals = append(res.Intervals, iv)
	}
	res.StatusCodes[200] = res.Requests - res.Errors
	if res.Errors > 0 {
		res.StatusCodes[503] = res.Errors
		res.ErrorsByKind = map[string]int64{"http-503": res.Errors}
	}
	res.Generator.SendLagP99 = res.Generator.SendLag.ValueAtQuantile(99)
	res.Generator.PeakInFlight = int64(16)

	type comp struct {
		name, role, pod string
		coresPer1k      float64
		rssMiB          float64
	}
	comps := []comp{{"productpage", "workload", "productpage-0", 0.12, 38}, {"reviews", "workload", "reviews-0", 0.08, 52},
		{"loadgen", "load-generator", "client", 0.05, 20}}
	if m.proxies {
		comps = append(comps, comp{"envoy", "sidecar", "productpage-0", 0.20, 61}, comp{"envoy", "sidecar", "reviews-0", 0.18, 58},
			comp{"meshmark-xds", "control-plane", "control-plane", 0.01, 35})
	}
	for _, c := range comps {
		var cpu float64
		for s := 0; s <= seconds; s++ {
			if s > 0 {
				cpu += c.coresPer1k * served / 1000 * (0.8 + 0.4*rng.Float64())
			}
			res.Resources = append(res.Resources, results.ResourceSample{Component: c.name, Role: c.role, Pod: c.pod, Node: "n1", Mesh: m.label,
				T: start.Add(time.Duration(s) * time.Second), CPUUserSeconds: cpu * 0.7, CPUSysSeconds: cpu * 0.3,
				RSSBytes: int64((c.rssMiB + 4*rng.Float64()) * (1 << 20)), Threads: 4})
		}
	}
	// Network: each request moves a fixed number of bytes over each pod's eth0, so
	// rates are exactly served × bytes per request. Sidecars add mTLS framing on eth0
	// and the proxy↔app hop on lo; without a proxy lo stays idle (and is left out).
	type link struct {
		pod, iface string
		rx, tx     float64 // bytes per request served
	}
	links := []link{{"client", "eth0", 5000, 300}, {"productpage-0", "eth0", 300 + 900, 5000 + 1200}, {"reviews-0", "eth0", 250, 800},
		{"productpage-0", "lo", 0, 0}}
	if m.proxies {
		links[1].rx, links[1].tx = links[1].rx+200, links[1].tx+300
		links[3] = link{"productpage-0", "lo", 5200, 5200}
		links = append(links, link{"reviews-0", "lo", 800, 800})
	}
	pkts := func(bytes float64) int64 { // packets per request: 4 when the link carries anything
		if bytes > 0 {
			return 4
		}
		return 0
	}
	for _, l := range links {
		for s := 0; s <= seconds; s++ {
			n := int64(served) * int64(s)
			res.Network = append(res.Network, results.NetSample{Pod: l.pod, Node: "n1", Mesh: m.label, Interface: l.iface,
				T: start.Add(time.Duration(s) * time.Second), RxBytes: 1e6 + n*int64(l.rx), TxBytes: 2e6 + n*int64(l.tx),
				RxPackets: 100 + n*pkts(l.rx), TxPackets: 100 + n*pkts(l.tx)})
		}
	}
	return tr
}

func TestSyntheticRunRoundTripsThroughJSON(t *testing.T) {
	// The report must work on what the store gives back, which is the JSON/V2 form.
	run := syntheticRun(t)
	b, err := json.Marshal(run)
	if err != nil {
		t.Fatal(err)
	}
	var back results.Run
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	a, z := Summarize(run, nil, Options{}), Summarize(&back, nil, Options{})
	if fmt.Sprint(a.Groups[0].P99Ms) != fmt.Sprint(z.Groups[0].P99Ms) || len(a.Heatmaps) != len(z.Heatmaps) {
		t.Fatalf("summary differs after a JSON round trip: p99 %v vs %v", a.Groups[0].P99Ms, z.Groups[0].P99Ms)
	}
}
