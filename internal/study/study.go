// Package study owns the study file: the YAML document that says which workload runs
// under which meshes, which experiments drive it, how often and in what order. It
// parses and validates the file (every error names file:line:column and the field),
// fills in defaults, prints the normalised form, and expands a study into the ordered
// list of trials the runner executes. The JSON Schema in schema/study.schema.json is
// checked against these types by this package's tests.
package study

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/meshmark/meshmark/internal/mesh"
	_ "github.com/meshmark/meshmark/internal/mesh/meshes" // the registry behind KnownProfiles
	"github.com/meshmark/meshmark/internal/mesh/none"
	"gopkg.in/yaml.v3"
)

// APIVersion and Kind identify a study document.
const (
	APIVersion = "meshmark.dev/v1alpha1"
	Kind       = "Study"
)

// Study is one parsed and normalised study file.
type Study struct {
	APIVersion string   `yaml:"apiVersion"`
	Kind       string   `yaml:"kind"`
	Metadata   Metadata `yaml:"metadata"`
	Spec       Spec     `yaml:"spec"`

	// File is the path the study was read from ("builtin:demo" for embedded ones).
	File string `yaml:"-"`
	// Dir is the directory relative paths in the study (the workload graph, the
	// results directory) are resolved against; empty for embedded studies.
	Dir string `yaml:"-"`
	// Warnings are problems that do not stop a run but will skew its numbers.
	Warnings []string `yaml:"-"`

	// positions maps field paths to where they were written, for ErrorAt.
	positions map[string]position
}

type position struct{ line, column int }

// IngressExperiment is the index of the first experiment that takes the ingress path,
// or -1 when none does (and no ingress gateway is needed).
func (s *Study) IngressExperiment() int {
	for i, e := range s.Spec.Experiments {
		if e.Path == PathIngress {
			return i
		}
	}
	return -1
}

// ErrorAt locates a problem found after parsing (a mesh option the profile rejects,
// say) at the field that caused it, or at its closest written ancestor:
// st.ErrorAt("spec.meshes[1].options", err) gives
// "study.yaml:14:16: spec.meshes[1].options: <err>". The result unwraps to err.
func (s *Study) ErrorAt(field string, err error) error {
	e := &FieldError{File: s.File, Field: field, Msg: err.Error(), Err: err}
	for p := field; ; {
		if pos, ok := s.positions[p]; ok {
			e.Line, e.Column = pos.line, pos.column
			break
		}
		i := strings.LastIndexAny(p, ".[")
		if i < 0 {
			break
		}
		p = p[:i]
	}
	return e
}

// Metadata names and describes a study.
type Metadata struct {
	Name        string `yaml:"name"`
	Description string `yaml:"description,omitempty"`
}

// Spec is everything that decides what is measured.
type Spec struct {
	Substrate Substrate `yaml:"substrate"`
	Workload  Workload  `yaml:"workload"`
	Meshes    []Mesh    `yaml:"meshes"`
	// Baseline names the mesh every other mesh is compared against; by default the
	// mesh with profile none.
	Baseline string `yaml:"baseline,omitempty"`
	// Reproduces names the published study (S1 to S5, internal/published) this study
	// reproduces: its report then opens with that study's own tables and its published
	// figures beside the run's.
	Reproduces  string       `yaml:"reproduces,omitempty"`
	Experiments []Experiment `yaml:"experiments"`
	Repeats     int          `yaml:"repeats"`
	// Precision, when set, has the runner add repeats of the last stage a round at a
	// time until the comparisons resolve differences this small, or its budget is
	// spent.
	Precision *Precision `yaml:"precision,omitempty"`
	Order     Order      `yaml:"order"`
	// Seed drives the interleaved order; by default derived from metadata.name so
	// that the same study always runs in the same order.
	Seed                  uint64 `yaml:"seed"`
	FreshBringUpPerRepeat bool   `yaml:"freshBringUpPerRepeat"`
	// KeepMeshesUp brings every mesh up once per stage and keeps them all up together
	// until the stage ends (each in its own testbed, or on Kubernetes its own
	// namespace), so that interleaved trials switch meshes without a bring-up between
	// them. On Kubernetes at most one of the meshes may install anything.
	KeepMeshesUp bool     `yaml:"keepMeshesUp"`
	Warmup       Duration `yaml:"warmup"`
	SLO          *SLO     `yaml:"slo,omitempty"`
	Results      *Results `yaml:"results,omitempty"`
}

