// Package metrics owns meshmark's live Prometheus endpoint: during a run it serves
// /metrics with the load rates (requested and achieved), per-service latency
// histograms, errors by kind, and per-component CPU, memory and pod network bytes from
// the sampler, labelled by mesh, experiment and repeat. The load engine feeds it one
// summary per interval (ObserveInterval), so its hot path never touches Prometheus.
package metrics

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/meshmark/meshmark/internal/sampler"
)

// DefaultAddr is where Serve listens when given no address: loopback only, since the
// endpoint is for a local Prometheus or a curious user, not the network.
const DefaultAddr = "127.0.0.1:9478"

// Metric names, shared with dashboards/grafana-meshmark.json (a test checks the
// dashboard only uses names the registry exports).
const (
	NameRequestedRPS    = "meshmark_requested_rps"
	NameAchievedRPS     = "meshmark_achieved_rps"
	NameRequests        = "meshmark_requests_total"
	NameErrors          = "meshmark_request_errors_total"
	NameLatency         = "meshmark_request_duration_seconds"
	NameCPUSeconds      = "meshmark_component_cpu_seconds_total"
	NameVCPU            = "meshmark_component_vcpu"
	NameRSS             = "meshmark_component_memory_rss_bytes"
	NamePSS             = "meshmark_component_memory_pss_bytes"
	NameThreads         = "meshmark_component_threads"
	NameNetReceive      = "meshmark_pod_network_receive_bytes_total"
	NameNetTransmit     = "meshmark_pod_network_transmit_bytes_total"
	NameIntervals       = "meshmark_load_intervals_total"
	NameIntervalSeconds = "meshmark_load_interval_seconds"
)

// RunLabels identify the trial a series belongs to.
type RunLabels struct {
	Mesh       string
	Experiment string
	Repeat     int
}

func (l RunLabels) values(extra ...string) []string {
	return append([]string{l.Mesh, l.Experiment, strconv.Itoa(l.Repeat)}, extra...)
}

var runLabelNames = []string{"mesh", "experiment", "repeat"}

func withRun(extra ...string) []string { return append(append([]string{}, runLabelNames...), extra...) }

// LatencyCount is a latency value and how many requests had it, e.g. one bar of an
// HDR histogram's distribution.
type LatencyCount struct {
	Value time.Duration
	Count uint64
}

// Interval is what the load engine saw for one service during one reporting interval.
type Interval struct {
	Service string // called service (or route); "" is reported as "all"
	// Duration is the interval's length; achieved rps is Completed / Duration.
	Duration      time.Duration
	RequestedRate float64 // requests per second the schedule asked for
	Completed     uint64  // responses received, successful or not
	// Errors by kind (e.g. "timeout", "connect", "reset", "http_5xx").
	Errors  map[string]uint64
	Latency []LatencyCount
}

// LatencyBuckets are the histogram's upper bounds in seconds: fine around the
// sub-millisecond to tens-of-milliseconds range where mesh overheads live.
var LatencyBuckets = []float64{
	0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075,
	0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
}

// Recorder holds meshmark's live metrics in its own registry.
type Recorder struct {
	reg          *prometheus.Registry
	requestedRPS *prometheus.GaugeVec
	achievedRPS  *prometheus.GaugeVec
	requests     *prometheus.CounterVec
	errors       *prometheus.CounterVec
	intervals    *prometheus.CounterVec
	intervalSecs *prometheus.GaugeVec

	mu        sync.Mutex
	latency   map[latencyKey]*latencyHist
	resources map[RunLabels]*resourceState
}

type latencyKey struct {
	run     RunLabels
	service string
}

type latencyHist struct {
	buckets []uint64 // non-cumulative per LatencyBuckets bound, plus +Inf last
	count   uint64
	sum     float64
}

// resourceState is a trial's latest round: each process's latest figures, and the
// cores it used between its last two readings.
type resourceState struct {
	procs map[procKey]*procReading
	nets  []sampler.NetSample
}

// procKey is one incarnation of one process (a container, on a cluster, whose PID is 0).
type procKey struct {
	pod, component string
	pid            int
	start          uint64
}

type procReading struct {
	sample  sampler.ProcSample
	at      time.Time
	vcpu    float64
	hasVCPU bool
}

