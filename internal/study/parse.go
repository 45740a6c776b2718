package study

import (
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"reflect"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/workload"
	"gopkg.in/yaml.v3"
)

// Parse parses a study document. filename is used in error messages and to resolve
// relative paths. The returned error, when not nil, is an Errors listing every
// problem found, each with file:line:column and the field path.
func Parse(filename string, data []byte) (*Study, error) {
	d := &decoder{file: filename, values: map[string]*yaml.Node{}, failed: map[string]bool{}}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, Errors{syntaxError(filename, err)}
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		return nil, Errors{{File: filename, Msg: "empty document: expected a study (apiVersion: " + APIVersion + ", kind: Study)"}}
	}
	s := &Study{File: filename}
	if !strings.HasPrefix(filename, "builtin:") {
		s.Dir = filepath.Dir(filename)
	}
	root := doc.Content[0]
	d.values[""] = root
	d.decode("", root, reflect.ValueOf(s).Elem())
	c := &checker{decoder: d, s: s}
	c.check()
	if len(d.errs) > 0 {
		sort.SliceStable(d.errs, func(i, j int) bool {
			a, b := d.errs[i], d.errs[j]
			return a.Line < b.Line || a.Line == b.Line && a.Column < b.Column
		})
		return nil, d.errs
	}
	s.positions = make(map[string]position, len(d.values))
	for path, n := range d.values {
		s.positions[path] = position{n.Line, n.Column}
	}
	return s, nil
}

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

func syntaxError(file string, err error) *FieldError {
	msg := err.Error()
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		return &FieldError{File: file, Line: line, Column: 1, Msg: "YAML syntax: " + m[2]}
	}
	return &FieldError{File: file, Msg: "YAML syntax: " + strings.TrimPrefix(msg, "yaml: ")}
}

// checker fills in defaults and checks everything a single field cannot check on
// its own.
type checker struct {
	*decoder
	s *Study
}

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

func (c *checker) name(path, v, what string) {
	switch {
	case v == "":
		c.errAt(path, "missing: every %s needs a name", what)
	case len(v) > 63 || !dnsLabel.MatchString(v):
		c.errAt(path, "%q: use at most 63 lower-case letters, digits and '-', starting and ending with a letter or digit", v)
	}
}

func (c *checker) check() {
	s := c.s
	if !c.has("apiVersion") {
		c.errAt("apiVersion", "missing: expected %q", APIVersion)
	} else if s.APIVersion != APIVersion {
		c.errAt("apiVersion", "%q: expected %q", s.APIVersion, APIVersion)
	}
	if !c.has("kind") {
		c.errAt("kind", "missing: expected %q", Kind)
	} else if s.Kind != Kind {
		c.errAt("kind", "%q: expected %q", s.Kind, Kind)
	}
	c.name("metadata.name", s.Metadata.Name, "study")
	if !c.has("spec") {
		c.errAt("spec", "missing: a study needs a spec with workload, meshes and experiments")
		return
	}
	c.substrate()
	c.workload()
	c.meshes()
	c.settings()
	c.experiments()
	c.reproduces()
}