// Precision is a target for the run's sensitivity (docs/report.md): per latency
// metric, the half-width of the comparisons' Δ% interval to reach.
type Precision struct {
	P50  Percent `yaml:"p50,omitempty"`
	P90  Percent `yaml:"p90,omitempty"`
	P99  Percent `yaml:"p99,omitempty"`
	P999 Percent `yaml:"p999,omitempty"`
	// Budget is the most time the added rounds may take (default 10m); a round that
	// would not fit is not started.
	Budget Duration `yaml:"budget,omitempty"`
}

// Targets lists the metrics asked for, as the analysis names them, with their targets
// in percent.
func (p *Precision) Targets() []PrecisionTarget {
	var out []PrecisionTarget
	for _, t := range []PrecisionTarget{{"p50", float64(p.P50)}, {"p90", float64(p.P90)}, {"p99", float64(p.P99)}, {"p99.9", float64(p.P999)}} {
		if t.Pct > 0 {
			out = append(out, t)
		}
	}
	return out
}

// PrecisionTarget is one metric's target.
type PrecisionTarget struct {
	Metric string
	Pct    float64
}

// Substrate says where the study runs; exactly one member is set.
type Substrate struct {
	Local      *LocalSubstrate      `yaml:"local,omitempty"`
	Kubernetes *KubernetesSubstrate `yaml:"kubernetes,omitempty"`
}

// Name is the spec.substrate key the study sets (local when it sets none), which is
// the substrate a platform registers for.
func (s Substrate) Name() string {
	if s.Kubernetes != nil {
		return "kubernetes"
	}
	return "local"
}

// LocalSubstrate is one Linux machine with network namespaces as pods.
type LocalSubstrate struct {
	// Nodes is how many simulated nodes (bridges) the pods are spread over.
	Nodes int `yaml:"nodes"`
	// LoadgenNode is the 0-based index of the node that hosts the load generator.
	LoadgenNode  int           `yaml:"loadgenNode"`
	CPUPlacement *CPUPlacement `yaml:"cpuPlacement,omitempty"`
	// CPUIdle is how idle CPUs wait while trials measure: CPUIdlePoll (the default) or
	// CPUIdleOS.
	CPUIdle CPUIdle `yaml:"cpuIdle,omitempty"`
}

// CPUIdle says how the machine's idle CPUs wait during a run.
type CPUIdle string

const (
	// CPUIdlePoll keeps idle CPUs polling instead of entering a sleep state (a PM QoS
	// request of 0 µs on /dev/cpu_dma_latency, as cyclictest and tuned's
	// latency-performance profile make), for as long as meshmark holds it open. A
	// sleeping CPU, and in a virtual machine a halted vCPU the hypervisor must schedule
	// again, wakes for each request tens of microseconds late, by an amount that changes
	// from second to second: on this project's KVM guest a one-hop p50 jumped from 80 to
	// 165 µs mid-trial and stayed there. The kernel drops the request when the descriptor
	// closes, so nothing outlives the run, however it ends.
	CPUIdlePoll CPUIdle = "poll"
	// CPUIdleOS leaves idle CPUs to the kernel's idle governor.
	CPUIdleOS CPUIdle = "os"
)

// CPUPlacement pins the load generator and the system under test to CPU lists in
// cpuset syntax ("0", "1-3", "0,2").
type CPUPlacement struct {
	Loadgen CPUList `yaml:"loadgen"`
	SUT     CPUList `yaml:"sut"`
}

