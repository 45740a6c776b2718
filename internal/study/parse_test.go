package study

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/meshmark/meshmark/internal/mesh"
)

// minimal is the smallest valid study; invalid cases below are edits of it, so
// each case's error comes from the one thing it changes.
const minimal = `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata:
  name: mini
spec:
  workload:
    graph: bookinfo
  meshes:
    - name: base
      profile: none
    - name: side
      profile: envoy-sidecar
  experiments:
    - name: cap
      kind: capacity
      connections: [8, 16]
      duration: 15s
    - name: lat
      kind: fixed-rate
      rate: 75% of lowest capacity
      duration: 20s
`

// kubernetesOnly is why the registry says a profile runs on Kubernetes only.
func kubernetesOnly(t testing.TB, profile string) string {
	reg, ok := mesh.Lookup(profile)
	if !ok || reg.KubernetesOnly == "" {
		t.Fatalf("profile %s is not registered as Kubernetes-only", profile)
	}
	return reg.KubernetesOnly
}

func examples(t testing.TB) []string {
	files, err := filepath.Glob("../../examples/*.yaml")
	if err != nil || len(files) < 6 {
		t.Fatalf("examples: %v (found %d)", err, len(files))
	}
	return files
}

func TestExamplesParse(t *testing.T) {
	for _, f := range examples(t) {
		s, err := ParseFile(f)
		if err != nil {
			t.Errorf("%s:\n%v", f, err)
			continue
		}
		if len(s.Warnings) > 0 {
			t.Errorf("%s: unexpected warnings %v", f, s.Warnings)
		}
		data, _ := os.ReadFile(f)
		if !strings.HasPrefix(string(data), "# yaml-language-server: $schema=../schema/study.schema.json\n") {
			t.Errorf("%s: first line must point editors at the schema", f)
		}
	}
}

func TestDefaultsFilledIn(t *testing.T) {
	s, err := Parse("mini.yaml", []byte(minimal))
	if err != nil {
		t.Fatal(err)
	}
	sp := s.Spec
	if sp.Substrate.Local == nil || sp.Substrate.Local.Nodes != 2 || sp.Substrate.Local.LoadgenNode != 1 || sp.Substrate.Local.CPUIdle != CPUIdlePoll {
		t.Errorf("local substrate defaults: %+v", sp.Substrate.Local)
	}
	if sp.Repeats != 3 || sp.Order != Interleaved || sp.Seed != defaultSeed("mini") || sp.Warmup.D() != 10*time.Second {
		t.Errorf("spec defaults: repeats %d order %s seed %d warmup %s", sp.Repeats, sp.Order, sp.Seed, sp.Warmup)
	}
	if sp.Baseline != "base" {
		t.Errorf("baseline %q, want the none mesh", sp.Baseline)
	}
	lat := s.Experiment("lat")
	if lat.CapacityFrom != "cap" || lat.Arrival != ArrivalConstant || !lat.KeepAlive || lat.Path != PathInternal ||
		!reflect.DeepEqual(lat.Connections, IntList{defaultConnections}) || lat.Warmup != sp.Warmup {
		t.Errorf("fixed-rate defaults: %+v", lat)
	}
	if cp := s.Experiment("cap"); cp.Arrival != "" || !cp.ClosedLoop() {
		t.Errorf("a closed-loop capacity sweep has no arrival process: %+v", cp)
	}
	out, err := s.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"capacityFrom: cap", "arrival: constant", "seed: ", "repeats: 3", "keepAlive: true", "baseline: base", "cpuIdle: poll"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("printed study lacks %q:\n%s", want, out)
		}
	}
}

// TestPrintRoundTrip: the printed form of every example parses back to the same study.
func TestPrintRoundTrip(t *testing.T) {
	for _, f := range examples(t) {
		s, err := ParseFile(f)
		if err != nil {
			t.Fatal(err)
		}
		checkRoundTrip(t, s)
	}
}