func (c *checker) substrate() {
	sub := &c.s.Spec.Substrate
	switch {
	case sub.Local != nil && sub.Kubernetes != nil:
		c.errAt("spec.substrate", "give either local or kubernetes, not both")
		return
	case sub.Kubernetes != nil:
		c.kubernetes(sub.Kubernetes)
		return
	case sub.Local == nil:
		sub.Local = &LocalSubstrate{}
	}
	l, p := sub.Local, "spec.substrate.local"
	if !c.has(p + ".nodes") {
		l.Nodes = 2
	} else if l.Nodes < 1 || l.Nodes > 64 {
		c.errAt(p+".nodes", "%d: expected 1 to 64 nodes", l.Nodes)
		return
	}
	if !c.has(p + ".loadgenNode") {
		l.LoadgenNode = l.Nodes - 1
	} else if l.LoadgenNode < 0 || l.LoadgenNode >= l.Nodes {
		c.errAt(p+".loadgenNode", "%d: expected a node index from 0 to %d (nodes: %d)", l.LoadgenNode, l.Nodes-1, l.Nodes)
	}
	switch l.CPUIdle {
	case "":
		l.CPUIdle = CPUIdlePoll
	case CPUIdlePoll, CPUIdleOS:
	default:
		c.errAt(p+".cpuIdle", "%q: expected %q (idle CPUs poll while trials measure) or %q (the kernel's idle governor decides)", l.CPUIdle, CPUIdlePoll, CPUIdleOS)
	}
	if cp := l.CPUPlacement; cp != nil {
		if cp.Loadgen == "" {
			c.errAt(p+".cpuPlacement.loadgen", "missing: the CPUs the load generator runs on, like \"1\"")
		}
		if cp.SUT == "" {
			c.errAt(p+".cpuPlacement.sut", "missing: the CPUs the system under test runs on, like \"0\"")
		}
		a, err1 := cp.Loadgen.CPUs()
		b, err2 := cp.SUT.CPUs()
		if err1 == nil && err2 == nil && cp.Loadgen != "" && cp.SUT != "" {
			for _, cpu := range a {
				if slices.Contains(b, cpu) {
					c.s.Warnings = append(c.s.Warnings, fmt.Sprintf(
						"%s: the load generator shares CPU %d with the system under test; both will slow each other down", p+".cpuPlacement", cpu))
					break
				}
			}
		}
	}
}

// imageRef is the shape of an image reference: [registry[:port]/]path[:tag][@digest].
var imageRef = regexp.MustCompile(`^([a-zA-Z0-9.-]+(:[0-9]+)?/)?[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?$`)

