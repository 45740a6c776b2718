// Package results owns meshmark's result model: what one run of a study produced
// (runs, meshes, trials, histograms, samples, provenance). It is shared by the study
// runner that fills it, the store that keeps it and the analysis and reports that read
// it. Latency histograms hold microseconds; they live in memory as
// *hdrhistogram.Histogram and are serialised losslessly in the HdrHistogram V2
// compressed encoding (base64), both in the store and in JSON exports.
package results

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Status is the life-cycle state of a run.
type Status string

const (
	// StatusRunning means a live process (OwnerPID) is still writing trials.
	StatusRunning Status = "running"
	// StatusComplete means every planned trial finished and the run was closed.
	StatusComplete Status = "complete"
	// StatusIncomplete means the run stopped early (killed, crashed, interrupted); the
	// trials it committed are intact and usable.
	StatusIncomplete Status = "incomplete"
	// StatusFailed means the run ended with an error (for example an equivalence check
	// failed or the substrate could not come up).
	StatusFailed Status = "failed"
)

// Valid reports whether s is one of the known statuses.
func (s Status) Valid() bool {
	switch s {
	case StatusRunning, StatusComplete, StatusIncomplete, StatusFailed:
		return true
	}
	return false
}

// Histogram geometry shared by every latency-like histogram meshmark records: 1 µs
// resolution up to one minute, three significant digits. Merging histograms with the
// same geometry is exact, which is why everyone should use NewLatencyHistogram.
const (
	HistogramLowest      = 1
	HistogramHighest     = int64(60 * time.Second / time.Microsecond)
	HistogramSigFigs     = 3
	HistogramUnit        = time.Microsecond
	HistogramUnitSymbol  = "µs"
	histogramEncodingTag = hdrhistogram.V2CompressedEncodingCookieBase
)

// NewLatencyHistogram returns an empty histogram with meshmark's standard geometry
// (values in microseconds).
func NewLatencyHistogram() *hdrhistogram.Histogram {
	return hdrhistogram.New(HistogramLowest, HistogramHighest, HistogramSigFigs)
}

// Micros converts a duration to the histogram unit, clamped to the trackable range so
// that a stall longer than a minute is recorded as a minute instead of dropped.
func Micros(d time.Duration) int64 {
	v := int64(d / HistogramUnit)
	if v < HistogramLowest {
		return HistogramLowest
	}
	if v > HistogramHighest {
		return HistogramHighest
	}
	return v
}

// Duration converts a histogram value (µs) back to a duration.
func Duration(v int64) time.Duration { return time.Duration(v) * HistogramUnit }

// Run is one execution of a study file.
type Run struct {
	ID           string     `json:"id"`
	Study        string     `json:"study"`
	StudyPath    string     `json:"study_path,omitempty"`
	StudyFile    []byte     `json:"study_file,omitempty"`
	Status       Status     `json:"status"`
	StatusReason string     `json:"status_reason,omitempty"`
	Started      time.Time  `json:"started"`
	Ended        time.Time  `json:"ended,omitzero"`
	Seed         int64      `json:"seed"`
	OwnerPID     int        `json:"owner_pid,omitempty"`
	OwnerHost    string     `json:"owner_host,omitempty"`
	Substrate    string     `json:"substrate,omitempty"`
	Provenance   Provenance `json:"provenance"`
	// Baseline is the label of the mesh every other mesh is compared against (usually
	// the "none" profile). Empty means analysis picks the first mesh whose profile is
	// "none", or else the first mesh.
	Baseline string  `json:"baseline,omitempty"`
	Meshes   []Mesh  `json:"meshes"`
	Trials   []Trial `json:"trials,omitempty"`
}

// BaselineProfile is the profile of the no-mesh baseline, the registry's none (a test
// there holds the two together): the store is below the mesh registry, and a stored
// run is read without it.
const BaselineProfile = "none"

// MemoryMeasure names what the memory of the run's resource samples (RSSBytes) is:
// each process's resident set size on the local substrate, each container's working
// set on a cluster, which is what its kubelet reports; PSS is measured locally only.
func (r *Run) MemoryMeasure() string {
	if r.Substrate == "kubernetes" {
		return "working set"
	}
	return "RSS"
}