func checkRoundTrip(t testing.TB, s *Study) {
	t.Helper()
	out, err := s.Marshal()
	if err != nil {
		t.Fatalf("%s: %v", s.File, err)
	}
	again, err := Parse(s.File, out)
	if err != nil {
		t.Fatalf("%s: printed study does not parse:\n%v\n%s", s.File, err, out)
	}
	again.Warnings = s.Warnings
	again.positions = s.positions // printing moves fields to other lines
	if !reflect.DeepEqual(s, again) {
		t.Fatalf("%s: printed study parses to something else:\n%+v\n%+v\n%s", s.File, s.Spec, again.Spec, out)
	}
}

func TestPrecisionParsesAndRoundTrips(t *testing.T) {
	s, err := Parse("p.yaml", []byte(strings.Replace(minimal, "  experiments:\n", "  precision: {p50: 5%, p99: 20%}\n  experiments:\n", 1)))
	if err != nil {
		t.Fatal(err)
	}
	pr := s.Spec.Precision
	if pr == nil || pr.P50 != 5 || pr.P99 != 20 || pr.Budget.D() != 10*time.Minute {
		t.Fatalf("precision %+v", pr)
	}
	if got := pr.Targets(); len(got) != 2 || got[0] != (PrecisionTarget{"p50", 5}) || got[1] != (PrecisionTarget{"p99", 20}) {
		t.Errorf("targets %+v", got)
	}
	checkRoundTrip(t, s)
	one := strings.Replace(minimal, "    - name: side\n      profile: envoy-sidecar\n", "", 1)
	if _, err := Parse("p.yaml", []byte(strings.Replace(one, "  experiments:\n", "  precision: {p50: 5%}\n  experiments:\n", 1))); err == nil ||
		!strings.Contains(err.Error(), "spec.precision: a precision is that of comparisons between meshes") {
		t.Errorf("precision with one mesh: %v", err)
	}
}

