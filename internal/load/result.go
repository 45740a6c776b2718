package load

import (
	"encoding/json"
	"fmt"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
)

// Histogram range: microseconds from 1 µs to 60 s at 3 significant digits. Longer values
// are recorded as 60 s (and counted in Result.Clamped).
const (
	HistLowest  = 1
	HistHighest = 60_000_000
	HistDigits  = 3
)

// NewHistogram returns an empty histogram with meshmark's range, in microseconds.
func NewHistogram() *hdrhistogram.Histogram {
	return hdrhistogram.New(HistLowest, HistHighest, HistDigits)
}

// EncodeHistogram returns h in the HdrHistogram V2 compressed encoding, base64: lossless
// and readable by every HdrHistogram implementation.
func EncodeHistogram(h *hdrhistogram.Histogram) (string, error) {
	b, err := h.Encode(hdrhistogram.V2CompressedEncodingCookieBase)
	return string(b), err
}

// DecodeHistogram is the inverse of EncodeHistogram.
func DecodeHistogram(s string) (*hdrhistogram.Histogram, error) {
	h, err := hdrhistogram.Decode([]byte(s))
	if err != nil {
		return nil, fmt.Errorf("decode histogram: %w", err)
	}
	return h, nil
}

// Histogram wraps an HDR histogram of microseconds so that it travels through JSON as
// its V2 compressed encoding.
type Histogram struct{ *hdrhistogram.Histogram }

// MarshalJSON implements json.Marshaler.
func (h Histogram) MarshalJSON() ([]byte, error) {
	if h.Histogram == nil {
		return []byte("null"), nil
	}
	s, err := EncodeHistogram(h.Histogram)
	if err != nil {
		return nil, err
	}
	return json.Marshal(s)
}

// UnmarshalJSON implements json.Unmarshaler.
func (h *Histogram) UnmarshalJSON(b []byte) error {
	var s *string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	if s == nil {
		h.Histogram = nil
		return nil
	}
	d, err := DecodeHistogram(*s)
	h.Histogram = d
	return err
}

// Quantile returns the value at quantile q (0-100) as a duration; 0 for an empty or
// missing histogram.
func (h Histogram) Quantile(q float64) time.Duration {
	if h.Histogram == nil || h.TotalCount() == 0 {
		return 0
	}
	return time.Duration(h.ValueAtQuantile(q)) * time.Microsecond
}

// Errors counts failed requests by kind.
type Errors struct {
	Refused int64 `json:"refused"`
	Reset   int64 `json:"reset"`
	Timeout int64 `json:"timeout"`
	Non2xx  int64 `json:"non2xx"`
	Other   int64 `json:"other"`
	// Lookup counts requests whose target's name did not resolve.
	Lookup int64 `json:"lookup,omitempty"`
}

// Total is the number of failed requests.
func (e Errors) Total() int64 { return e.Refused + e.Reset + e.Timeout + e.Non2xx + e.Other + e.Lookup }

func (e *Errors) add(k ErrorKind, n int64) {
	switch k {
	case KindRefused:
		e.Refused += n
	case KindReset:
		e.Reset += n
	case KindTimeout:
		e.Timeout += n
	case KindNon2xx:
		e.Non2xx += n
	case KindOther:
		e.Other += n
	case KindLookup:
		e.Lookup += n
	}
}

// Interval is one slice of a run (by completion time). Its histograms are kept encoded
// so that an hour of intervals stays small; decode them with DecodeHistogram.
type Interval struct {
	Start         time.Duration `json:"start"` // offset from the run's start
	Length        time.Duration `json:"length"`
	Completed     int64         `json:"completed"` // responses and failures
	Errors        Errors        `json:"errors"`
	RequestedRate float64       `json:"requested_rate,omitempty"` // open models
	AchievedRate  float64       `json:"achieved_rate"`            // completed per second
	LatencyP50    time.Duration `json:"latency_p50"`
	LatencyP90    time.Duration `json:"latency_p90"`
	LatencyP99    time.Duration `json:"latency_p99"`
	LatencyMax    time.Duration `json:"latency_max"`
	ServiceP99    time.Duration `json:"service_p99"`
	SendLagMax    time.Duration `json:"send_lag_max"`
	// InFlight is how many requests had been sent and not yet answered when the
	// interval closed, Waiting how many were due and not yet sent because every
	// connection allowed (MaxInFlight) was busy. Their sum is the backlog: a target
	// that cannot keep up makes it grow, in flight or, when the connections are
	// capped, in the queue for one.
	InFlight int64  `json:"in_flight"`
	Waiting  int64  `json:"waiting,omitempty"`
	Latency  string `json:"latency_hist"` // V2 compressed, base64; answered and failed requests
	Service  string `json:"service_hist"`
}

