// Package published holds the five published service-mesh evaluations meshmark
// reproduces (S1–S5, described in the project's design notes, STUDIES.md): what each
// compared and the figures it published, encoded as claims a run can be checked
// against. Which meshmark profile stands for which published mesh, and how faithfully,
// each profile says of itself when it registers (a Stand); Assign matches the two. It
// is data only and imports nothing of meshmark, so that the mesh registry, the study
// file's parser and the reproduce package can all use it.
package published

import (
	"fmt"
	"slices"
	"strings"
)

// Study is one published evaluation.
type Study struct {
	// ID is how a study file names it in spec.reproduces: "S1" to "S5".
	ID string
	// Title and Source cite it as the design notes do (no more is known here).
	Title  string
	Source string
	// Roles are the meshes it compared, in its own order.
	Roles []Role
	// Claims are its published figures, as comparisons that survive a change of
	// hardware: orderings and ratios.
	Claims []Claim
}

// Citation is the study cited in one line: "S4, Performance and security of Istio,
// Linkerd, Traefik Mesh on Rancher (NTNU thesis, 2021)".
func (s *Study) Citation() string {
	return fmt.Sprintf("%s, %s (%s)", s.ID, s.Title, s.Source)
}

// Role returns the role of the given name, or nil.
func (s *Study) Role(name string) *Role {
	for i := range s.Roles {
		if s.Roles[i].Name == name {
			return &s.Roles[i]
		}
	}
	return nil
}

// Role is one mesh of a study, or its no-mesh baseline.
type Role struct {
	// Name is how claims refer to it, and the published mesh a profile's Stand names:
	// "baseline", "istio", "linkerd", ...
	Name string
	// Title is the study's own name for it: "Istio (sidecar)".
	Title string
	// Baseline says the role is the study's no-mesh configuration: the run's baseline
	// stands for it, whatever its profile.
	Baseline bool
	// MTLS is the study's own condition on the mesh's mtls option, as Stand.MTLS: S1
	// tells its two Envoy sidecars apart by it.
	MTLS string
}

// Stand is a meshmark profile's claim to stand for a published mesh; each profile
// registers its own.
type Stand struct {
	// For is the published mesh, as the studies' roles name it: "istio", "cilium".
	For string
	// MTLS restricts the stand to meshes whose mtls option is off ("off") or anything
	// else ("on"); "" accepts any.
	MTLS string
	// Unlike, when set, says how this stand differs from the study's mesh so much that
	// no claim involving it can be tested: the claim is marked not comparable with this
	// reason (the run's figures are still shown beside the published ones). A stand
	// without it is preferred.
	Unlike string
}

// Takes reports whether a mesh with these options, by this stand, can take role r.
func (s Stand) Takes(r *Role, options map[string]string) bool {
	return s.For == r.Name && mtlsAccepts(s.MTLS, options) && mtlsAccepts(r.MTLS, options)
}

func mtlsAccepts(condition string, options map[string]string) bool {
	switch condition {
	case "off":
		return MTLSOff(options["mtls"])
	case "on":
		return !MTLSOff(options["mtls"])
	}
	return true
}

// MTLSOff reports whether an mtls option value turns mTLS off, as the mesh profiles
// read it ("off", "disabled", "disable", "false", "none").
func MTLSOff(v string) bool {
	return slices.Contains([]string{"off", "disabled", "disable", "false", "none", "no"}, strings.ToLower(v))
}

// Kind is how a claim is tested.
type Kind string

const (
	// Order: A is lower than B on the metric (faster, or less memory).
	Order Kind = "order"
	// Ratio: B's value over A's lies in the claim's band.
	Ratio Kind = "ratio"
)

// Metric is the quantity a claim is about.
type Metric string