func TestInvalid(t *testing.T) {
	cases := []struct {
		name, old, new string
		want           []string
	}{
		{"unknown field with suggestion", "  workload:\n", "  workload:\n    replica: {x: 1}\n",
			[]string{`f.yaml:7:5: spec.workload.replica: unknown field (did you mean "replicas"?)`}},
		{"unknown field far from any", "  workload:\n", "  workload:\n    zzzzzzzz: 1\n",
			[]string{`f.yaml:7:5: spec.workload.zzzzzzzz: unknown field`}},
		{"relative rate typo", "rate: 75% of lowest capacity", "rate: \"75% of fastest capacity\"\n      capacityFrom: cap",
			[]string{`f.yaml:20:13: spec.experiments[1].rate: "75% of fastest capacity": expected "<N>% of lowest|highest capacity" or a number`}},
		{"negative rate", "rate: 75% of lowest capacity", "rate: -5",
			[]string{`f.yaml:20:13: spec.experiments[1].rate: -5: must be positive`}},
		{"duration without unit", "duration: 20s", "duration: 20",
			[]string{`f.yaml:21:17: spec.experiments[1].duration: 20: expected a duration with a unit, like "30s" or "5m"`}},
		{"warmup not below duration", "duration: 20s", "duration: 20s\n      warmup: 20s",
			[]string{`f.yaml:22:15: spec.experiments[1].warmup: warm-up 20s is not shorter than the duration 20s`}},
		{"default warmup not below duration", "duration: 15s", "duration: 5s",
			[]string{`f.yaml:17:17: spec.experiments[0].duration: warm-up 10s is not shorter than the duration 5s`}},
		{"unknown client protocol", "duration: 20s", "duration: 20s\n      protocol: h2",
			[]string{`f.yaml:22:17: spec.experiments[1].protocol: "h2": expected one of auto, http1, h2c, grpc (did you mean "h2c"?)`}},
		{"streams over HTTP/1.1", "duration: 20s", "duration: 20s\n      protocol: http1\n      streams: 4",
			[]string{`f.yaml:23:16: spec.experiments[1].streams: HTTP/1.1 carries one request at a time per connection: streams needs protocol h2c or grpc`}},
		{"grpc without keep-alive", "duration: 20s", "duration: 20s\n      protocol: grpc\n      keepAlive: false",
			[]string{`f.yaml:23:18: spec.experiments[1].keepAlive: gRPC clients keep their channel open: a channel per call would measure channel setup`}},
		{"duplicate mesh names", "name: side", "name: base",
			[]string{`f.yaml:11:13: spec.meshes[1].name: "base" is already the name of spec.meshes[0]: give each mesh its own name`}},
		{"unknown profile", "profile: envoy-sidecar", "profile: envoy-sidecr",
			// The list is the registry's, which grows with every profile package.
			[]string{`f.yaml:12:16: spec.meshes[1].profile: "envoy-sidecr": unknown profile, expected one of ` + strings.Join(KnownProfiles(), ", ") + ` (did you mean "envoy-sidecar"?)`}},
		{"kubernetes-only profile on the local substrate", "profile: envoy-sidecar", "profile: cilium",
			// What the registry says of the profile, so that validate says what run will.
			[]string{`f.yaml:12:16: spec.meshes[1].profile: cilium runs on spec.substrate.kubernetes only: ` + kubernetesOnly(t, "cilium")}},
		{"no baseline", "profile: none", "profile: envoy-sidecar",
			[]string{`f.yaml:9:5: spec.meshes: comparing 2 meshes needs a baseline: add a mesh with profile none, or name one in spec.baseline`}},
		{"baseline names no mesh", "  experiments:\n", "  baseline: bsae\n  experiments:\n",
			[]string{`f.yaml:13:13: spec.baseline: "bsae" is not the name of a mesh (did you mean "base"?)`}},
		{"reference to a later experiment", "rate: 75% of lowest capacity", "rate: 75% of lowest capacity\n      capacityFrom: later",
			[]string{`f.yaml:21:21: spec.experiments[1].capacityFrom: "later" is not an earlier experiment`}},
		{"reference to a non-capacity experiment", "rate: 75% of lowest capacity", "rate: 75% of lowest capacity\n      capacityFrom: lat",
			[]string{`f.yaml:21:21: spec.experiments[1].capacityFrom: "lat" is this experiment itself`}},
		{"relative rate with no capacity before", "      kind: capacity", "      kind: connections",
			[]string{`f.yaml:20:13: spec.experiments[1].rate: "75% of lowest capacity" refers to a capacity, but no capacity experiment comes before this one`}},
		{"field of another kind", "duration: 20s", "duration: 20s\n      from: 5",
			[]string{`f.yaml:22:13: spec.experiments[1].from: not used by kind fixed-rate (it takes duration, connections, rate, capacityFrom, arrival)`}},
		{"sweep where one count is taken", "duration: 20s", "duration: 20s\n      connections: [1, 2]",
			[]string{`f.yaml:22:20: spec.experiments[1].connections: kind fixed-rate takes one connection count; use kind connections to sweep`}},
		{"zero and repeated connections", "connections: [8, 16]", "connections: [0, 16, 16]",
			[]string{`f.yaml:16:20: spec.experiments[0].connections[0]: 0: expected 1 to 100000 connections`,
				`f.yaml:16:20: spec.experiments[0].connections[2]: 16 appears twice`}},
		{"security probe misspelt and a load field", "duration: 20s", "duration: 20s\n    - kind: security\n      probes: [encryption, encrytion]\n      path: ingress",
			[]string{`f.yaml:23:28: spec.experiments[2].probes[1]: "encrytion": expected one of encryption, plaintext-refused, authorization, bypass, identity (did you mean "encryption"?)`,
				`f.yaml:24:13: spec.experiments[2].path: not used by kind security (it sends its own probe traffic; it takes requests, probes)`}},
		{"security probe twice, too many requests", "duration: 20s", "duration: 20s\n    - kind: security\n      requests: 20000\n      probes: [bypass, bypass]",
			[]string{`f.yaml:23:17: spec.experiments[2].requests: 20000: want 1..10000 requests to capture`,
				`f.yaml:24:24: spec.experiments[2].probes[1]: "bypass" is listed twice`}},
		{"unknown kind", "kind: capacity", "kind: capacty",
			[]string{`f.yaml:15:13: spec.experiments[0].kind: "capacty": expected one of capacity, fixed-rate, steps, soak, users, connections, security (did you mean "capacity"?)`}},
		{"wrong api version", "meshmark.dev/v1alpha1", "meshmark.dev/v1",
			[]string{`f.yaml:1:13: apiVersion: "meshmark.dev/v1": expected "meshmark.dev/v1alpha1"`}},
		{"bad study name", "name: mini", "name: Mini_Study",
			[]string{`f.yaml:4:9: metadata.name: "Mini_Study": use at most 63 lower-case letters, digits and '-', starting and ending with a letter or digit`}},
		{"unknown graph", "graph: bookinfo", "graph: bookinf",
			[]string{`f.yaml:7:12: spec.workload.graph: "bookinf": not a built-in graph (bookinfo, emojivoto, online-boutique, teastore, chain-N, fanout-N) and not a file path (did you mean "bookinfo"?)`}},
		{"replicas of a service the graph lacks", "graph: bookinfo", "graph: bookinfo\n    replicas: {reviews: 2, rating: 3}",
			[]string{`f.yaml:8:36: spec.workload.replicas.rating: graph bookinfo has no service "rating" (it has productpage, details, reviews, ratings) (did you mean "ratings"?)`}},
		{"too many replicas", "graph: bookinfo", "graph: bookinfo\n    replicas: {reviews: 101}",
			[]string{`f.yaml:8:25: spec.workload.replicas.reviews: 101: expected 1 to 100 replicas`}},
		{"missing graph file", "graph: bookinfo", "graph: graphs/nope.yaml",
			[]string{`f.yaml:7:12: spec.workload.graph: graph file "graphs/nope.yaml" not found (paths are relative to the study file)`}},
		{"order typo", "  experiments:\n", "  order: interleave\n  experiments:\n",
			[]string{`f.yaml:13:10: spec.order: "interleave": expected interleaved or sequential (did you mean "interleaved"?)`}},
		{"search without slo", "connections: [8, 16]", "search: {start: 100, max: 50}",
			[]string{`f.yaml:16:15: spec.experiments[0].search: a rate search needs spec.slo to know when a rate is too high`,
				`f.yaml:16:33: spec.experiments[0].search.max: 50: must be above start (100)`}},
		{"capacity basis misspelt", "connections: [8, 16]", "connections: [8, 16]\n      capacity: closed",
			[]string{`f.yaml:17:17: spec.experiments[0].capacity: "closed": want open-loop (the highest open-loop rate the target sustains under the SLO, the default) or closed-loop (the best closed-loop throughput)`}},
		{"closed-loop capacity from a search", "connections: [8, 16]", "capacity: closed-loop\n      search: {start: 100, max: 200}",
			[]string{`f.yaml:14:7: spec.experiments[0].connections: missing: capacity: closed-loop is the best throughput of a closed-loop sweep over these connection counts`,
				`f.yaml:17:15: spec.experiments[0].search: a rate search finds an open-loop capacity; with capacity: closed-loop it would not be used (remove one of them)`,
				`f.yaml:17:15: spec.experiments[0].search: a rate search needs spec.slo to know when a rate is too high`}},
		{"slo percentiles out of order", "  experiments:\n", "  slo: {p50: 1s, p99: 100ms, errorRate: 200%}\n  experiments:\n",
			[]string{`f.yaml:13:23: spec.slo.p99: 100ms is below p50 1s: a higher percentile cannot have a lower bound`,
				`f.yaml:13:41: spec.slo.errorRate: "200%": must be at most 100%`}},
		{"precision empty, below zero, unknown", "  experiments:\n", "  precision: {budget: -1s}\n  experiments:\n",
			[]string{`f.yaml:13:14: spec.precision: empty: give at least one of p50, p90, p99, p999`,
				`f.yaml:13:23: spec.precision.budget: "-1s": must not be negative`}},
		{"precision without budget time", "  experiments:\n", "  precision: {p50: 5%, budget: 0s}\n  experiments:\n",
			[]string{`f.yaml:13:32: spec.precision.budget: must be above 0s`}},
		{"precision of a percentile", "  experiments:\n", "  precision: {p50: 0%, p95: 5%}\n  experiments:\n",
			[]string{`f.yaml:13:20: spec.precision.p50: must be above 0%`, `f.yaml:13:24: spec.precision.p95: unknown field (did you mean "p90"?)`}},
		{"precision zero", "  experiments:\n", "  precision: {p50: 0%}\n  experiments:\n",
			[]string{`f.yaml:13:20: spec.precision.p50: must be above 0%`}},
		{"mesh given twice as field", "      profile: none\n", "      profile: none\n      profile: none\n",
			[]string{`f.yaml:11:7: spec.meshes[0].profile: given twice`}},
		{"scalar where a list belongs", "  meshes:\n    - name: base\n      profile: none\n    - name: side\n      profile: envoy-sidecar\n", "  meshes: none\n",
			[]string{`f.yaml:8:11: spec.meshes: expected a list, got "none"`}},
		{"yaml syntax", "  workload:\n", "  workload:\n   - : [\n",
			[]string{`f.yaml:6:1: YAML syntax: did not find expected key`}},
		{"both substrates", "  workload:\n", "  substrate: {local: {}, kubernetes: {}}\n  workload:\n",
			[]string{`f.yaml:6:14: spec.substrate: give either local or kubernetes, not both`}},
		{"loadgen node out of range", "  workload:\n", "  substrate: {local: {nodes: 2, loadgenNode: 2}}\n  workload:\n",
			[]string{`f.yaml:6:46: spec.substrate.local.loadgenNode: 2: expected a node index from 0 to 1 (nodes: 2)`}},
		{"unknown cpu idle", "  workload:\n", "  substrate: {local: {cpuIdle: halt}}\n  workload:\n",
			[]string{`f.yaml:6:32: spec.substrate.local.cpuIdle: "halt": expected "poll" (idle CPUs poll while trials measure) or "os" (the kernel's idle governor decides)`}},
		{"bad cpu list", "  workload:\n", "  substrate: {local: {cpuPlacement: {loadgen: 1-, sut: 0}}}\n  workload:\n",
			[]string{`f.yaml:6:47: spec.substrate.local.cpuPlacement.loadgen: "1-": expected a CPU list like "0", "1-3" or "0,2"`}},
		{"steps incomplete and reversed", "      kind: fixed-rate\n      rate: 75% of lowest capacity\n", "      kind: steps\n      from: 100\n      to: 50\n",
			[]string{`f.yaml:18:7: spec.experiments[1].step: missing: steps needs from, to and step (requests per second) and each (duration)`,
				`f.yaml:18:7: spec.experiments[1].each: missing: how long each step runs, like "60s"`,
				`f.yaml:21:11: spec.experiments[1].to: 50 is below from (100)`,
				`f.yaml:22:17: spec.experiments[1].duration: not used by kind steps (it takes connections, from, to, step, each, arrival)`}},
		{"steps shorter than the default warm-up", "      kind: fixed-rate\n      rate: 75% of lowest capacity\n      duration: 20s\n",
			"      kind: steps\n      from: 10\n      to: 50\n      step: 10\n      each: 5s\n",
			[]string{`f.yaml:23:13: spec.experiments[1].each: warm-up 10s is not shorter than each step (5s)`}},
		{"kubernetes placeholders checked", "  workload:\n", "  substrate:\n    kubernetes: {namespacePrefix: Mesh, sutNodeSelector: {\"bad key!\": x}}\n  workload:\n",
			[]string{`f.yaml:7:35: spec.substrate.kubernetes.namespacePrefix: "Mesh": use at most 40 lower-case letters, digits and '-'`,
				`f.yaml:7:71: spec.substrate.kubernetes.sutNodeSelector.bad key!: "bad key!" is not a valid Kubernetes label key`}},
		{"kubernetes image checked", "  workload:\n", "  substrate:\n    kubernetes: {image: \"Meshmark:latest tag\"}\n  workload:\n",
			[]string{`f.yaml:7:25: spec.substrate.kubernetes.image: "Meshmark:latest tag": expected an image reference like registry.example/meshmark:v1 (lower-case repository, optional :tag or @sha256:digest)`}},
		{"kubernetes generators bounded", "  workload:\n", "  substrate:\n    kubernetes: {generators: 0}\n  workload:\n",
			[]string{`f.yaml:7:30: spec.substrate.kubernetes.generators: 0: want 1 to 64 load-generator pods`}},
		{"kubernetes ready timeout bounded", "  workload:\n", "  substrate:\n    kubernetes: {readyTimeout: 500ms}\n  workload:\n",
			[]string{`f.yaml:7:32: spec.substrate.kubernetes.readyTimeout: 500ms: want 1s to 2h`}},
		{"fixed rate without duration", "      duration: 20s\n", "",
			[]string{`f.yaml:18:7: spec.experiments[1].duration: missing: how long to measure, like "60s"`}},
		{"arrival on closed-loop load", "connections: [8, 16]", "connections: [8, 16]\n      arrival: poisson",
			[]string{`f.yaml:17:16: spec.experiments[0].arrival: closed-loop load has no arrival process (it takes one with search)`}},
		{"mesh option checked where it is written", "      profile: envoy-sidecar\n", "      profile: envoy-sidecar\n      options: {mtls: sometimes, concurency: 2}\n",
			[]string{`f.yaml:13:46: spec.meshes[1].options.concurency: unknown option for envoy-sidecar (known: access_log, circuit_breakers, concurrency, helm_values, istio_charts, istio_version, mesh_clients, mtls, plaintext_services, request_id, retries, telemetry, trust_domain)`}},
		{"users without tasks", "      kind: fixed-rate\n      rate: 75% of lowest capacity\n", "      kind: users\n      users: 0\n      thinkTime: 10s-1s\n",
			[]string{`f.yaml:18:7: spec.experiments[1].tasks: missing: list what each user does, like [{path: /productpage}]`,
				`f.yaml:20:14: spec.experiments[1].users: missing or below 1: how many simulated users`,
				`f.yaml:21:18: spec.experiments[1].thinkTime: "10s-1s": the lower bound is above the upper bound`}},
		{"empty document", minimal, "",
			[]string{`f.yaml: empty document: expected a study (apiVersion: meshmark.dev/v1alpha1, kind: Study)`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(minimal, tc.old) {
				t.Fatalf("test case edits text that is not in the minimal study: %q", tc.old)
			}
			doc := strings.Replace(minimal, tc.old, tc.new, 1)
			_, err := Parse("f.yaml", []byte(doc))
			var es Errors
			if !errors.As(err, &es) {
				t.Fatalf("want Errors, got %v\n%s", err, doc)
			}
			var got []string
			for _, e := range es {
				got = append(got, e.Error())
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got:\n  %s\nwant:\n  %s\ndocument:\n%s", strings.Join(got, "\n  "), strings.Join(tc.want, "\n  "), doc)
			}
		})
	}
}