// Mesh returns the mesh with the given label, or nil.
func (r *Run) Mesh(label string) *Mesh {
	for i := range r.Meshes {
		if r.Meshes[i].Label == label {
			return &r.Meshes[i]
		}
	}
	return nil
}

// BaselineLabel resolves which mesh is the baseline (see Run.Baseline).
func (r *Run) BaselineLabel() string {
	if r.Baseline != "" {
		return r.Baseline
	}
	for _, m := range r.Meshes {
		if m.Profile == BaselineProfile {
			return m.Label
		}
	}
	if len(r.Meshes) > 0 {
		return r.Meshes[0].Label
	}
	return ""
}

// Provenance is everything needed to trace a number back to where it came from.
type Provenance struct {
	Hostname        string `json:"hostname,omitempty"`
	Kernel          string `json:"kernel,omitempty"`
	OS              string `json:"os,omitempty"`
	CPUModel        string `json:"cpu_model,omitempty"`
	Cores           int    `json:"cores,omitempty"`
	MemoryBytes     int64  `json:"memory_bytes,omitempty"`
	MeshmarkVersion string `json:"meshmark_version,omitempty"`
	GoVersion       string `json:"go_version,omitempty"`
	// Components maps a component (envoy, haproxy, kernel module, helm chart, ...) to
	// its version string.
	Components map[string]string `json:"components,omitempty"`
	// Placement maps a component or role (load generator, proxy of pod X, node Y) to
	// where it ran: a CPU set, a node name.
	Placement map[string]string `json:"placement,omitempty"`
	Configs   []GeneratedConfig `json:"configs,omitempty"`
	// Cluster is the Kubernetes cluster a run measured on; the fields above then
	// describe the machine meshmark ran on, which drove the cluster.
	Cluster *ClusterProvenance `json:"cluster,omitempty"`
}

// ClusterProvenance is the Kubernetes cluster a run measured on, as its API server
// describes it, and the images its pods ran.
type ClusterProvenance struct {
	Server        string `json:"server"`
	Context       string `json:"context,omitempty"`
	ServerVersion string `json:"server_version"`
	// Nodes are every node of the cluster (their count is the cluster's size).
	Nodes []ClusterNode `json:"nodes"`
	// Images are the images the pods of each mesh's namespaces ran, each with the
	// digest its node resolved it to.
	Images []PodImage `json:"images,omitempty"`
}

// ClusterNode is one node as its kubelet reports it.
type ClusterNode struct {
	Name             string `json:"name"`
	KubeletVersion   string `json:"kubelet_version"`
	OSImage          string `json:"os_image,omitempty"`
	KernelVersion    string `json:"kernel_version,omitempty"`
	ContainerRuntime string `json:"container_runtime,omitempty"`
	Architecture     string `json:"architecture,omitempty"`
	// CPU and Memory are the node's capacity, as Kubernetes quantities ("4", "16Gi").
	CPU    string `json:"cpu,omitempty"`
	Memory string `json:"memory,omitempty"`
}

// PodImage is an image that containers of a mesh's pods ran.
type PodImage struct {
	Mesh      string `json:"mesh"`
	Container string `json:"container"`
	Image     string `json:"image"`
	// ImageID is the image as the node's runtime resolved it (a digest); empty when the
	// kubelet did not report it.
	ImageID string `json:"image_id,omitempty"`
	Pods    int    `json:"pods"`
}

// GeneratedConfig is one configuration file meshmark generated and used (Envoy
// bootstrap, iptables rules, Helm values...), kept in full with its hash.
type GeneratedConfig struct {
	Name      string `json:"name"`
	Mesh      string `json:"mesh,omitempty"`
	Component string `json:"component,omitempty"`
	Content   []byte `json:"content"`
	SHA256    string `json:"sha256"` // hex; filled by NewGeneratedConfig and the store
}

// Mesh is one mesh under test in a run (including the no-mesh baseline).
type Mesh struct {
	Label   string            `json:"label"`
	Profile string            `json:"profile"`
	Options map[string]string `json:"options,omitempty"`
	// Enrollment is the stored equivalence check (mTLS on the wire, pods enrolled,
	// proxy concurrency, ...), as JSON produced by whoever ran the check.
	Enrollment json.RawMessage `json:"enrollment,omitempty"`
}