const (
	P50        Metric = "p50"
	P95        Metric = "p95"
	P99        Metric = "p99"
	Mean       Metric = "mean"       // mean latency
	Throughput Metric = "throughput" // requests served per second
	// MeshMemory is the memory (mean RSS) of the mesh's own components summed: its
	// proxies, gateways and control plane.
	MeshMemory Metric = "mesh memory"
)

// Point says where in a run a claim is tested: the experiments of a kind, narrowed
// by its fields. Every matching load point is tested on its own (S5's three
// connection counts are three tests of each claim).
type Point struct {
	Kind string // an experiment kind: capacity, fixed-rate, steps, soak, users, connections
	// RPS selects a fixed-rate point at this requested rate (0: any).
	RPS float64
	// Path selects experiments on this path ("internal" or "ingress"; "" either).
	Path string
	// NoKeepAlive selects experiments that open a connection per request.
	NoKeepAlive bool
	// MiddleStep selects the middle step of a steps sweep: S4 quoted 1000 rps of
	// 100–2000, which a scaled sweep does not reach; its middle is the same place in
	// the sweep.
	MiddleStep bool
	// Published is where the study measured it, in its own terms.
	Published string
}

// Band is how far from a published ratio a run's ratio may lie and still agree:
// hardware moves ratios, and one study's figure is not an interval.
type Band struct {
	// Points widens a published range by this many percentage points each side.
	Points float64
	// Factor widens a published figure by this factor each side (≥ 1).
	Factor float64
	// Why says where the width comes from.
	Why string
}

// Claim is one published figure, as a comparison between two of the study's roles.
type Claim struct {
	// ID is stable, for tests and for the reader: "S4/p95/linkerd<istio".
	ID     string
	Kind   Kind
	Metric Metric
	At     Point
	// BPath, when set, tests B on this path instead of At's, with the same load (S3:
	// Istio through its gateway against Istio without it).
	BPath string
	// A and B are role names. Order: A is lower than B. Ratio: B over A.
	A, B string
	// Lo and Hi bound the published ratio B/A; a single figure has Lo == Hi.
	Lo, Hi float64
	Band   Band
	// Figure is the published figure in the study's own words and numbers.
	Figure string
	// Unlike, when set, says why no run of meshmark can test the claim (what the study
	// measured that meshmark does not): it is marked not comparable.
	Unlike string
}

// Range is the band a run's ratio must lie in to agree.
func (c Claim) Range() (lo, hi float64) {
	lo, hi = c.Lo, c.Hi
	if c.Band.Points > 0 {
		lo, hi = lo-c.Band.Points/100, hi+c.Band.Points/100
	}
	if c.Band.Factor > 1 {
		lo, hi = lo/c.Band.Factor, hi*c.Band.Factor
	}
	return lo, hi
}

// PointFactor is the band around a published ratio that is a single figure from one
// run on other hardware, with no spread published: a run here agrees when its ratio
// lies within a factor of 1.25 of it either way. It is a choice, stated in every
// claim it applies to, not a figure of the studies.
const PointFactor = 1.25

var pointBand = Band{Factor: PointFactor, Why: "one run's figure on other hardware, taken within a factor of 1.25 either way"}

// Studies lists S1 to S5.
func Studies() []*Study { return []*Study{s1(), s2(), s3(), s4(), s5()} }

// IDs lists the studies' ids, in order.
func IDs() []string {
	var out []string
	for _, s := range Studies() {
		out = append(out, s.ID)
	}
	return out
}

// Lookup returns the study with the given id (case-insensitive), or nil.
func Lookup(id string) *Study {
	for _, s := range Studies() {
		if strings.EqualFold(s.ID, strings.TrimSpace(id)) {
			return s
		}
	}
	return nil
}

// Roles common to several studies.
var (
	baselineRole = Role{Name: "baseline", Title: "no mesh", Baseline: true}
	istioRole    = Role{Name: "istio", Title: "Istio"}
	linkerdRole  = Role{Name: "linkerd", Title: "Linkerd"}
)