func TestGraphFileRelativeToStudy(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "graphs"), 0o755); err != nil {
		t.Fatal(err)
	}
	graph := "name: g\nservices:\n  - name: front\n    isEntrypoint: true\n"
	if err := os.WriteFile(filepath.Join(dir, "graphs", "g.yaml"), []byte(graph), 0o644); err != nil {
		t.Fatal(err)
	}
	doc := strings.Replace(minimal, "graph: bookinfo", "graph: graphs/g.yaml", 1)
	file := filepath.Join(dir, "study.yaml")
	if err := os.WriteFile(file, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := ParseFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Spec.Workload.IsGraphFile() || s.Resolve(s.Spec.Workload.Graph) != filepath.Join(dir, "graphs", "g.yaml") {
		t.Errorf("graph %q resolves to %q", s.Spec.Workload.Graph, s.Resolve(s.Spec.Workload.Graph))
	}
	checkRoundTrip(t, s)

	// A broken graph file is reported at spec.workload.graph, with the graph's own errors.
	if err := os.WriteFile(filepath.Join(dir, "graphs", "g.yaml"), []byte("name: g\nservices: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = ParseFile(file)
	if err == nil || !strings.Contains(err.Error(), "study.yaml:7:12: spec.workload.graph: graph file") ||
		!strings.Contains(err.Error(), "g.yaml:2:11: services:") {
		t.Errorf("broken graph file: %v", err)
	}
}

func TestKubernetesAndSearchDefaults(t *testing.T) {
	doc := strings.Replace(minimal, "  workload:\n", "  substrate: {kubernetes: {context: kind-a, image: \"registry.example:5000/team/meshmark:v1.2@sha256:abababababababababababababababababababababababababababababababab\"}}\n  slo: {p99: 1s, errorRate: 0.5%}\n  workload:\n", 1)
	doc = strings.Replace(doc, "connections: [8, 16]", "search: {start: 100, max: 2000}", 1)
	s, err := Parse("k.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	k := s.Spec.Substrate.Kubernetes
	if s.Spec.Substrate.Local != nil || k == nil || k.NamespacePrefix != "meshmark" || !k.Cleanup || k.Context != "kind-a" || !strings.HasPrefix(k.Image, "registry.example:5000/team/meshmark:v1.2@sha256:ab") ||
		k.ReadyTimeout.D() != 5*time.Minute {
		t.Errorf("kubernetes substrate: %+v local %+v", k, s.Spec.Substrate.Local)
	}
	cp := s.Experiment("cap")
	if cp.Search.Precision != 5 || cp.ClosedLoop() || cp.Arrival != ArrivalConstant || !slices.Equal(cp.Connections, IntList{defaultConnections}) {
		t.Errorf("search defaults: %+v %+v", cp, cp.Search)
	}
	if f := s.Spec.SLO.ErrorRate.Fraction(); f != 0.005 {
		t.Errorf("0.5%% as a fraction: %v", f)
	}
	checkRoundTrip(t, s)
}

func TestErrorAt(t *testing.T) {
	s, err := Parse("mini.yaml", []byte(minimal))
	if err != nil {
		t.Fatal(err)
	}
	cause := errors.New(`option "mtls": unknown mode "sometimes"`)
	got := s.ErrorAt("spec.meshes[1].options", cause)
	if want := `mini.yaml:11:7: spec.meshes[1].options: option "mtls": unknown mode "sometimes"`; got.Error() != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	if !errors.Is(got, cause) {
		t.Error("ErrorAt does not unwrap to its cause")
	}
	if got := s.ErrorAt("spec.experiments[1].rate", cause).Error(); !strings.HasPrefix(got, "mini.yaml:20:13: ") {
		t.Errorf("present field: %s", got)
	}
}

func TestCPUOverlapWarns(t *testing.T) {
	doc := strings.Replace(minimal, "  workload:\n", "  substrate: {local: {cpuPlacement: {loadgen: \"0-1\", sut: \"1\"}}}\n  workload:\n", 1)
	s, err := Parse("f.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Warnings) != 1 || !strings.Contains(s.Warnings[0], "shares CPU 1") {
		t.Errorf("warnings %q", s.Warnings)
	}
}

func TestAliasBombIsBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n")
	for i := 1; i < 9; i++ {
		b.WriteString("a" + string(rune('0'+i)) + ": &a" + string(rune('0'+i)) + " [")
		for j := 0; j < 10; j++ {
			if j > 0 {
				b.WriteString(", ")
			}
			b.WriteString("*a" + string(rune('0'+i-1)))
		}
		b.WriteString("]\n")
	}
	doc := strings.Replace(minimal, "  workload:\n", "  workload:\n    replicas: {productpage: *a8}\n", 1)
	doc = b.String() + doc
	start := time.Now()
	_, err := Parse("bomb.yaml", []byte(doc))
	if err == nil {
		t.Fatal("alias bomb accepted")
	}
	if time.Since(start) > 20*time.Second {
		t.Errorf("alias bomb took %v", time.Since(start))
	}
}

func TestRateResolve(t *testing.T) {
	caps := map[string]float64{"base": 1000, "side": 800, "mtls": 900}
	for _, tc := range []struct {
		rate Rate
		want float64
	}{
		{Rate{PerSecond: 500}, 500},
		{Rate{Percent: 75, Of: LowestCapacity}, 600},
		{Rate{Percent: 50, Of: HighestCapacity}, 500},
	} {
		got, err := tc.rate.Resolve(caps)
		if err != nil || got != tc.want {
			t.Errorf("%s: got %v, %v; want %v", tc.rate, got, err, tc.want)
		}
	}
	if _, err := (Rate{Percent: 75, Of: LowestCapacity}).Resolve(nil); err == nil {
		t.Error("a relative rate resolved without any capacity")
	}
}

func TestStepRates(t *testing.T) {
	s, err := ParseFile("../../examples/s4-steps-heatmap.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rates := s.Experiment("latency-steps").StepRates()
	if len(rates) != 5 || rates[0] != 50 || rates[4] != 250 {
		t.Errorf("steps 50..250 by 50: %v", rates)
	}
}

func FuzzParseStudy(f *testing.F) {
	f.Add([]byte(minimal))
	for _, file := range examples(f) {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte("spec: {experiments: [{kind: steps, from: 1, to: 1e308, step: 1e-300}]}"))
	f.Add([]byte("a: &a [*a]"))
	search := strings.Replace(minimal, "  workload:\n", "  substrate: {kubernetes: {context: a}}\n  slo: {p99: 1s}\n  workload:\n", 1)
	f.Add([]byte(strings.Replace(search, "connections: [8, 16]", "search: {start: 100, max: 2000}\n      arrival: poisson", 1)))
	sch := compileSchema(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Parse("fuzz.yaml", data)
		if err != nil {
			var es Errors
			if !errors.As(err, &es) || len(es) == 0 {
				t.Fatalf("error is not a non-empty Errors: %v", err)
			}
			for _, e := range es {
				if e.File != "fuzz.yaml" || e.Msg == "" {
					t.Fatalf("error without file or message: %#v", e)
				}
			}
			return
		}
		checkRoundTrip(t, s)
		out, _ := s.Marshal()
		if err := validateYAML(sch, out); err != nil {
			t.Fatalf("printed study accepted by the parser fails the schema: %v\n%s", err, out)
		}
		_ = s.Plan()
	})
}

// TestSLOBounds: a study's spec.slo becomes the SLO the runner and the analysis judge
// by with every bound it sets (p95 and p99.9 too), no errors allowed when it sets no
// error rate, and the default SLO's served share and knee factor; a study without one
// is judged by the default SLO.
func TestSLOBounds(t *testing.T) {
	s, err := Parse("slo.yaml", []byte(minimal+"  slo: {p95: 50ms, p999: 2s}\n"))
	if err != nil {
		t.Fatal(err)
	}
	def := analysis.DefaultSLO()
	want := analysis.SLO{P95: 50 * time.Millisecond, P999: 2 * time.Second, MinAchieved: def.MinAchieved, KneeFactor: def.KneeFactor}
	if got := s.Spec.SLO.Bounds(); got != want {
		t.Errorf("bounds %+v, want %+v", got, want)
	}
	s, err = Parse("slo.yaml", []byte(minimal+"  slo: {p50: 300ms, p99: 1s, errorRate: 0.5%}\n"))
	if err != nil {
		t.Fatal(err)
	}
	want = def
	want.MaxErrorRate = 0.005
	if got := s.Spec.SLO.Bounds(); got != want {
		t.Errorf("bounds %+v, want %+v", got, want)
	}
	s, err = Parse("slo.yaml", []byte(minimal))
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Spec.SLO.Bounds(); s.Spec.SLO != nil || got != def {
		t.Errorf("no spec.slo: %+v, want the default %+v", got, def)
	}
}