// Health describes the generator itself, so that a run it could not drive is flagged.
type Health struct {
	PeakInFlight int64         `json:"peak_in_flight"`
	Connections  int64         `json:"connections_opened"`
	Late         int64         `json:"late"`    // sends that waited because MaxInFlight was reached
	Dropped      int64         `json:"dropped"` // intended sends never made (queue full or run over)
	Aborted      int64         `json:"aborted"` // in flight when the run was cut off, not recorded
	SendLag      Histogram     `json:"send_lag_hist"`
	CPUUser      time.Duration `json:"cpu_user"`
	CPUSystem    time.Duration `json:"cpu_system"`
	// SpinWait is the part of that CPU the open model spent spinning before sends
	// instead of sleeping, to send on time; SpinWindow is how long before a send it
	// started spinning (learnt from the machine's wake-up latency unless set).
	SpinWait   time.Duration `json:"spin_wait,omitempty"`
	SpinWindow time.Duration `json:"spin_window,omitempty"`
	// DialWait is how long, inside the measured window, the open model's loop spent in
	// dials (it sends nothing meanwhile); DialLongest the longest of those dials.
	DialWait    time.Duration `json:"dial_wait,omitempty"`
	DialLongest time.Duration `json:"dial_longest,omitempty"`
	// CPUPerRequest is process CPU, less SpinWait, divided by completed requests; in a
	// process that does other work too it is an upper bound.
	CPUPerRequest time.Duration `json:"cpu_per_request"`
	Bottleneck    bool          `json:"bottleneck"` // the generator, not the target, limited the run
	// Why lists the warnings that set Bottleneck.
	Why []string `json:"why,omitempty"`
}

// Saturation is the evidence on whether the target kept up with an open-model run: the
// backlog (requests due and not yet answered, whether in flight at the target or
// waiting for a connection) at the start and at the end of the measured window, and
// the rate it completed against the rate intended. A target that cannot serve the
// intended rate builds a backlog that grows for as long as the run lasts, and then its
// latency is the length of that queue, not its latency at the rate.
type Saturation struct {
	// Saturated: the target fell behind: it was Overloaded, or it stalled accepting
	// connections (ConnectStall).
	Saturated bool `json:"saturated"`
	// Overloaded: it could not serve the rate (see DetectSaturation for the rules).
	Overloaded bool `json:"overloaded,omitempty"`
	// ConnectStall is how long sends inside the window waited while the generator
	// dialed connections the target was slow to accept, ConnectLongest the longest of
	// those dials; set only where the sends lagged (judgeConnectStall).
	ConnectStall   time.Duration `json:"connect_stall,omitempty"`
	ConnectLongest time.Duration `json:"connect_longest,omitempty"`
	// BacklogFrom and BacklogTo are the backlog at the window's start and end;
	// BacklogLow is the smallest at any interval boundary of the window's second half.
	BacklogFrom int64 `json:"backlog_from"`
	BacklogTo   int64 `json:"backlog_to"`
	BacklogLow  int64 `json:"backlog_low"`
	// WaitingLow is the fewest sends waiting for a connection at any interval boundary
	// of the window's second half: at saturationMinGrowth or more, the target did not
	// serve the rate over the connections it was allowed, however steady its backlog.
	WaitingLow int64 `json:"waiting_low,omitempty"`
	// Shed is how many of the Completed requests after warm-up failed as an
	// overloaded target fails them (429, 503, 504, or timed out).
	Shed      int64 `json:"shed,omitempty"`
	Completed int64 `json:"completed"`
	// IntendedRate is the requests per second intended in the window, CompletedRate
	// those completed inside it (answered or failed, whatever their intended time).
	IntendedRate  float64 `json:"intended_rate"`
	CompletedRate float64 `json:"completed_rate"`
	// LatencyFrom and LatencyTo are the median latency of the window's first and last
	// intervals in which any request completed.
	LatencyFrom time.Duration `json:"latency_p50_from"`
	LatencyTo   time.Duration `json:"latency_p50_to"`
}

// String says what the evidence shows, in one line.
func (s *Saturation) String() string {
	what := "the target kept up"
	switch {
	case s.Overloaded:
		what = "target saturated"
	case s.Saturated:
		what = "target stalled"
	}
	return what + ": " + s.Evidence()
}