func s1() *Study {
	capacity := Point{Kind: "capacity", Published: "capacity scenario: max rate (qps 0), 220 connections"}
	return &Study{
		ID: "S1", Title: "Istio vs AWS App Mesh for a production platform", Source: "KTH-style thesis, 2022",
		Roles: []Role{
			{Name: "istio", Title: "Istio", MTLS: "on"},
			{Name: "appmesh", Title: "AWS App Mesh", MTLS: "off"},
		},
		Claims: []Claim{
			{ID: "S1/capacity/appmesh~istio", Kind: Ratio, Metric: Throughput, At: capacity, A: "istio", B: "appmesh", Lo: 925.0 / 1000, Hi: 1005.0 / 1000,
				Figure: "capacity: Istio ~1000 qps, App Mesh ~925–1005 qps"},
			{ID: "S1/p50-at-max/istio<appmesh", Kind: Order, Metric: P50, At: capacity, A: "istio", B: "appmesh",
				Figure: "p50 at max load: Istio 118 ms, App Mesh 243 ms"},
			{ID: "S1/p99-at-max/appmesh<istio", Kind: Order, Metric: P99, At: capacity, A: "appmesh", B: "istio",
				Figure: "p99 at max load: App Mesh ~422 ms, Istio ~1458 ms"},
			{ID: "S1/p99-at-max/istio÷appmesh", Kind: Ratio, Metric: P99, At: capacity, A: "appmesh", B: "istio", Lo: 1458.0 / 422, Hi: 1458.0 / 422, Band: pointBand,
				Figure: "p99 at max load: Istio ~1458 ms against App Mesh's ~422 ms"},
		},
	}
}

func s2() *Study {
	at2400 := Point{Kind: "fixed-rate", RPS: 40, Published: "2400 requests per minute"}
	return &Study{
		ID: "S2", Title: "Istio vs Linkerd on TeaStore", Source: "short workshop paper, 2023",
		Roles: []Role{baselineRole, istioRole, linkerdRole},
		Claims: []Claim{
			{ID: "S2/mean-2400/baseline<istio", Kind: Order, Metric: Mean, At: at2400, A: "baseline", B: "istio",
				Figure: "average latency at 2400 rpm: baseline 67 ms, Istio 482 ms"},
			// STUDIES.md quotes the ratio as 6.15×; the two latencies give 482/67 = 7.2,
			// so 6.15 reads as the increase. The ratio is taken from the latencies.
			{ID: "S2/mean-2400/istio÷baseline", Kind: Ratio, Metric: Mean, At: at2400, A: "baseline", B: "istio", Lo: 482.0 / 67, Hi: 482.0 / 67, Band: pointBand,
				Figure: "average latency at 2400 rpm: Istio 482 ms against the baseline's 67 ms (quoted as 6.15×)"},
			{ID: "S2/mean-2400/linkerd<istio", Kind: Order, Metric: Mean, At: at2400, A: "linkerd", B: "istio",
				Figure: "average latency at 2400 rpm: Linkerd lower than Istio"},
		},
	}
}

func s3() *Study {
	similar := Band{Why: "the study's own bound: throughput differed by at most 3%"}
	return &Study{
		ID: "S3", Title: "Monitoring Istio and its overhead", Source: "university project report, 2022",
		Roles: []Role{{Name: "baseline", Title: "Istio off", Baseline: true}, istioRole},
		Claims: []Claim{
			{ID: "S3/throughput/istio~off/ingress", Kind: Ratio, Metric: Throughput, At: Point{Kind: "users", Path: "ingress", Published: "Locust users through the ingress gateway"},
				A: "baseline", B: "istio", Lo: 0.97, Hi: 1.03, Band: similar, Figure: "throughput differed ≤ 3% between configurations"},
			{ID: "S3/throughput/istio~off/direct", Kind: Ratio, Metric: Throughput, At: Point{Kind: "users", Path: "internal", Published: "Locust users bypassing the gateway"},
				A: "baseline", B: "istio", Lo: 0.97, Hi: 1.03, Band: similar, Figure: "throughput differed ≤ 3% between configurations"},
			{ID: "S3/throughput/gateway~direct", Kind: Ratio, Metric: Throughput, At: Point{Kind: "users", Path: "internal", Published: "Istio bypassing its gateway against through it"},
				BPath: "ingress", A: "istio", B: "istio", Lo: 0.97, Hi: 1.03, Band: similar, Figure: "throughput differed ≤ 3% between configurations"},
		},
	}
}