// Experiment kinds from the study file.
const (
	KindCapacity    = "capacity"
	KindFixedRate   = "fixed-rate"
	KindSteps       = "steps"
	KindSoak        = "soak"
	KindUsers       = "users"
	KindConnections = "connections"
	KindSecurity    = "security"
)

// TrialParams are the load parameters a trial ran with.
type TrialParams struct {
	// RequestedRate is the open-model target in requests/s; 0 for closed-model trials.
	RequestedRate float64 `json:"requested_rate,omitempty"`
	Connections   int     `json:"connections,omitempty"`
	Users         int     `json:"users,omitempty"`
	// Step is the index of this trial within a steps/sweep experiment (0-based); trials
	// of other kinds leave it 0.
	Step      int  `json:"step"`
	KeepAlive bool `json:"keep_alive"`
	// Path says how traffic entered: "internal" (service address) or "ingress".
	Path  string            `json:"path,omitempty"`
	Extra map[string]string `json:"extra,omitempty"`
}

// Trial is one (repeat, mesh, experiment, step) measurement.
type Trial struct {
	// ID is assigned by the store; zero before the trial is stored.
	ID              int64         `json:"id,omitempty"`
	Repeat          int           `json:"repeat"`
	Mesh            string        `json:"mesh"`
	Experiment      string        `json:"experiment"`
	Kind            string        `json:"kind"`
	Params          TrialParams   `json:"params"`
	WarmupTrimmed   time.Duration `json:"warmup_trimmed_ns"`
	CooldownTrimmed time.Duration `json:"cooldown_trimmed_ns,omitempty"`
	// Start and End bound the measured window (after trimming).
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	// Error is set when the trial itself failed; its partial results may still be kept.
	Error  string      `json:"error,omitempty"`
	Result TrialResult `json:"result"`
}

// Duration is the length of the measured window.
func (t *Trial) Duration() time.Duration { return t.End.Sub(t.Start) }

// TrialResult is what one trial measured.
type TrialResult struct {
	// Requests is every request whose intended send time fell in the measured window;
	// Errors is how many of them failed (any kind). Both latency histograms record
	// every request that got an outcome: answered ones at their response, ones that
	// failed without a response (timeout, reset, refused) at their failure.
	Requests int64 `json:"requests"`
	Errors   int64 `json:"errors"`
	// Latency is total latency measured from the intended send time (corrected for
	// coordinated omission), µs.
	Latency *hdrhistogram.Histogram `json:"-"`
	// ServiceTime is latency measured from the actual send time, µs.
	ServiceTime *hdrhistogram.Histogram `json:"-"`
	// AnsweredLatency and FailedLatency are Latency's two parts kept apart: the
	// requests that got a response (any status), and those that failed without one.
	// Trials stored before meshmark timed failures left them out of Latency; read
	// back, their AnsweredLatency is their Latency and FailedLatency is nil.
	AnsweredLatency *hdrhistogram.Histogram `json:"-"`
	FailedLatency   *hdrhistogram.Histogram `json:"-"`
	// Window counts what completed inside the measured window (nil in trials stored
	// before meshmark counted it; Throughput then counts Requests).
	Window *WindowCount `json:"window,omitempty"`
	// Saturation is the evidence on whether the target kept up with an open-loop
	// trial (FlagTargetSaturated when it did not); nil for other trials.
	Saturation   *Saturation      `json:"saturation,omitempty"`
	Intervals    []Interval       `json:"intervals,omitempty"`
	StatusCodes  map[int]int64    `json:"status_codes,omitempty"`
	ErrorsByKind map[string]int64 `json:"errors_by_kind,omitempty"`
	Generator    GeneratorHealth  `json:"generator"`
	Resources    []ResourceSample `json:"resources,omitempty"`
	ProxyStats   []ProxyStats     `json:"proxy_stats,omitempty"`
	// Network is one reading per pod interface per sampling round (cumulative
	// counters, see NetSample).
	Network []NetSample `json:"network,omitempty"`
	// Flags are machine-readable warnings such as FlagGeneratorBehind.
	Flags []string `json:"flags,omitempty"`
	// Faults lists the processes of the system under test that exited during the
	// trial (FlagFault).
	Faults []Fault `json:"faults,omitempty"`
	// Mix is how the requests split among each service's versions (FlagMixSkewed).
	Mix []VersionShare `json:"mix,omitempty"`
	// Security holds a security trial's probe results (kind security only).
	Security []SecurityProbe `json:"security,omitempty"`
}