var labelKey = regexp.MustCompile(`^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)

func (c *checker) kubernetes(k *KubernetesSubstrate) {
	p := "spec.substrate.kubernetes"
	if !c.has(p + ".namespacePrefix") {
		k.NamespacePrefix = "meshmark"
	} else if len(k.NamespacePrefix) > 40 || !dnsLabel.MatchString(k.NamespacePrefix) {
		c.errAt(p+".namespacePrefix", "%q: use at most 40 lower-case letters, digits and '-'", k.NamespacePrefix)
	}
	if !c.has(p + ".cleanup") {
		k.Cleanup = true
	}
	switch {
	case !c.has(p + ".generators"):
		k.Generators = 1
	case k.Generators < 1 || k.Generators > 64:
		c.errAt(p+".generators", "%d: want 1 to 64 load-generator pods", k.Generators)
	}
	switch {
	case !c.has(p + ".readyTimeout"):
		k.ReadyTimeout = DefaultReadyTimeout
	case k.ReadyTimeout.D() < time.Second || k.ReadyTimeout.D() > 2*time.Hour:
		c.errAt(p+".readyTimeout", "%s: want 1s to 2h", k.ReadyTimeout)
	}
	if c.has(p+".image") && !imageRef.MatchString(k.Image) {
		c.errAt(p+".image", "%q: expected an image reference like registry.example/meshmark:v1 (lower-case repository, optional :tag or @sha256:digest)", k.Image)
	}
	for _, sel := range []struct {
		field string
		m     map[string]string
	}{{"loadgenNodeSelector", k.LoadgenNodeSelector}, {"sutNodeSelector", k.SUTNodeSelector}} {
		for _, key := range sortedKeys(sel.m) {
			if !labelKey.MatchString(key) || len(key) > 253 {
				c.errAt(p+"."+sel.field+"."+key, "%q is not a valid Kubernetes label key", key)
			}
		}
	}
}

func looksLikePath(graph string) bool {
	return strings.ContainsAny(graph, `/\`) || strings.HasSuffix(graph, ".yaml") ||
		strings.HasSuffix(graph, ".yml") || strings.HasSuffix(graph, ".json")
}

// workload loads the graph through the workload package, so that the study accepts
// exactly the graphs a run can deploy and replica overrides can be checked against
// the graph's services here, with a position, rather than at run time.
func (c *checker) workload() {
	w, p := &c.s.Spec.Workload, "spec.workload"
	var g *workload.Graph
	switch {
	case w.Graph == "":
		c.errAt(p+".graph", "missing: a built-in graph (%s) or a graph file", strings.Join(workload.BuiltinNames(), ", "))
	case looksLikePath(w.Graph):
		if c.s.Dir == "" {
			c.errAt(p+".graph", "%q: an embedded study can only use built-in graphs", w.Graph)
			break
		}
		full := c.s.Resolve(w.Graph)
		if st, err := os.Stat(full); err != nil || st.IsDir() {
			c.errAt(p+".graph", "graph file %q not found (paths are relative to the study file)", full)
			break
		}
		var err error
		if g, err = workload.ParseFile(full); err != nil {
			c.errAt(p+".graph", "graph file %q is invalid:\n  %s", full, strings.ReplaceAll(err.Error(), "\n", "\n  "))
		}
	default:
		var err error
		if g, err = workload.Builtin(w.Graph); err != nil {
			base, _, _ := strings.Cut(w.Graph, ":")
			c.errAt(p+".graph", "%q: not a built-in graph (%s) and not a file path%s",
				w.Graph, strings.Join(workload.BuiltinNames(), ", "), suggest(base, workload.BuiltinNames()))
		}
	}
	for _, svc := range sortedKeys(w.Replicas) {
		switch n := w.Replicas[svc]; {
		case g != nil && g.Service(svc) == nil:
			var names []string
			for _, s := range g.Services {
				names = append(names, s.Name)
			}
			c.errAt(p+".replicas."+svc, "graph %s has no service %q (it has %s)%s", g.Name, svc, strings.Join(names, ", "), suggest(svc, names))
		case n < 1 || n > 100:
			c.errAt(p+".replicas."+svc, "%d: expected 1 to 100 replicas", n)
		}
	}
	if w.Entrypoint != "" && !strings.HasPrefix(w.Entrypoint, "/") {
		c.errAt(p+".entrypoint", "%q: an HTTP path must start with /", w.Entrypoint)
	}
}

func (c *checker) meshes() {
	spec := &c.s.Spec
	if len(spec.Meshes) == 0 {
		c.errAt("spec.meshes", "missing: list at least one mesh, e.g. {name: baseline, profile: none}")
		return
	}
	names := map[string]int{}
	var nones []string
	known := KnownProfiles()
	for i := range spec.Meshes {
		m, p := &spec.Meshes[i], fmt.Sprintf("spec.meshes[%d]", i)
		switch {
		case m.Profile == "":
			c.errAt(p+".profile", "missing: one of %s", strings.Join(known, ", "))
		case !slices.Contains(known, m.Profile):
			c.errAt(p+".profile", "%q: unknown profile, expected one of %s%s", m.Profile, strings.Join(known, ", "), suggest(m.Profile, known))
		}
		if m.Name == "" && m.Profile != "" {
			m.Name = m.Profile // labels default to the profile when it is used once
		}
		c.name(p+".name", m.Name, "mesh")
		if j, dup := names[m.Name]; dup && m.Name != "" {
			c.errAt(p+".name", "%q is already the name of spec.meshes[%d]: give each mesh its own name", m.Name, j)
		} else {
			names[m.Name] = i
		}
		if m.Profile == ProfileNone {
			nones = append(nones, m.Name)
		}
		// Options are checked by the profile itself, here where the line is known, so
		// validate accepts exactly what run will.
		if !slices.Contains(known, m.Profile) {
			continue
		}
		if reg, _ := mesh.Lookup(m.Profile); reg.KubernetesOnly != "" && spec.Substrate.Kubernetes == nil {
			c.errAt(p+".profile", "%s runs on spec.substrate.kubernetes only: %s", m.Profile, reg.KubernetesOnly)
		}
		if _, err := mesh.New(m.Profile, m.Options); err != nil {
			var oe *mesh.OptionError
			if errors.As(err, &oe) {
				c.errAt(p+".options."+oe.Key, "%s", oe.Msg)
			} else {
				c.errAt(p+".options", "%v", err)
			}
		}
	}
	switch {
	case spec.Baseline != "":
		if _, ok := names[spec.Baseline]; !ok {
			c.errAt("spec.baseline", "%q is not the name of a mesh%s", spec.Baseline, suggest(spec.Baseline, sortedKeys(names)))
		}
	case len(nones) > 0:
		spec.Baseline = nones[0]
	case len(spec.Meshes) > 1:
		c.errAt("spec.meshes", "comparing %d meshes needs a baseline: add a mesh with profile none, or name one in spec.baseline", len(spec.Meshes))
	}
}

// defaultSeed derives a seed from the study name so an unchanged study always runs
// in the same order, while different studies do not share one order.
func defaultSeed(name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return h.Sum64() >> 1 // stays a positive int64 for tools that read YAML ints as signed
}

func (c *checker) settings() {
	spec := &c.s.Spec
	if !c.has("spec.repeats") {
		spec.Repeats = 3
	} else if spec.Repeats < 1 || spec.Repeats > 1000 {
		c.errAt("spec.repeats", "%d: expected 1 to 1000 repeats", spec.Repeats)
	}
	switch spec.Order {
	case "":
		spec.Order = Interleaved
	case Interleaved, Sequential:
	default:
		c.errAt("spec.order", "%q: expected interleaved or sequential%s", spec.Order, suggest(string(spec.Order), []string{"interleaved", "sequential"}))
	}
	if !c.has("spec.seed") {
		spec.Seed = defaultSeed(c.s.Metadata.Name)
	}
	if !c.has("spec.warmup") {
		spec.Warmup = Duration(10 * time.Second)
	}
	if pr := spec.Precision; pr != nil {
		asked := false
		for _, q := range []string{"p50", "p90", "p99", "p999"} {
			if c.has("spec.precision." + q) {
				asked = true
			}
		}
		for _, q := range []struct {
			name string
			v    Percent
		}{{"p50", pr.P50}, {"p90", pr.P90}, {"p99", pr.P99}, {"p999", pr.P999}} {
			if c.has("spec.precision."+q.name) && q.v <= 0 {
				c.errAt("spec.precision."+q.name, "must be above 0%%")
			}
		}
		switch {
		case !asked:
			c.errAt("spec.precision", "empty: give at least one of p50, p90, p99, p999")
		case len(spec.Meshes) < 2:
			c.errAt("spec.precision", "a precision is that of comparisons between meshes: the study needs two or more")
		}
		if !c.has("spec.precision.budget") {
			pr.Budget = Duration(10 * time.Minute)
		} else if pr.Budget <= 0 {
			c.errAt("spec.precision.budget", "must be above 0s")
		}
	}
	if slo := spec.SLO; slo != nil {
		var prev Duration
		var prevName string
		for _, q := range []struct {
			name string
			v    Duration
		}{{"p50", slo.P50}, {"p90", slo.P90}, {"p95", slo.P95}, {"p99", slo.P99}, {"p999", slo.P999}} {
			switch {
			case c.has("spec.slo."+q.name) && q.v == 0:
				c.errAt("spec.slo."+q.name, "must be above 0s")
			case q.v != 0 && q.v < prev:
				c.errAt("spec.slo."+q.name, "%s is below %s %s: a higher percentile cannot have a lower bound", q.v, prevName, prev)
			case q.v != 0:
				prev, prevName = q.v, q.name
			}
		}
		if prev == 0 && !c.has("spec.slo.errorRate") {
			c.errAt("spec.slo", "empty: give at least one of p50, p90, p95, p99, p999, errorRate")
		}
	}
}

// kindFields lists, per kind, the kind-specific fields it accepts; every other
// kind-specific field is an error so a misplaced setting is never silently ignored.
var kindFields = map[ExperimentKind][]string{
	KindCapacity:    {"duration", "requests", "connections", "search", "capacity", "arrival"},
	KindFixedRate:   {"duration", "connections", "rate", "capacityFrom", "arrival"},
	KindSteps:       {"connections", "from", "to", "step", "each", "arrival"},
	KindSoak:        {"duration", "connections", "rate", "capacityFrom", "arrival"},
	KindUsers:       {"duration", "users", "spawnRate", "thinkTime", "requestsPerUser", "tasks"},
	KindConnections: {"duration", "requests", "connections", "rate", "capacityFrom", "arrival"},
	KindSecurity:    {"requests", "probes"},
}

var kindSpecific = []string{"duration", "requests", "connections", "rate", "capacityFrom", "arrival", "search", "capacity",
	"from", "to", "step", "each", "users", "spawnRate", "thinkTime", "requestsPerUser", "tasks", "probes"}

// loadFields are the common fields that shape load; a security experiment sends its
// own probe traffic and takes none of them.
var loadFields = []string{"warmup", "repeats", "keepAlive", "protocol", "streams", "path"}

// defaultSecurityRequests is how many requests cross the app while a security
// experiment captures the wire: enough that every edge of the built-in graphs carries
// several calls.
const defaultSecurityRequests = 60

// defaultConnections is the connection pool of open-loop load when none is given:
// enough that a 1 ms stall does not hold back a few thousand requests per second.
const defaultConnections = 32

func (c *checker) experiments() {
	spec := &c.s.Spec
	if len(spec.Experiments) == 0 {
		c.errAt("spec.experiments", "missing: list at least one experiment (kinds: %s)", kindList())
		return
	}
	index := map[string]int{}
	badKind := false // an earlier experiment of unknown kind may be the missing capacity one
	for i := range spec.Experiments {
		e, p := &spec.Experiments[i], fmt.Sprintf("spec.experiments[%d]", i)
		if e.Kind == "" {
			c.errAt(p+".kind", "missing: one of %s", kindList())
			badKind = true
			continue
		}
		allowed, ok := kindFields[e.Kind]
		if !ok {
			c.errAt(p+".kind", "%q: expected one of %s%s", e.Kind, kindList(), suggest(string(e.Kind), kindNames()))
			badKind = true
			continue
		}
		if e.Name == "" {
			e.Name = string(e.Kind)
			if _, taken := index[e.Name]; taken {
				e.Name = fmt.Sprintf("%s-%d", e.Kind, i+1)
			}
		}
		c.name(p+".name", e.Name, "experiment")
		if j, dup := index[e.Name]; dup {
			c.errAt(p+".name", "%q is already the name of spec.experiments[%d]", e.Name, j)
		} else {
			index[e.Name] = i
		}
		for _, f := range kindSpecific {
			if c.has(p+"."+f) && !slices.Contains(allowed, f) {
				c.errAt(p+"."+f, "not used by kind %s (it takes %s)", e.Kind, strings.Join(allowed, ", "))
			}
		}
		if e.Kind == KindSecurity {
			c.security(p, e)
			continue
		}
		c.common(p, e)
		switch e.Kind {
		case KindCapacity:
			c.capacity(p, e)
		case KindFixedRate, KindSoak:
			if !c.has(p + ".rate") {
				c.errAt(p+".rate", "missing: a rate in requests per second, or like \"75%% of lowest capacity\"")
			}
			c.needDuration(p, e)
			c.singleConnections(p, e)
		case KindSteps:
			c.steps(p, e)
			c.singleConnections(p, e)
		case KindUsers:
			c.users(p, e)
		case KindConnections:
			if len(e.Connections) == 0 {
				c.errAt(p+".connections", "missing: the connection counts to sweep, like [32, 64, 128]")
			}
			if !c.has(p+".duration") && e.Requests == 0 {
				c.errAt(p+".duration", "missing: give a duration, a request count (requests), or both")
			}
		}
		if e.ClosedLoop() {
			if c.has(p + ".arrival") {
				c.errAt(p+".arrival", "closed-loop load has no arrival process (it takes one with %s)", map[ExperimentKind]string{KindCapacity: "search", KindConnections: "rate"}[e.Kind])
			}
			e.Arrival = ""
		} else if e.Kind == KindUsers {
			e.Arrival = "" // users arrive by spawnRate and think time instead
		} else if e.Arrival == "" {
			e.Arrival = ArrivalConstant
		}
		c.rateReference(p, e, index, badKind)
	}
}

func (c *checker) common(p string, e *Experiment) {
	spec := &c.s.Spec
	if !c.has(p + ".warmup") {
		e.Warmup = spec.Warmup
	}
	if c.has(p+".repeats") && (e.Repeats < 1 || e.Repeats > 1000) {
		c.errAt(p+".repeats", "%d: expected 1 to 1000 repeats", e.Repeats)
	}
	if !c.has(p + ".keepAlive") {
		e.KeepAlive = true
	}
	switch e.Protocol {
	case "":
		e.Protocol = ProtocolAuto
	case ProtocolAuto, ProtocolHTTP1, ProtocolH2C, ProtocolGRPC:
	default:
		names := []string{"auto", "http1", "h2c", "grpc"}
		c.errAt(p+".protocol", "%q: expected one of %s%s", e.Protocol, strings.Join(names, ", "), suggest(string(e.Protocol), names))
	}
	switch {
	case !c.has(p + ".streams"):
		e.Streams = 1
	case e.Streams < 1 || e.Streams > 1000:
		c.errAt(p+".streams", "%d: want 1..1000 requests in flight per connection", e.Streams)
	case e.Streams > 1 && e.Protocol == ProtocolHTTP1:
		c.errAt(p+".streams", "HTTP/1.1 carries one request at a time per connection: streams needs protocol h2c or grpc")
	case e.Streams > 1 && !e.KeepAlive:
		c.errAt(p+".streams", "streams share a connection, which keepAlive: false closes after every request")
	}
	if e.Protocol == ProtocolGRPC && !e.KeepAlive {
		c.errAt(p+".keepAlive", "gRPC clients keep their channel open: a channel per call would measure channel setup")
	}
	switch e.Path {
	case "":
		e.Path = PathInternal
	case PathInternal, PathIngress:
	default:
		c.errAt(p+".path", "%q: expected internal (straight to the entry service) or ingress (through the ingress gateway)%s", e.Path, suggest(string(e.Path), []string{"internal", "ingress"}))
	}
	switch e.Arrival {
	case "", ArrivalConstant, ArrivalPoisson:
	default:
		c.errAt(p+".arrival", "%q: expected constant or poisson%s", e.Arrival, suggest(string(e.Arrival), []string{"constant", "poisson"}))
	}
	if c.has(p+".duration") && e.Duration == 0 {
		c.errAt(p+".duration", "must be above 0s")
	}
	if e.Duration > 0 && e.Warmup >= e.Duration {
		where := p + ".warmup"
		if !c.has(where) {
			where = p + ".duration"
		}
		c.errAt(where, "warm-up %s is not shorter than the duration %s", e.Warmup, e.Duration)
	}
	if c.has(p+".requests") && e.Requests < 1 {
		c.errAt(p+".requests", "%d: must be at least 1", e.Requests)
	}
	seen := map[int]bool{}
	for i, n := range e.Connections {
		switch {
		case n < 1 || n > 100000:
			c.errAt(fmt.Sprintf("%s.connections[%d]", p, i), "%d: expected 1 to 100000 connections", n)
		case seen[n]:
			c.errAt(fmt.Sprintf("%s.connections[%d]", p, i), "%d appears twice", n)
		}
		seen[n] = true
	}
}

func (c *checker) needDuration(p string, e *Experiment) {
	if !c.has(p + ".duration") {
		c.errAt(p+".duration", "missing: how long to measure, like \"60s\"")
	}
}

func (c *checker) singleConnections(p string, e *Experiment) {
	switch len(e.Connections) {
	case 0:
		e.Connections = IntList{defaultConnections}
	case 1:
	default:
		c.errAt(p+".connections", "kind %s takes one connection count; use kind connections to sweep", e.Kind)
	}
}

func (c *checker) capacity(p string, e *Experiment) {
	if e.Search == nil && len(e.Connections) == 0 {
		c.errAt(p, "a capacity experiment needs connections (a closed-loop sweep) or search (an SLO-bounded rate search), or both")
	}
	switch e.CapacityBy {
	case "":
		e.CapacityBy = CapacityOpenLoop
	case CapacityOpenLoop:
	case CapacityClosedLoop:
		if len(e.Connections) == 0 {
			c.errAt(p+".connections", "missing: capacity: closed-loop is the best throughput of a closed-loop sweep over these connection counts")
		}
		if e.Search != nil {
			c.errAt(p+".search", "a rate search finds an open-loop capacity; with capacity: closed-loop it would not be used (remove one of them)")
		}
	default:
		c.errAt(p+".capacity", "%q: want %s (the highest open-loop rate the target sustains under the SLO, the default) or %s (the best closed-loop throughput)",
			e.CapacityBy, CapacityOpenLoop, CapacityClosedLoop)
	}
	if !c.has(p+".duration") && e.Requests == 0 {
		c.errAt(p+".duration", "missing: how long each point runs, like \"30s\"")
	}
	s := e.Search
	if s == nil {
		return
	}
	sp := p + ".search"
	if c.s.Spec.SLO == nil {
		c.errAt(sp, "a rate search needs spec.slo to know when a rate is too high")
	}
	if s.Start <= 0 {
		c.errAt(sp+".start", "missing or not above 0: the first rate to try, in requests per second")
	}
	if s.Max <= s.Start {
		c.errAt(sp+".max", "%v: must be above start (%v)", s.Max, s.Start)
	}
	if !c.has(sp + ".precision") {
		s.Precision = 5
	} else if s.Precision <= 0 || s.Precision > 50 {
		c.errAt(sp+".precision", "%s: expected above 0%% and at most 50%%", s.Precision)
	}
	if len(e.Connections) == 0 {
		e.Connections = IntList{defaultConnections}
	}
	if len(e.Connections) > 1 {
		// A sweep and a search share the connections field; the search uses the first.
		c.s.Warnings = append(c.s.Warnings, fmt.Sprintf("%s: the rate search uses %d connections, the first count of the sweep", p, e.Connections[0]))
	}
}

// maxSteps bounds a steps experiment; more points than this is almost always a
// unit mistake (a step of 1 instead of 100).
const maxSteps = 1000

func (c *checker) steps(p string, e *Experiment) {
	for _, f := range []struct {
		name string
		v    float64
	}{{"from", e.From}, {"to", e.To}, {"step", e.Step}} {
		if !c.has(p + "." + f.name) {
			c.errAt(p+"."+f.name, "missing: steps needs from, to and step (requests per second) and each (duration)")
		} else if f.v <= 0 {
			c.errAt(p+"."+f.name, "%v: must be above 0", f.v)
		}
	}
	if e.From > 0 && e.To > 0 && e.To < e.From {
		c.errAt(p+".to", "%v is below from (%v)", e.To, e.From)
	}
	if e.Step > 0 && e.To >= e.From && (e.To-e.From)/e.Step+1 > maxSteps {
		c.errAt(p+".step", "%v gives more than %d steps from %v to %v", e.Step, maxSteps, e.From, e.To)
	}
	if !c.has(p + ".each") {
		c.errAt(p+".each", "missing: how long each step runs, like \"60s\"")
	} else if e.Each == 0 {
		c.errAt(p+".each", "must be above 0s")
	} else if e.Warmup >= e.Each {
		// The warm-up is the first part of the first step.
		where := p + ".warmup"
		if !c.has(where) {
			where = p + ".each"
		}
		c.errAt(where, "warm-up %s is not shorter than each step (%s)", e.Warmup, e.Each)
	}
}

// StepRates returns the rates of a steps experiment, from From to To inclusive.
func (e *Experiment) StepRates() []float64 {
	if e.Kind != KindSteps || e.Step <= 0 || e.To < e.From {
		return nil
	}
	var out []float64
	for i := 0; ; i++ {
		r := e.From + float64(i)*e.Step
		if r > e.To*(1+1e-9) || i >= maxSteps {
			return out
		}
		out = append(out, r)
	}
}

func (c *checker) users(p string, e *Experiment) {
	if e.Users < 1 {
		c.errAt(p+".users", "missing or below 1: how many simulated users")
	}
	if !c.has(p + ".spawnRate") {
		e.SpawnRate = float64(e.Users) // all users at once unless told otherwise
	} else if e.SpawnRate <= 0 {
		c.errAt(p+".spawnRate", "%v: users started per second must be above 0", e.SpawnRate)
	}
	if c.has(p+".requestsPerUser") && e.RequestsPerUser < 1 {
		c.errAt(p+".requestsPerUser", "%d: must be at least 1", e.RequestsPerUser)
	}
	if !c.has(p+".duration") && e.RequestsPerUser == 0 {
		c.errAt(p+".duration", "missing: give a duration, requestsPerUser, or both")
	}
	if len(e.Tasks) == 0 {
		c.errAt(p+".tasks", "missing: list what each user does, like [{path: /productpage}]")
	}
	names := map[string]bool{}
	for i := range e.Tasks {
		t, tp := &e.Tasks[i], fmt.Sprintf("%s.tasks[%d]", p, i)
		if !strings.HasPrefix(t.Path, "/") {
			c.errAt(tp+".path", "%q: an HTTP path must start with /", t.Path)
		}
		if t.Method == "" {
			t.Method = "GET"
		} else if !slices.Contains([]string{"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD"}, t.Method) {
			c.errAt(tp+".method", "%q: expected GET, POST, PUT, DELETE, PATCH or HEAD", t.Method)
		}
		if !c.has(tp + ".weight") {
			t.Weight = 1
		} else if t.Weight < 1 {
			c.errAt(tp+".weight", "%d: must be at least 1", t.Weight)
		}
		if t.Name == "" {
			t.Name = strings.ToLower(t.Method) + " " + t.Path
		}
		if names[t.Name] {
			c.errAt(tp+".name", "%q is already the name of another task", t.Name)
		}
		names[t.Name] = true
	}
}

// rateReference checks that a relative rate names an earlier capacity experiment,
// defaulting to the closest one before it.
func (c *checker) rateReference(p string, e *Experiment, index map[string]int, badKind bool) {
	if c.failed[p+".rate"] {
		return // the rate could not be read, so whether it needs a capacity is unknown
	}
	if !e.Rate.IsRelative() {
		if e.CapacityFrom != "" {
			c.errAt(p+".capacityFrom", "only a relative rate (like \"75%% of lowest capacity\") refers to a capacity experiment")
		}
		return
	}
	self := index[e.Name]
	if e.CapacityFrom == "" {
		for j := self - 1; j >= 0; j-- {
			if c.s.Spec.Experiments[j].Kind == KindCapacity {
				e.CapacityFrom = c.s.Spec.Experiments[j].Name
				return
			}
		}
		if !badKind {
			c.errAt(p+".rate", "%q refers to a capacity, but no capacity experiment comes before this one", e.Rate)
		}
		return
	}
	j, ok := index[e.CapacityFrom]
	switch {
	case !ok || j == self:
		var earlier []string
		for _, x := range c.s.Spec.Experiments[:self] {
			earlier = append(earlier, x.Name)
		}
		if ok {
			c.errAt(p+".capacityFrom", "%q is this experiment itself", e.CapacityFrom)
		} else if later := c.s.Experiment(e.CapacityFrom); later != nil {
			c.errAt(p+".capacityFrom", "%q comes after this experiment; capacity must be measured first", e.CapacityFrom)
		} else {
			c.errAt(p+".capacityFrom", "%q is not an earlier experiment%s", e.CapacityFrom, suggest(e.CapacityFrom, earlier))
		}
	case c.s.Spec.Experiments[j].Kind != KindCapacity:
		c.errAt(p+".capacityFrom", "%q is a %s experiment, not a capacity one", e.CapacityFrom, c.s.Spec.Experiments[j].Kind)
	}
}

// security checks a security experiment: which probes, how much traffic to capture.
func (c *checker) security(p string, e *Experiment) {
	for _, f := range loadFields {
		if c.has(p + "." + f) {
			c.errAt(p+"."+f, "not used by kind security (it sends its own probe traffic; it takes requests, probes)")
		}
	}
	if !c.has(p + ".requests") {
		e.Requests = defaultSecurityRequests
	} else if e.Requests < 1 || e.Requests > 10000 {
		c.errAt(p+".requests", "%d: want 1..10000 requests to capture", e.Requests)
	}
	seen := map[string]bool{}
	for i, name := range e.Probes {
		switch {
		case !slices.Contains(results.SecurityProbes, name):
			c.errAt(fmt.Sprintf("%s.probes[%d]", p, i), "%q: expected one of %s%s", name, strings.Join(results.SecurityProbes, ", "), suggest(name, results.SecurityProbes))
		case seen[name]:
			c.errAt(fmt.Sprintf("%s.probes[%d]", p, i), "%q is listed twice", name)
		}
		seen[name] = true
	}
	if c.has(p+".probes") && len(e.Probes) == 0 {
		c.errAt(p+".probes", "empty: leave it out to run every probe (%s)", strings.Join(results.SecurityProbes, ", "))
	}
	if len(e.Probes) == 0 {
		e.Probes = slices.Clone(results.SecurityProbes)
	}
}

func kindNames() []string {
	out := make([]string, len(ExperimentKinds))
	for i, k := range ExperimentKinds {
		out[i] = string(k)
	}
	return out
}

func kindList() string { return strings.Join(kindNames(), ", ") }