// New returns a Recorder with its own registry (plus Go and process collectors for
// meshmark itself).
func New() *Recorder {
	r := &Recorder{
		reg: prometheus.NewRegistry(),
		requestedRPS: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: NameRequestedRPS,
			Help: "Request rate the load schedule asked for in the last interval."}, withRun("service")),
		achievedRPS: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: NameAchievedRPS,
			Help: "Responses per second received in the last interval."}, withRun("service")),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: NameRequests,
			Help: "Responses received, successful or not."}, withRun("service")),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: NameErrors,
			Help: "Failed requests by kind."}, withRun("service", "kind")),
		intervals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: NameIntervals,
			Help: "Load-engine intervals reported."}, withRun("service")),
		intervalSecs: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: NameIntervalSeconds,
			Help: "Length of the last load-engine interval."}, withRun("service")),
		latency:   map[latencyKey]*latencyHist{},
		resources: map[RunLabels]*resourceState{},
	}
	r.reg.MustRegister(r.requestedRPS, r.achievedRPS, r.requests, r.errors, r.intervals, r.intervalSecs,
		(*latencyCollector)(r), (*resourceCollector)(r),
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return r
}

// Default is the Recorder the package-level functions use.
var Default *Recorder

// Default is built in init, after the package's metric descriptors, which the
// collectors reach only through interface methods that variable initialisation order
// does not see.
func init() { Default = New() }

// Registry returns the registry the Recorder exports.
func (r *Recorder) Registry() *prometheus.Registry { return r.reg }

// ObserveInterval records one interval of load for one service.
func (r *Recorder) ObserveInterval(l RunLabels, iv Interval) {
	svc := iv.Service
	if svc == "" {
		svc = "all"
	}
	v := l.values(svc)
	r.requestedRPS.WithLabelValues(v...).Set(iv.RequestedRate)
	if iv.Duration > 0 {
		r.achievedRPS.WithLabelValues(v...).Set(float64(iv.Completed) / iv.Duration.Seconds())
	}
	r.intervalSecs.WithLabelValues(v...).Set(iv.Duration.Seconds())
	r.intervals.WithLabelValues(v...).Inc()
	r.requests.WithLabelValues(v...).Add(float64(iv.Completed))
	kinds := make([]string, 0, len(iv.Errors))
	for k := range iv.Errors {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		r.errors.WithLabelValues(l.values(svc, k)...).Add(float64(iv.Errors[k]))
	}
	if len(iv.Latency) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	key := latencyKey{l, svc}
	h := r.latency[key]
	if h == nil {
		h = &latencyHist{buckets: make([]uint64, len(LatencyBuckets)+1)}
		r.latency[key] = h
	}
	for _, lc := range iv.Latency {
		s := lc.Value.Seconds()
		i := sort.SearchFloat64s(LatencyBuckets, s) // first bound >= s: Prometheus buckets are "le"
		h.buckets[i] += lc.Count
		h.count += lc.Count
		h.sum += s * float64(lc.Count)
	}
}

// ObserveRound records a sampler round for a trial: the processes in it are what the
// trial's resource series show. A process's previous reading gives its vCPU gauge; a
// reading no newer than the last (a kubelet that has not refreshed) changes nothing.
// Use it as sampler.Config.OnRound via SamplerHook.
func (r *Recorder) ObserveRound(l RunLabels, round sampler.Round) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.resources[l]
	if st == nil {
		st = &resourceState{}
		r.resources[l] = st
	}
	procs := make(map[procKey]*procReading, len(round.Procs))
	for _, p := range round.Procs {
		at := p.At
		if at.IsZero() {
			at = round.Time
		}
		k := procKey{p.Pod, p.Component, p.PID, p.StartTicks}
		cur := &procReading{sample: p, at: at}
		if prev := st.procs[k]; prev != nil {
			if dt := at.Sub(prev.at).Seconds(); dt > 0 {
				cur.vcpu, cur.hasVCPU = max(0, (p.CPU()-prev.sample.CPU()).Seconds()/dt), true
			} else {
				cur = prev
			}
		}
		procs[k] = cur
	}
	st.procs, st.nets = procs, round.Nets
}

// SamplerHook returns an OnRound func feeding this Recorder for trial l.
func (r *Recorder) SamplerHook(l RunLabels) func(sampler.Round) {
	return func(round sampler.Round) { r.ObserveRound(l, round) }
}

// Forget drops a finished trial's latency and resource series so that a long study
// does not export every past trial forever; counters and gauges keep their last value.
func (r *Recorder) Forget(l RunLabels) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.resources, l)
	for k := range r.latency {
		if k.run == l {
			delete(r.latency, k)
		}
	}
}

type latencyCollector Recorder

var latencyDesc = prometheus.NewDesc(NameLatency, "Request latency measured from the intended send time, per service.",
	withRun("service"), nil)

func (c *latencyCollector) Describe(ch chan<- *prometheus.Desc) { ch <- latencyDesc }