// WindowCount is what a trial's target served inside the measured window, as opposed
// to the requests intended in it, which a target that fell behind answers after it.
type WindowCount struct {
	// Completed is every request that ended inside the window (answered or failed),
	// whatever its intended time; Succeeded the 2xx part of it.
	Completed int64 `json:"completed"`
	Succeeded int64 `json:"succeeded"`
	// After is the requests intended in the window that ended after it.
	After int64 `json:"after"`
}

// Saturation is the evidence on whether the target kept up with an open-loop trial:
// the backlog (requests due and not answered, in flight at the target or waiting for
// a connection) at the window's start and end (and the smallest in its second half),
// the fewest sends waiting for a connection in its second half, the requests it failed
// as an overloaded target fails them, and the rate it completed against the rate
// intended (load.Saturation has the rules).
type Saturation struct {
	Saturated     bool    `json:"saturated"`
	BacklogFrom   int64   `json:"backlog_from"`
	BacklogTo     int64   `json:"backlog_to"`
	BacklogLow    int64   `json:"backlog_low"`
	WaitingLow    int64   `json:"waiting_low,omitempty"`
	Shed          int64   `json:"shed,omitempty"`      // requests failed as an overloaded target fails them
	Completed     int64   `json:"completed,omitempty"` // requests after warm-up, of which Shed
	IntendedRate  float64 `json:"intended_rate"`
	CompletedRate float64 `json:"completed_rate"`
	// LatencyFromUS and LatencyToUS are the median latency of the window's first and
	// last intervals, µs.
	LatencyFromUS int64 `json:"latency_p50_from_us"`
	LatencyToUS   int64 `json:"latency_p50_to_us"`
	// ConnectStallUS is how long sends inside the window waited while the generator
	// dialed connections the target was slow to accept, ConnectLongestUS the longest
	// such dial, µs: a stall, which a lower rate would not cure.
	ConnectStallUS   int64 `json:"connect_stall_us,omitempty"`
	ConnectLongestUS int64 `json:"connect_longest_us,omitempty"`
}

// String is the evidence in one line, for progress output and reports.
func (s *Saturation) String() string {
	out := ""
	if s.ConnectStallUS > 0 {
		out = fmt.Sprintf("sends waited %v for new connections the target was slow to accept (longest dial %v); ",
			Duration(s.ConnectStallUS).Round(time.Millisecond), Duration(s.ConnectLongestUS).Round(time.Millisecond))
	}
	out += fmt.Sprintf("backlog (in flight or waiting for a connection) %d → %d over the window, completed %.0f of %.0f req/s intended",
		s.BacklogFrom, s.BacklogTo, s.CompletedRate, s.IntendedRate)
	if s.WaitingLow > 0 {
		out += fmt.Sprintf(", ≥ %d sends waiting for a connection throughout its second half", s.WaitingLow)
	}
	if s.Shed > 0 {
		out += fmt.Sprintf(", %d of %d requests failed as an overloaded target fails them (429/503/504/timeout)", s.Shed, s.Completed)
	}
	if s.LatencyToUS > 0 { // zero: nothing completed in any interval of the window
		out += fmt.Sprintf(", p50 %v → %v", Duration(s.LatencyFromUS).Round(10*time.Microsecond), Duration(s.LatencyToUS).Round(10*time.Microsecond))
	}
	return out
}

// MixTolerance is how far (absolute share of a service's requests) a version's share
// may be from its intended share before a trial is flagged FlagMixSkewed.
const MixTolerance = 0.10