// KubernetesSubstrate is a real cluster driven through its API server.
type KubernetesSubstrate struct {
	Kubeconfig          string            `yaml:"kubeconfig,omitempty"`
	Context             string            `yaml:"context,omitempty"`
	NamespacePrefix     string            `yaml:"namespacePrefix"`
	LoadgenNodeSelector map[string]string `yaml:"loadgenNodeSelector,omitempty"`
	SUTNodeSelector     map[string]string `yaml:"sutNodeSelector,omitempty"`
	Cleanup             bool              `yaml:"cleanup"`
	// Image is the meshmark image the workload and load generators run (see
	// `meshmark image build`); required to deploy anything.
	Image string `yaml:"image,omitempty"`
	// Generators is how many load-generator pods share the load, spread over the
	// load-generator nodes; default 1.
	Generators int `yaml:"generators,omitempty"`
	// ReadyTimeout bounds each wait for the cluster: a mesh's charts to be ready, the
	// workload's pods to be ready, namespaces to go; default 5 minutes. A pod the
	// cluster says cannot get ready (an image that cannot be pulled, no node to take it)
	// ends the wait at once, whatever it is.
	ReadyTimeout Duration `yaml:"readyTimeout,omitempty"`
}

// DefaultReadyTimeout is KubernetesSubstrate.ReadyTimeout's default.
const DefaultReadyTimeout = Duration(5 * time.Minute)

// Workload is the service graph under test.
type Workload struct {
	// Graph is a built-in graph name (see workload.BuiltinNames: bookinfo,
	// emojivoto, online-boutique, teastore, chain-N, fanout-N) or a graph file path relative to the study file.
	Graph string `yaml:"graph"`
	// Replicas overrides the number of pods of each version of a service.
	Replicas map[string]int `yaml:"replicas,omitempty"`
	// Entrypoint is the HTTP path load is sent to; empty means the graph's own.
	Entrypoint string `yaml:"entrypoint,omitempty"`
}

// IsGraphFile reports whether Graph names a file rather than a built-in graph.
func (w Workload) IsGraphFile() bool { return looksLikePath(w.Graph) }

// Mesh is one configuration under test.
type Mesh struct {
	// Name is the label results carry; unique within the study.
	Name string `yaml:"name"`
	// Profile is the mesh implementation (see KnownProfiles).
	Profile string `yaml:"profile"`
	// Options are passed to the profile, which validates them when it is set up.
	Options map[string]any `yaml:"options,omitempty"`
}

// Experiment is one kind of load applied to every mesh.
type Experiment struct {
	Name string         `yaml:"name"`
	Kind ExperimentKind `yaml:"kind"`

	Duration Duration `yaml:"duration,omitempty"`
	Warmup   Duration `yaml:"warmup"`
	// Repeats, when set, replaces spec.repeats for this experiment: a capacity stage
	// needs a few repeats where a latency stage of short paired blocks wants many.
	Repeats int `yaml:"repeats,omitempty"`
	// Requests stops a closed-loop run after this many requests (oha -n).
	Requests    int     `yaml:"requests,omitempty"`
	Connections IntList `yaml:"connections,omitempty"`
	KeepAlive   bool    `yaml:"keepAlive"`
	// Protocol is how the load generator talks to the entry service (ProtocolAuto:
	// the protocol the graph gives that service).
	Protocol ClientProtocol `yaml:"protocol,omitempty"`
	// Streams is how many requests share one connection (HTTP/2 and gRPC).
	Streams int     `yaml:"streams,omitempty"`
	Path    Path    `yaml:"path"`
	Arrival Arrival `yaml:"arrival,omitempty"`

	// Rate is the open-loop request rate (fixed-rate, soak, connections).
	Rate Rate `yaml:"rate,omitempty"`
	// CapacityFrom names the earlier capacity experiment a relative Rate refers to.
	CapacityFrom string `yaml:"capacityFrom,omitempty"`

	// Search is the SLO-bounded open-loop rate search of a capacity experiment.
	Search *Search `yaml:"search,omitempty"`
	// CapacityBy says what a capacity experiment reports as the capacity (the one
	// relative rates take a share of): CapacityOpenLoop (the default) or
	// CapacityClosedLoop.
	CapacityBy CapacityBasis `yaml:"capacity,omitempty"`

	// From, To, Step and Each describe a steps experiment (rates in requests/s).
	From float64  `yaml:"from,omitempty"`
	To   float64  `yaml:"to,omitempty"`
	Step float64  `yaml:"step,omitempty"`
	Each Duration `yaml:"each,omitempty"`

	// Users, SpawnRate, ThinkTime, RequestsPerUser and Tasks describe a users
	// (Locust-like) experiment.
	Users           int           `yaml:"users,omitempty"`
	SpawnRate       float64       `yaml:"spawnRate,omitempty"`
	ThinkTime       DurationRange `yaml:"thinkTime,omitempty"`
	RequestsPerUser int           `yaml:"requestsPerUser,omitempty"`
	Tasks           []Task        `yaml:"tasks,omitempty"`

	// Probes are the security probes a security experiment runs (all when empty);
	// Requests is then how many requests cross the app while the wire is captured.
	Probes []string `yaml:"probes,omitempty"`
}