func s4() *Study {
	middle := Point{Kind: "steps", MiddleStep: true, Published: "1000 rps, the middle of 100–2000 rps"}
	soak := Point{Kind: "soak", Published: "resource study: 800 rps for 20 min over 4 workers"}
	memUnlike := "their totals are of 4 workers, each with its own web, emoji, voting and Vegeta pods, and Istio's istiod; a ratio of totals scales with how many pods and nodes run, which differs here"
	return &Study{
		ID: "S4", Title: "Performance and security of Istio, Linkerd, Traefik Mesh on Rancher", Source: "NTNU thesis, 2021",
		Roles: []Role{istioRole, linkerdRole, {Name: "traefik", Title: "Traefik Mesh"}},
		Claims: []Claim{
			{ID: "S4/p95-middle/traefik<linkerd", Kind: Order, Metric: P95, At: middle, A: "traefik", B: "linkerd",
				Figure: "P95 at 1000 rps: Traefik ~0.63 ms, Linkerd ~0.87 ms"},
			{ID: "S4/p95-middle/linkerd<istio", Kind: Order, Metric: P95, At: middle, A: "linkerd", B: "istio",
				Figure: "P95 at 1000 rps: Linkerd ~0.87 ms, Istio ~1.32 ms"},
			{ID: "S4/p95-middle/linkerd÷traefik", Kind: Ratio, Metric: P95, At: middle, A: "traefik", B: "linkerd", Lo: 0.87 / 0.63, Hi: 0.87 / 0.63, Band: pointBand,
				Figure: "P95 at 1000 rps: Linkerd ~0.87 ms against Traefik's ~0.63 ms"},
			{ID: "S4/p95-middle/istio÷linkerd", Kind: Ratio, Metric: P95, At: middle, A: "linkerd", B: "istio", Lo: 1.32 / 0.87, Hi: 1.32 / 0.87, Band: pointBand,
				Figure: "P95 at 1000 rps: Istio ~1.32 ms against Linkerd's ~0.87 ms"},
			{ID: "S4/memory/traefik<linkerd", Kind: Order, Metric: MeshMemory, At: soak, A: "traefik", B: "linkerd",
				Figure: "RAM of the mesh: Traefik ~80 MiB, Linkerd ~107 MiB in total"},
			{ID: "S4/memory/linkerd<istio", Kind: Order, Metric: MeshMemory, At: soak, A: "linkerd", B: "istio",
				Figure: "RAM of the mesh: Linkerd ~107 MiB, Istio ~1084 MiB in total"},
			{ID: "S4/memory/istio÷linkerd", Kind: Ratio, Metric: MeshMemory, At: soak, A: "linkerd", B: "istio", Lo: 1084.0 / 107, Hi: 1084.0 / 107, Band: pointBand,
				Figure: "RAM of the mesh: Istio ~1084 MiB against Linkerd's ~107 MiB", Unlike: memUnlike},
		},
	}
}