// VersionShare is how many requests one version of a service served during a trial
// (its warm-up included), against the share of the service's traffic the graph's
// weights intend for it.
type VersionShare struct {
	Service  string  `json:"service"`
	Version  string  `json:"version"`
	Requests int64   `json:"requests"`
	Share    float64 `json:"share"`
	Intended float64 `json:"intended"`
}

// Fault is a process of the system under test (proxy, workload, control plane) that
// exited while a trial ran: the trial measured something other than the deployment
// it claims to measure. On a cluster it is a container, with no PID, seen ended when
// its kubelet started it again or its pod went.
type Fault struct {
	Pod     string `json:"pod"`
	Process string `json:"process"`
	Role    string `json:"role,omitempty"`
	PID     int    `json:"pid"`
	// At is when the exit was seen; Before is set when the process had already
	// exited when the trial began (At is then the trial's start).
	At     time.Time `json:"at"`
	Before bool      `json:"before,omitempty"`
	// Exit is how it ended ("signal: killed", "exit status 1").
	Exit    string `json:"exit,omitempty"`
	LogPath string `json:"log_path,omitempty"`
	// LogTail is the end of its log.
	LogTail string `json:"log_tail,omitempty"`
}

// String is one line for progress output and reports.
func (f Fault) String() string {
	when := "exited at " + f.At.Format("15:04:05.000")
	if f.Before {
		when = "had exited before the trial began"
	}
	s := fmt.Sprintf("%s/%s (pid %d) %s", f.Pod, f.Process, f.PID, when)
	if f.PID == 0 {
		// A container on a cluster: its kubelet knows it by pod and name, not pid.
		s = fmt.Sprintf("%s/%s %s", f.Pod, f.Process, when)
	}
	if f.Exit != "" {
		s += " (" + f.Exit + ")"
	}
	return s
}

// Flags the runner or analysis may attach to a trial.
const (
	// FlagGeneratorBehind: the load generator itself could not keep to the load (its
	// own CPU, or sends late while the target kept up).
	FlagGeneratorBehind = "generator-behind"
	// FlagTargetSaturated: the system under test could not serve the trial's rate: the
	// requests in flight at it grew through the trial (see TrialResult.Saturation).
	// Its latency is that of a growing queue; verdicts at its point say so.
	FlagTargetSaturated = "target-saturated"
	// FlagBackedOff: a trial at this rate saturated the target, so the runner measured
	// the experiment again, at a lower rate; the trials at this rate are kept and shown
	// but left out like superseded ones.
	FlagBackedOff = "backed-off"
	// FlagProxyBypassed: the mesh's proxies at the entry service counted fewer requests than were
	// answered, so some traffic did not cross the mesh.
	FlagProxyBypassed = "proxy-bypassed"
	FlagOutlier       = "outlier"
	// FlagFault: a process of the system under test exited during the trial (see
	// TrialResult.Faults). The trial is kept and shown but left out of pooled
	// results, capacities and verdicts; the runner measures it again.
	FlagFault = "fault"
	// FlagSuperseded: the trial belongs to an attempt that a fault cut short, and the
	// whole attempt was measured again; left out like a fault trial.
	FlagSuperseded = "superseded"
	// FlagMixSkewed: some service's versions served shares of its requests that differ
	// from the graph's weights by more than the runner's tolerance, so this trial
	// measured different request paths than a trial with the intended mix.
	FlagMixSkewed = "mix-skewed"
	// FlagProxyUnreadable: a mesh proxy could not be read before or after the trial
	// (it crashed or hung), so the trial's evidence that traffic crossed the mesh is
	// incomplete.
	FlagProxyUnreadable = "proxy-unreadable"
)

// Excluded reports whether the trial must be left out of pooled results, capacities
// and verdicts (a fault, or an attempt or rate measured again).
func (r *TrialResult) Excluded() bool {
	return r.HasFlag(FlagFault) || r.HasFlag(FlagSuperseded) || r.HasFlag(FlagBackedOff)
}

// Saturated reports whether the target could not keep up with the trial.
func (r *TrialResult) Saturated() bool {
	return r.HasFlag(FlagTargetSaturated) || (r.Saturation != nil && r.Saturation.Saturated)
}