// RepeatsOf is how many repeats experiment e runs: its own repeats, or the study's.
func (spec *Spec) RepeatsOf(e *Experiment) int {
	if e.Repeats > 0 {
		return e.Repeats
	}
	return spec.Repeats
}

// Search finds the highest open-loop rate that still meets the SLO, by bisection
// between Start and Max until the bracket is narrower than Precision.
type Search struct {
	Start     float64 `yaml:"start"`
	Max       float64 `yaml:"max"`
	Precision Percent `yaml:"precision"`
}

// CapacityBasis is how a capacity experiment measures the capacity it reports.
type CapacityBasis string

const (
	// CapacityOpenLoop: the highest open-loop rate that meets the SLO with the target
	// in steady state (not saturated), found by Search; without one, by a search
	// between 80% and 100% of the closed-loop sweep's best throughput. Every rate
	// below it was sustained, not just served for a while.
	CapacityOpenLoop CapacityBasis = "open-loop"
	// CapacityClosedLoop: the best throughput of the closed-loop sweep over
	// Connections. A closed loop slows its sending to what the target answers, so this
	// is the rate at the knee, where latency is already climbing: a rate of 75% of it
	// may still saturate a target whose capacity varies between bring-ups.
	CapacityClosedLoop CapacityBasis = "closed-loop"
)

// Task is one weighted action of a simulated user.
type Task struct {
	Name   string `yaml:"name"`
	Method string `yaml:"method"`
	Path   string `yaml:"path"`
	Weight int    `yaml:"weight"`
}

// SLO bounds latency percentiles and the error rate; capacity searches and
// reports judge runs against it.
type SLO struct {
	P50       Duration `yaml:"p50,omitempty"`
	P90       Duration `yaml:"p90,omitempty"`
	P95       Duration `yaml:"p95,omitempty"`
	P99       Duration `yaml:"p99,omitempty"`
	P999      Duration `yaml:"p999,omitempty"`
	ErrorRate Percent  `yaml:"errorRate,omitempty"`
}

// Bounds is the SLO meshmark judges by (analysis.SLO): the study's bounds, its error
// rate (none allowed when it sets none), and the default SLO's served share of the
// requested rate and knee factor, which a study does not set. Without spec.slo (s is
// nil), the default SLO. It is the one place a study's SLO becomes the one the runner's
// capacity search and the analysis both judge by.
func (s *SLO) Bounds() analysis.SLO {
	b := analysis.DefaultSLO()
	if s == nil {
		return b
	}
	b.P50, b.P90, b.P95, b.P99, b.P999 = s.P50.D(), s.P90.D(), s.P95.D(), s.P99.D(), s.P999.D()
	b.MaxErrorRate = s.ErrorRate.Fraction()
	return b
}

// Results overrides where results are stored.
type Results struct {
	// Dir is relative to the study file unless absolute.
	Dir string `yaml:"dir,omitempty"`
}

// ExperimentKind names what an experiment does.
type ExperimentKind string

const (
	KindCapacity    ExperimentKind = "capacity"
	KindFixedRate   ExperimentKind = "fixed-rate"
	KindSteps       ExperimentKind = "steps"
	KindSoak        ExperimentKind = "soak"
	KindUsers       ExperimentKind = "users"
	KindConnections ExperimentKind = "connections"
	// KindSecurity probes what the mesh promises instead of loading it: encryption on
	// the wire, plaintext refused, authorization, bypass, identity (internal/security).
	KindSecurity ExperimentKind = "security"
)

// ExperimentKinds lists every kind, in the order the documentation presents them.
var ExperimentKinds = []ExperimentKind{KindCapacity, KindFixedRate, KindSteps, KindSoak, KindUsers, KindConnections, KindSecurity}

// Order is how repeats of different meshes are arranged in time.
type Order string