func (c *latencyCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, h := range c.latency {
		cum := make(map[float64]uint64, len(LatencyBuckets))
		var run uint64
		for i, ub := range LatencyBuckets {
			run += h.buckets[i]
			cum[ub] = run
		}
		ch <- prometheus.MustNewConstHistogram(latencyDesc, h.count, h.sum, cum, k.run.values(k.service)...)
	}
}

type resourceCollector Recorder

var (
	componentLabels = withRun("role", "pod", "node", "component", "pid")
	cpuDesc         = prometheus.NewDesc(NameCPUSeconds, "CPU time (user+system, incl. reaped children) of a component process.", componentLabels, nil)
	vcpuDesc        = prometheus.NewDesc(NameVCPU, "Cores a component process used between the last two samples.", componentLabels, nil)
	rssDesc         = prometheus.NewDesc(NameRSS, "Resident set size of a component process.", componentLabels, nil)
	pssDesc         = prometheus.NewDesc(NamePSS, "Proportional set size of a component process (shared pages divided among sharers).", componentLabels, nil)
	threadsDesc     = prometheus.NewDesc(NameThreads, "Threads of a component process.", componentLabels, nil)
	netLabels       = withRun("pod", "node", "interface")
	rxDesc          = prometheus.NewDesc(NameNetReceive, "Bytes received on a pod's interface.", netLabels, nil)
	txDesc          = prometheus.NewDesc(NameNetTransmit, "Bytes transmitted on a pod's interface.", netLabels, nil)
)

func (c *resourceCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{cpuDesc, vcpuDesc, rssDesc, pssDesc, threadsDesc, rxDesc, txDesc} {
		ch <- d
	}
}

func (c *resourceCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for run, st := range c.resources {
		for _, r := range st.procs {
			p := r.sample
			lv := run.values(string(p.Role), p.Pod, p.Node, p.Component, strconv.Itoa(p.PID))
			ch <- prometheus.MustNewConstMetric(cpuDesc, prometheus.CounterValue, p.CPU().Seconds(), lv...)
			if r.hasVCPU {
				ch <- prometheus.MustNewConstMetric(vcpuDesc, prometheus.GaugeValue, r.vcpu, lv...)
			}
			ch <- prometheus.MustNewConstMetric(rssDesc, prometheus.GaugeValue, float64(p.RSSBytes), lv...)
			if p.PSSBytes > 0 {
				ch <- prometheus.MustNewConstMetric(pssDesc, prometheus.GaugeValue, float64(p.PSSBytes), lv...)
			}
			if p.Threads > 0 { // a container's kubelet does not count them
				ch <- prometheus.MustNewConstMetric(threadsDesc, prometheus.GaugeValue, float64(p.Threads), lv...)
			}
		}
		for _, n := range st.nets {
			lv := run.values(n.Pod, n.Node, n.Interface)
			ch <- prometheus.MustNewConstMetric(rxDesc, prometheus.CounterValue, float64(n.RxBytes), lv...)
			ch <- prometheus.MustNewConstMetric(txDesc, prometheus.CounterValue, float64(n.TxBytes), lv...)
		}
	}
}

// Handler serves the Recorder's registry in the Prometheus exposition format.
func (r *Recorder) Handler() http.Handler {
	return promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{Registry: r.reg})
}

// Server is a running /metrics endpoint.
type Server struct {
	ln  net.Listener
	srv *http.Server
	err chan error
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops the server.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if serr := <-s.err; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		return serr
	}
	return err
}

// normalizeAddr binds to loopback unless the caller names a host: "" is DefaultAddr
// and ":9090" means 127.0.0.1:9090 (use "0.0.0.0:9090" to listen on every interface).
func normalizeAddr(addr string) string {
	if addr == "" {
		return DefaultAddr
	}
	if host, port, err := net.SplitHostPort(addr); err == nil && host == "" {
		return net.JoinHostPort("127.0.0.1", port)
	}
	return addr
}

// Listen starts serving /metrics for the Recorder at addr and returns at once.
func (r *Recorder) Listen(addr string) (*Server, error) {
	ln, err := net.Listen("tcp", normalizeAddr(addr))
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", r.Handler())
	s := &Server{ln: ln, srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}, err: make(chan error, 1)}
	go func() { s.err <- s.srv.Serve(ln) }()
	return s, nil
}

// Serve serves the Recorder's /metrics at addr until ctx is done.
func (r *Recorder) Serve(ctx context.Context, addr string) error {
	s, err := r.Listen(addr)
	if err != nil {
		return err
	}
	<-ctx.Done()
	return s.Close()
}

// Serve serves Default's /metrics at addr (DefaultAddr when "") until ctx is done.
func Serve(ctx context.Context, addr string) error { return Default.Serve(ctx, addr) }