// Failures is how many requests failed without a response (Errors less the non-2xx
// answers), from ErrorsByKind.
func (r *TrialResult) Failures() int64 {
	var n int64
	for k, v := range r.ErrorsByKind {
		if k != "non2xx" {
			n += v
		}
	}
	return n
}

// Interval is one second (or other fixed slice) of a trial.
type Interval struct {
	Start         time.Time     `json:"start"`
	Duration      time.Duration `json:"duration_ns"`
	RequestedRate float64       `json:"requested_rate"`
	AchievedRate  float64       `json:"achieved_rate"`
	Count         int64         `json:"count"`
	Errors        int64         `json:"errors"`
	// P50 and P99 are computed from Histogram (µs) when the interval is stored.
	P50       int64                   `json:"p50_us"`
	P99       int64                   `json:"p99_us"`
	Histogram *hdrhistogram.Histogram `json:"-"`
}

// GeneratorHealth tells whether the load generator kept up.
type GeneratorHealth struct {
	// SendLag is how late each send was against its intended time, µs.
	SendLag        *hdrhistogram.Histogram `json:"-"`
	SendLagP99     int64                   `json:"send_lag_p99_us"`
	LateSends      int64                   `json:"late_sends"`
	DroppedSends   int64                   `json:"dropped_sends"`
	PeakInFlight   int64                   `json:"peak_in_flight"`
	CPUUserSeconds float64                 `json:"cpu_user_seconds"`
	CPUSysSeconds  float64                 `json:"cpu_sys_seconds"`
	// SpinSeconds of that CPU went to spinning before sends to keep their times (the
	// open model on cores of its own), SpinWindowUS before each send.
	SpinSeconds  float64 `json:"spin_seconds,omitempty"`
	SpinWindowUS int64   `json:"spin_window_us,omitempty"`
	Behind       bool    `json:"behind"`
}

// ResourceSample is one reading of one process (or container) at time T. CPU times
// are cumulative since the process started; the analysis differentiates them.
type ResourceSample struct {
	Component      string    `json:"component"`
	Role           string    `json:"role,omitempty"` // workload, proxy, control-plane, generator
	Pod            string    `json:"pod,omitempty"`
	Node           string    `json:"node,omitempty"`
	Mesh           string    `json:"mesh,omitempty"`
	T              time.Time `json:"t"`
	CPUUserSeconds float64   `json:"cpu_user_seconds"`
	CPUSysSeconds  float64   `json:"cpu_sys_seconds"`
	// RSSBytes is the resident set size, or on a cluster the container's working set
	// (Run.MemoryMeasure); PSSBytes is 0 where PSS is not measured (on a cluster).
	RSSBytes       int64 `json:"rss_bytes"`
	PSSBytes       int64 `json:"pss_bytes"`
	Threads        int64 `json:"threads"`
	VoluntaryCtx   int64 `json:"voluntary_ctx_switches"`
	InvoluntaryCtx int64 `json:"involuntary_ctx_switches"`
}

// NetSample is one reading of one network interface of one pod (its network
// namespace) at time T. Counters are cumulative since the interface was created
// (/proc/net/dev); the analysis differentiates them. They are int64 like the other
// counters of the model (and SQLite's INTEGER); the sampler's uint64 values never come
// near 2^63.
type NetSample struct {
	Pod       string    `json:"pod"`
	Node      string    `json:"node,omitempty"`
	Mesh      string    `json:"mesh,omitempty"`
	Interface string    `json:"interface"`
	T         time.Time `json:"t"`
	RxBytes   int64     `json:"rx_bytes"`
	TxBytes   int64     `json:"tx_bytes"`
	RxPackets int64     `json:"rx_packets"`
	TxPackets int64     `json:"tx_packets"`
	RxDropped int64     `json:"rx_dropped"`
	TxDropped int64     `json:"tx_dropped"`
}

// ProxyStats is one snapshot of a proxy's own statistics (Envoy /stats?format=json,
// HAProxy show stat, ...).
type ProxyStats struct {
	Component string          `json:"component"`
	Pod       string          `json:"pod,omitempty"`
	Mesh      string          `json:"mesh,omitempty"`
	T         time.Time       `json:"t"`
	Stats     json.RawMessage `json:"stats"`
}