func s5() *Study {
	internal := Point{Kind: "connections", Path: "internal", NoKeepAlive: true, Published: "internal: oha to the service IP, no keep-alive"}
	external := Point{Kind: "connections", Path: "ingress", NoKeepAlive: true, Published: "external: oha through the ingress, no keep-alive"}
	env := Band{Points: 5, Why: "widened by the 3–5% the study saw between environments without a mesh"}
	slower := func(id, role string, at Point, lo, hi float64, figure string) Claim {
		return Claim{ID: id, Kind: Ratio, Metric: Mean, At: at, A: "baseline", B: role, Lo: lo, Hi: hi, Band: env, Figure: figure}
	}
	order := func(id, a, b string, at Point, figure string) Claim {
		return Claim{ID: id, Kind: Order, Metric: Mean, At: at, A: a, B: b, Figure: figure}
	}
	return &Study{
		ID: "S5", Title: "Linkerd vs Istio vs Cilium", Source: "consultancy blog and public repo, 2024",
		Roles: []Role{baselineRole, linkerdRole, istioRole,
			{Name: "cilium", Title: "Cilium"}},
		Claims: []Claim{
			slower("S5/internal/linkerd÷baseline", "linkerd", internal, 1.05, 1.10, "Linkerd 5–10% slower than the baseline"),
			slower("S5/internal/istio÷baseline", "istio", internal, 1.25, 1.35, "Istio 25–35% slower than the baseline"),
			slower("S5/internal/cilium÷baseline", "cilium", internal, 1.20, 1.30, "Cilium 20–30% slower than the baseline (internal)"),
			order("S5/internal/linkerd<istio", "linkerd", "istio", internal, "Linkerd 5–10% slower than the baseline, Istio 25–35%"),
			order("S5/internal/linkerd<cilium", "linkerd", "cilium", internal, "Linkerd 5–10% slower than the baseline, Cilium 20–30% (internal)"),
			slower("S5/external/linkerd÷baseline", "linkerd", external, 1.05, 1.10, "Linkerd 5–10% slower than the baseline"),
			slower("S5/external/istio÷baseline", "istio", external, 1.25, 1.35, "Istio 25–35% slower than the baseline"),
			slower("S5/external/cilium÷baseline", "cilium", external, 1.30, 1.40, "Cilium 30–40% slower than the baseline (external)"),
			order("S5/external/linkerd<istio", "linkerd", "istio", external, "Linkerd 5–10% slower than the baseline, Istio 25–35%"),
			order("S5/external/linkerd<cilium", "linkerd", "cilium", external, "Linkerd 5–10% slower than the baseline, Cilium 30–40% (external)"),
		},
	}
}

// Mesh is a mesh of a study file or a run, as Assign sees it: its profile's stands
// (from the mesh registry) and its options.
type Mesh struct {
	Label   string
	Stands  []Stand
	Options map[string]string
}

// Assignment is the mesh that stands for one of a study's roles.
type Assignment struct {
	Role  string
	Title string
	// Mesh is the label of the mesh standing for the role; "" when none can.
	Mesh string
	// Unlike says how the stand differs from the study's mesh (see Stand.Unlike).
	Unlike string
}

// Assign gives each of the study's roles the first mesh, in the given order, that can
// stand for it, one whose stand is faithful (no Unlike) before one that is not, each
// mesh standing for one role at most; the baseline role goes to the baseline mesh.
// Meshes that take no role were not in the study.
func (s *Study) Assign(meshes []Mesh, baseline string) []Assignment {
	taken := map[string]bool{}
	var out []Assignment
	for i := range s.Roles {
		r := &s.Roles[i]
		a := Assignment{Role: r.Name, Title: r.Title}
		if r.Baseline {
			for _, m := range meshes {
				if m.Label == baseline {
					a.Mesh = m.Label
					taken[m.Label] = true
				}
			}
			out = append(out, a)
			continue
		}
	passes:
		for _, faithful := range []bool{true, false} {
			for _, m := range meshes {
				if m.Label == baseline || taken[m.Label] {
					continue
				}
				for _, st := range m.Stands {
					if (st.Unlike == "") == faithful && st.Takes(r, m.Options) {
						a.Mesh, a.Unlike = m.Label, st.Unlike
						taken[m.Label] = true
						break passes
					}
				}
			}
		}
		out = append(out, a)
	}
	return out
}