// Evidence is the figures the verdict rests on, in words.
func (s *Saturation) Evidence() string {
	out := ""
	if s.ConnectStall > 0 {
		out = fmt.Sprintf("sends waited %s in all for new connections the target was slow to accept (the longest dial %s); ",
			fmtDur(s.ConnectStall), fmtDur(s.ConnectLongest))
	}
	out += fmt.Sprintf("requests due and not answered (in flight, or waiting for a connection) went from %d to %d over the window, and it completed %.1f/s of the %.1f/s intended",
		s.BacklogFrom, s.BacklogTo, s.CompletedRate, s.IntendedRate)
	if s.WaitingLow > 0 {
		out += fmt.Sprintf("; at least %d sends waited for a connection throughout the window's second half", s.WaitingLow)
	}
	if s.Shed > 0 {
		out += fmt.Sprintf("; %d of its %d requests (%.1f%%) failed as an overloaded target fails them (429, 503, 504 or timed out)",
			s.Shed, s.Completed, 100*float64(s.Shed)/float64(max(s.Completed, 1)))
	}
	if s.LatencyTo > 0 { // zero: nothing completed in any interval of the window
		out += fmt.Sprintf(" (p50 %s in the first interval, %s in the last)", fmtDur(s.LatencyFrom), fmtDur(s.LatencyTo))
	}
	return out
}

// Result is everything one run measured. Latency is from the intended send time
// (corrected for coordinated omission), Service from the actual send; both count every
// request measured after Warmup that ended, answered (any status) or failed without a
// response (timeout, reset, refused: timed to the failure). Answered and Failed keep
// the two apart, so that neither hides the other.
type Result struct {
	Model   string        `json:"model"` // open/constant, open/poisson, closed, users ...
	Target  string        `json:"target"`
	Start   time.Time     `json:"start"`
	Warmup  time.Duration `json:"warmup,omitempty"`
	Elapsed time.Duration `json:"elapsed"` // the measured window: after warmup until the end of a timed run, or the last completion
	Sent    int64         `json:"sent"`    // after warmup
	// Completed is every request intended after warmup that ended (responses and
	// failures), whenever it ended; Succeeded those answered 2xx.
	Completed int64 `json:"completed"`
	Succeeded int64 `json:"succeeded"`
	// CompletedInWindow is every request that ended inside the measured window,
	// whatever its intended time, SucceededInWindow the 2xx part of it: the rate the
	// target actually served is CompletedInWindow / Elapsed (AchievedRate).
	// CompletedAfterWindow is what was intended in the window but ended after it.
	CompletedInWindow    int64         `json:"completed_in_window"`
	SucceededInWindow    int64         `json:"succeeded_in_window"`
	CompletedAfterWindow int64         `json:"completed_after_window"`
	Errors               Errors        `json:"errors"`
	ErrorSamples         []string      `json:"error_samples,omitempty"` // first few distinct messages
	StatusCodes          map[int]int64 `json:"status_codes"`
	BytesIn              int64         `json:"bytes_in"`
	RequestedRate        float64       `json:"requested_rate,omitempty"`
	AchievedRate         float64       `json:"achieved_rate"` // completed inside the window, per second
	Latency              Histogram     `json:"latency_hist"`
	Service              Histogram     `json:"service_hist"`
	Answered             Histogram     `json:"answered_latency_hist"` // latency of the requests that got a response
	Failed               Histogram     `json:"failed_latency_hist"`   // latency (time to failure) of those that did not
	FirstByte            Histogram     `json:"first_byte_hist"`       // actual send to first response byte
	Clamped              int64         `json:"clamped,omitempty"`
	Intervals            []Interval    `json:"intervals"`
	// Saturation is set for open-model runs whose window spans two intervals or more.
	Saturation *Saturation   `json:"target_saturation,omitempty"`
	Health     Health        `json:"generator"`
	RawLog     *RawLogStatus `json:"raw_log,omitempty"` // with Config.RawLog
	Warnings   []string      `json:"warnings,omitempty"`
	Incomplete bool          `json:"incomplete,omitempty"` // cancelled before the end
}

// TargetSaturated reports whether the run found the target unable to keep up.
func (r *Result) TargetSaturated() bool { return r.Saturation != nil && r.Saturation.Saturated }

// Failures is how many requests ended without a response (transport errors).
func (r *Result) Failures() int64 { return r.Errors.Total() - r.Errors.Non2xx }