const (
	// Interleaved runs each repeat as a block holding every mesh once, in a seeded
	// random order, so drift on the machine hits every mesh alike.
	Interleaved Order = "interleaved"
	// Sequential runs all repeats of one mesh before the next mesh.
	Sequential Order = "sequential"
)

// Path is where load enters the application.
type Path string

const (
	PathInternal Path = "internal" // straight to the entry service
	PathIngress  Path = "ingress"  // through the mesh's ingress gateway
)

// Arrival is the open-loop arrival process.
type Arrival string

const (
	ArrivalConstant Arrival = "constant"
	ArrivalPoisson  Arrival = "poisson"
)

// KnownProfiles are the mesh profile names a study may use: the profile registry's,
// so that validate accepts exactly what run can do.
func KnownProfiles() []string { return mesh.Names() }

// ClientProtocol is the load generator's protocol.
type ClientProtocol string

const (
	ProtocolAuto  ClientProtocol = "auto"
	ProtocolHTTP1 ClientProtocol = "http1"
	ProtocolH2C   ClientProtocol = "h2c"
	ProtocolGRPC  ClientProtocol = "grpc"
)

// ProfileNone is the no-mesh baseline profile.
const ProfileNone = none.Name

// ClosedLoop reports whether the experiment drives load with a fixed number of
// connections sending as fast as they can, rather than at an intended rate.
func (e *Experiment) ClosedLoop() bool {
	switch e.Kind {
	case KindCapacity:
		return e.Search == nil
	case KindConnections:
		return e.Rate.IsZero()
	}
	return false
}

// Experiment returns the experiment with the given name, or nil.
func (s *Study) Experiment(name string) *Experiment {
	for i := range s.Spec.Experiments {
		if s.Spec.Experiments[i].Name == name {
			return &s.Spec.Experiments[i]
		}
	}
	return nil
}

// Mesh returns the mesh with the given name, or nil.
func (s *Study) Mesh(name string) *Mesh {
	for i := range s.Spec.Meshes {
		if s.Spec.Meshes[i].Name == name {
			return &s.Spec.Meshes[i]
		}
	}
	return nil
}

// BaselineMesh returns the mesh others are compared against, or nil when the study
// has a single mesh and no baseline.
func (s *Study) BaselineMesh() *Mesh { return s.Mesh(s.Spec.Baseline) }

// Resolve returns a path written in the study as a path usable from the current
// directory: absolute paths and paths in embedded studies stay as they are, others
// are taken relative to the study file. Printing keeps paths as written, so a
// printed study parses back to the same study.
func (s *Study) Resolve(path string) string {
	if path == "" || filepath.IsAbs(path) || s.Dir == "" {
		return path
	}
	return filepath.Join(s.Dir, path)
}

// Marshal prints the normalised study as YAML, with every default visible.
func (s *Study) Marshal() ([]byte, error) {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(s); err != nil {
		return nil, fmt.Errorf("printing study %s: %w", s.Metadata.Name, err)
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// ParseFile reads and parses a study file.
func ParseFile(path string) (*Study, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading study: %w", err)
	}
	return Parse(path, data)
}

// Load parses a study file, or the built-in study of that name when no such file
// exists (so `meshmark run demo` works from any directory).
func Load(nameOrPath string) (*Study, error) {
	_, statErr := os.Stat(nameOrPath)
	if statErr != nil && isBuiltin(nameOrPath) {
		return Builtin(nameOrPath)
	}
	if os.IsNotExist(statErr) {
		return nil, fmt.Errorf("%s: no such study file, and no built-in study of that name (built-in: %s)", nameOrPath, strings.Join(BuiltinNames(), ", "))
	}
	return ParseFile(nameOrPath)
}

// MarshalYAML prints a security experiment with its own fields only: the load fields
// every other kind prints with their defaults mean nothing to it, and the parser
// refuses them there.
func (e Experiment) MarshalYAML() (any, error) {
	if e.Kind != KindSecurity {
		type plain Experiment // no methods: no recursion
		return plain(e), nil
	}
	return struct {
		Name     string         `yaml:"name"`
		Kind     ExperimentKind `yaml:"kind"`
		Requests int            `yaml:"requests,omitempty"`
		Probes   []string       `yaml:"probes,omitempty"`
	}{e.Name, e.Kind, e.Requests, e.Probes}, nil
}
